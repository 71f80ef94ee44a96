"""One head's attention scores split into the pairs of residual-stream parts that make them
(the QK attribution of Anthropic's "Tracing attention computation through feature
interactions", 2025, on the residual decomposition of Elhage et al. 2021, "A Mathematical
Framework for Transformer Circuits").

The residual stream entering a head's layer is a sum of parts: ``input`` (token and position
embeddings), each earlier head's output ``L{l}H{h}``, each earlier MLP's output ``M{l}``, and
``bias`` (every constant: attention output biases, norm biases, the query and key biases).
The score ``q . k * scale`` is then a sum over pairs (query part, key part), query and key each
a sum over parts:

- a pre-norm decoder (``mhsa.engine.stream.residual``): the layer's norm frozen at the real stream
  (TransformerLens's ``apply_ln_to_stack``: each position's scale fixed, so the norm is
  linear), q/k norms (Qwen3, Gemma 3, OLMo 2) frozen likewise and rotary positions applied to
  each part (a rotation is linear);
- a pre-norm encoder (ModernBERT): the same, without the causal mask (every key split, as
  the post-norm path does; ``attrs["causal"]`` is False); its first layer reads the stream
  itself (its attention norm an ``nn.Identity``), the embeddings' LayerNorm is in ``input``
  (its bias, where there is one, in ``bias``). A local layer's sliding window is a mask, not
  a term: the keys outside it are kept, with their score ``q . k`` scaled as everywhere, and
  marked (``attrs["masked_keys"]``, ``attrs["window"]``), as a decoder's are;
- a post-norm encoder (BERT family: BERT, RoBERTa, ELECTRA, MiniLM, DistilBERT, ALBERT;
  ``mhsa.engine.stream.postnorm``): every LayerNorm on the way, from the embeddings' to the
  last layer's, has its scale ``1 / sigma`` frozen per position at the real forward, so it is
  affine; each part is pushed through every norm after the point where it was written (centred,
  times the frozen ``1 / sigma`` and the norm's weight), each norm's bias joining ``bias``; the
  heads read the stream as it is (no norm before the attention). An MLP's output is nonlinear
  in its input: it is one part, as the real forward computed it;
- an encoder-decoder's self-attention (``mhsa.engine.stream.seq2seq``): an encoder head
  ``E{l}H{h}`` over the encoder's stream (every key), a decoder head ``D{l}H{h}`` over the
  decoder's (causal), teacher-forced on a target text as ``mhsa.attend`` runs it; the
  decoder's parts include each cross-attention head's output ``C{l}H{h}`` (it writes into the
  decoder's stream). Pre-norm (T5, mBART) as above, post-norm (BART, Marian) through the chain
  of frozen LayerNorms. T5 adds a relative position bias to every score, a constant given the
  query's and the key's positions and no product of two parts: it is the term ``(position,
  position)`` of its own (T5 has no biases elsewhere, so ``bias`` would hide nothing else, but
  the position term says how T5 looks by position). T5 does not scale its scores (scale 1).

A cross-attention head is refused: its query is read from the decoder's stream and its key
from the encoder's output, two streams, so no pair of one stream's parts makes its score.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.attention.rmsnorm import RMSNorm
from mhsa.engine.families.layout import attention_norm_of, embedding_norm_of
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.runs.generation import Generation
from mhsa.engine.runs.swap import OurBlock, our_blocks
from mhsa.engine.stream.frozen_norm import FrozenNorm, frozen_norm
from mhsa.engine.stream.postnorm import postnorm_pass
from mhsa.engine.stream.residual import ResidualPass, residual_pass
from mhsa.engine.stream.seq2seq import seq2seq_pass
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.heads import check_heads, layer_name

__all__ = [
    "BIAS",
    "INPUT",
    "POSITION",
    "LayerSources",
    "layer_sources",
    "qk_attribution",
    "residual_sources",
]

#: the names of the residual parts besides heads (``L{l}H{h}``) and MLPs (``M{l}``), and of
#: T5's relative position bias (a term of its own, paired with itself)
INPUT, BIAS, POSITION = "input", "bias", "position"


def residual_sources(run: ResidualPass, layer: int) -> tuple[list[str], torch.Tensor]:
    """The parts of the residual stream entering ``layer`` ``[S, T, D]`` (float64) and their
    names: ``input``, then per earlier layer its heads ``L{l}H{h}`` and its MLP ``M{l}``, then
    ``bias`` (the attention output biases, through a norm after the attention where there is
    one, with that norm's bias).

    Raises:
        UnsupportedModelError: the parts do not add up to the stream (a layout the
            decomposition does not cover).
    """
    names, parts = [INPUT], [run.resid_pre[0].double()]
    bias = torch.zeros_like(parts[0])
    for j in range(layer):
        out = torch.einsum("htd,hdm->htm", run.context[j].double(), run.w_o[j].double())
        norm = run.post_attention_norm(j)  # frozen per position: inverse_scale [T, 1]
        b_o = run.b_o[j]
        constant = torch.zeros_like(bias) if b_o is None else b_o.double().expand_as(bias)
        if norm is not None:
            out, constant = norm(out), norm(constant) + (0 if norm.bias is None else norm.bias)
        names += [f"L{j}H{h}" for h in range(run.heads)] + [f"M{j}"]
        parts += [*out, run.mlp_out[j].double()]
        bias = bias + constant
    sources = torch.stack([*parts, bias])  # (S, T, D)
    whole = run.resid_pre[layer].double()
    gap = float((sources.sum(0) - whole).abs().max())
    if gap > 1e-4 * (1.0 + float(whole.abs().max())):
        raise UnsupportedModelError(
            f"the residual stream entering layer {layer} is not the sum of its parts (off by "
            f"{gap:.3g}): this model's layout is not covered."
        )
    return [*names, BIAS], sources


def _frozen_qk_norm(
    norm: RMSNorm, whole: torch.Tensor, index: int, d_head: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A q/k norm frozen at the real queries (or keys) ``whole [T, n Dh]`` of every head:
    ``(1 / rms [T, 1], weight [Dh])`` for head ``index`` (per head, or over the whole
    projection as OLMo 2)."""
    part = slice(index * d_head, (index + 1) * d_head)
    over = whole[:, part] if norm.per_head else whole
    inverse = torch.rsqrt(over.pow(2).mean(-1, keepdim=True) + norm.eps)
    weight = norm.weight.to(whole)
    weight = weight + 1.0 if norm.unit_offset else weight
    return inverse, weight if norm.per_head else weight[part]


def _side(
    ours: MultiHeadSelfAttention,
    sources: torch.Tensor,
    positions: torch.Tensor,
    frozen: FrozenNorm | None,
    normed: torch.Tensor,
    part: int,
    index: int,
) -> torch.Tensor:
    """Queries (``part`` 0) or keys (1) of head / key-value head ``index`` per source
    ``[S, P, Dh]`` at ``positions`` ``[P]`` from the residual parts there ``[S, P, D]``: the
    norm ``frozen`` at each position (its weight and centring folded into the projection,
    so that no ``[S, P, D]`` array is normed), the last source (``bias``) taking the norm's
    bias and the projection's; a q/k norm frozen at the real queries or keys (from the whole
    normed stream ``normed [P, D]``); rotary positions applied per source."""
    weights, biases = ours.projections()
    w = weights[part].to(sources)  # (n Dh, D)
    b = None if biases[part] is None else biases[part].to(sources)
    dh = ours.d_head
    rows = slice(index * dh, (index + 1) * dh)
    reads = w[rows].T  # (D, Dh)
    constant = b[rows] if b is not None else sources.new_zeros(dh)
    if frozen is not None:
        if frozen.bias is not None:
            constant = constant + frozen.bias.to(sources) @ reads
        reads = frozen.weight.to(sources)[:, None] * reads
        if frozen.kind == "LayerNorm":  # (x - mean x) M = x (M - mean over rows of M)
            reads = reads - reads.mean(0, keepdim=True)
    out = sources @ reads  # (S, P, Dh)
    if frozen is not None:
        out = out * torch.as_tensor(frozen.inverse_scale).to(sources)[positions]
    out[-1] += constant
    norm = ours.q_norm if part == 0 else ours.k_norm
    if norm is not None:
        whole = normed @ w.T + (0 if b is None else b)  # (P, n Dh)
        inverse, weight = _frozen_qk_norm(norm, whole, index, dh)
        out = out * inverse * weight
    if ours.rotary is not None:
        cos, sin = ours.rotary.cos_sin(positions.to(sources.device), torch.float64)
        out = ours.rotary.rotate(out[:, None], cos, sin)[:, 0]
    return out


def _checked(lm: LoadedModel, head: str | tuple[int, int]) -> tuple[int, int]:
    """``(block, head)`` of a model the split runs on (``head``: ``L1H3``; an encoder-decoder's
    ``E1H3`` or ``D1H3``; a pair gives the block's number, as ``check_heads``).

    Raises:
        InputError: no such head.
        UnsupportedModelError: a cross-attention head.
    """
    with lm.lock:
        blocks = our_blocks(lm)
    names = [layer_name(b.kind, b.index) for b in blocks]
    ((layer, index),) = check_heads([head], names, blocks[0].ours.num_heads)
    if blocks[layer].kind == "cross":
        raise UnsupportedModelError(
            f"{names[layer]}H{index} is a cross-attention head: its queries come from the "
            "decoder's residual stream and its keys from the encoder's output, two different "
            "streams, so its score is not one stream's parts paired. Pick an encoder head "
            "(E<layer>H<head>) or a decoder self-attention head (D<layer>H<head>)."
        )
    return layer, index


def _block_number(lm: LoadedModel, layer: int | str) -> int:
    """The block number of ``layer``: a number as it is, or a name (``L3``, ``E1``, ``D0``)."""
    if not isinstance(layer, str):
        return layer
    with lm.lock:
        names = [layer_name(b.kind, b.index) for b in our_blocks(lm)]
    if layer.strip() not in names:
        raise InputError(f"There is no layer {layer!r}: the model's are {', '.join(names)}.")
    return names.index(layer.strip())


@dataclass(frozen=True, eq=False)
class LayerSources:
    """The residual stream entering one layer in parts, as that layer's heads read it: what
    ``qk_attribution`` splits a score over. ``layer_sources`` computes it once per text and
    layer; every head and query of the layer reuses it. S parts, T tokens, D = d_model.

    Attributes:
        model: the model's name (``LoadedModel.name``).
        tokens: the tokens as the model sees them.
        layer: the layer entered.
        names: the parts' names: ``input``, per earlier layer its heads ``L{l}H{h}`` and its
            MLP ``M{l}``, then ``bias``.
        sources: the parts ``[S, T, D]`` (float64).
        frozen: the norm before the layer's attention, frozen per position at the real stream
            (pre-norm), or None (a post-norm encoder: its heads read the stream as it is).
        normed: the stream as the heads read it ``[T, D]`` (float64).
        causal: whether a query reads only the keys up to it (a decoder).
        label: the layer's name in head labels (``L3``; an encoder-decoder's ``E1``, ``D0``).
        position: a score bias per head ``[H, T, T]`` that is no product of parts (T5's
            relative position bias: the term ``position`` of ``qk_attribution``), or None.
    """

    model: str
    tokens: tuple[str, ...]
    layer: int
    names: tuple[str, ...]
    sources: torch.Tensor
    frozen: FrozenNorm | None
    normed: torch.Tensor
    causal: bool
    label: str = ""
    position: torch.Tensor | None = None

    @property
    def layer_label(self) -> str:
        return self.label or f"L{self.layer}"


def layer_sources(
    text: str | Generation,
    layer: int | str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    max_tokens: int | None = None,
    text_pair: str | None = None,
) -> LayerSources:
    """The residual stream entering ``layer`` on ``text``, in parts (``LayerSources``): for a
    pre-norm decoder or encoder (ModernBERT) through ``mhsa.engine.stream.residual`` with the
    layer's
    norm frozen; for a post-norm encoder through its chain of norms, each frozen
    (``mhsa.engine.stream.postnorm``); for an encoder-decoder's self-attention (``layer``
    ``"E1"``, ``"D0"`` or the block's number) through ``mhsa.engine.stream.seq2seq``, the
    decoder teacher-forced on ``text_pair`` (None: the text itself, as ``mhsa.attend``).

    Raises:
        InputError: no such layer, an empty or too long text, a ``Generation`` for an encoder.
        UnsupportedModelError: a cross-attention layer, or a layout no decomposition covers.
    """
    lm = resolve_model(model)
    layer, _ = _checked(lm, (_block_number(lm, layer), 0))
    with lm.lock:
        block = our_blocks(lm)[layer]
    if lm.is_encoder_decoder:
        return _seq2seq_sources(lm, block, text, text_pair, max_tokens)
    if not block.causal and isinstance(text, Generation):
        raise InputError("A Generation is a decoder's output: give an encoder a text.")
    if not block.causal and not _pre_norm(lm):
        run = postnorm_pass(text, model=lm, max_tokens=max_tokens)
        whole = run.resid_pre[layer].double()
        names, sources = run.names(layer), run.sources(layer)
        return LayerSources(lm.name, run.tokens, layer, tuple(names), sources, None, whole, False)
    # a pre-norm decoder, or a pre-norm encoder (ModernBERT) without its head
    pre = residual_pass(
        text, model=lm, max_tokens=max_tokens, all_logits=False, with_head=block.causal
    )
    names, sources = residual_sources(pre, layer)  # (S, T, D)
    if not block.causal:
        _embedding_bias_apart(lm, sources)
    outer, attribute = block.layer_place
    norm = attention_norm_of(getattr(outer, attribute))
    whole = pre.resid_pre[layer].double()
    frozen = None if norm is None else frozen_norm(norm, pre.resid_pre[layer])
    normed = whole
    if frozen is not None:
        normed = frozen(whole) + (0 if frozen.bias is None else frozen.bias.double())
    _check_values(block.ours, normed, pre.values[layer], lm.display_name, layer, repeated=True)
    return LayerSources(
        lm.name, pre.tokens, layer, tuple(names), sources, frozen, normed, block.causal
    )


def _seq2seq_sources(
    lm: LoadedModel,
    block: OurBlock,
    text: str | Generation,
    text_pair: str | None,
    max_tokens: int | None,
) -> LayerSources:
    """``layer_sources`` of an encoder-decoder's self-attention block."""
    if isinstance(text, Generation):
        raise InputError("Give an encoder-decoder its text (and target text), not a Generation.")
    run = seq2seq_pass(text, text_pair, lm, max_tokens)
    stream = run.streams[block.layer]
    _check_values(block.ours, stream.normed, stream.values, lm.display_name, block.layer)
    causal = block.kind == "decoder"
    return LayerSources(
        lm.name,
        run.decoder_tokens if causal else run.encoder_tokens,
        block.layer,
        stream.names,
        stream.sources,
        stream.frozen,
        stream.normed,
        causal,
        label=layer_name(block.kind, block.index),
        position=stream.position,
    )


def _pre_norm(lm: LoadedModel) -> bool:
    """Whether an encoder's layers norm the stream before their attention (ModernBERT: its
    first layer's norm an ``nn.Identity``, the others' a LayerNorm)."""
    with lm.lock:
        blocks = our_blocks(lm)
    return any(attention_norm_of(getattr(*b.layer_place)) is not None for b in blocks)


def _embedding_bias_apart(lm: LoadedModel, sources: torch.Tensor) -> None:
    """The bias of an encoder's embedding LayerNorm (ModernBERT's ``embeddings.norm``, where
    its ``norm_bias`` is on) moved from ``input`` (the first part) to ``bias`` (the last), in
    place, as the post-norm split does: a constant, not the tokens."""
    norm = embedding_norm_of(lm)
    bias = getattr(norm, "bias", None)
    if isinstance(norm, torch.nn.LayerNorm) and bias is not None:
        sources[0] -= bias.detach().to(sources)
        sources[-1] += bias.detach().to(sources)


def qk_attribution(
    text: str | Generation | LayerSources,
    head: str | tuple[int, int],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    query: int | None = None,
    max_tokens: int | None = None,
    text_pair: str | None = None,
) -> pd.DataFrame:
    """``head``'s pre-softmax scores (scaled, before the mask and any soft-cap) at the query
    position ``query`` over every key it may attend to, each split into pairs (query-side
    part, key-side part) of the residual stream entering the head's layer (the module's
    docstring): ``score(q, k) = sum over (a, b) of q_a . k_b * scale``.

    Args:
        text: the text (or a ``Generation``'s ids), or the ``layer_sources`` of it at the
            head's layer (its forward pass reused: every head and query of a layer from one).
        head: ``"L1H3"`` or ``(layer, head)``; an encoder-decoder's ``"E1H3"`` (encoder) or
            ``"D1H3"`` (decoder self-attention), or ``(block, head)`` numbered as
            ``check_heads`` does.
        model: a pre-norm decoder or encoder (``residual_pass``), a post-norm encoder
            (``postnorm_pass``) or an encoder-decoder (``seq2seq_pass``); the model
            ``text``'s sources came from.
        query: the query position (default: the last), in the decoder's tokens for a ``D``
            head.
        max_tokens: cut the text to this many tokens.
        text_pair: an encoder-decoder's target text, which its decoder reads teacher-forced
            (None: the text itself, as ``mhsa.attend``).

    Returns:
        One row per (query part, key part, key position): ``query_source``, ``key_source``
        (categorical), ``key``, ``score``; the keys are 0 .. query for a decoder, every
        position for an encoder; for each key the scores sum to the head's score (T5's:
        with its relative position bias, the pair ``(position, position)``).
        ``attrs``: ``tokens`` (a ``D`` head's: the decoder's), ``query``, ``head``,
        ``sources`` (the parts' names, in order), ``causal``, ``window`` (a sliding window,
        or None) and ``masked_keys`` (the keys listed that the window hides from the query).

    Raises:
        InputError: no such head, a query outside the text, an empty or too long text,
            sources of another layer or model.
        UnsupportedModelError: a cross-attention head, or a layout no residual
            decomposition covers.
    """
    lm = resolve_model(model)
    layer, index = _checked(lm, head)
    if isinstance(text, LayerSources):
        parts = text
        if parts.layer != layer or parts.model != lm.name:
            raise InputError(
                f"These sources enter layer {parts.layer} of {parts.model}: head {head!r} "
                f"of {lm.name} reads layer {layer}'s."
            )
    else:
        parts = layer_sources(text, layer, model=lm, max_tokens=max_tokens, text_pair=text_pair)
    length = len(parts.tokens)
    if query is None:
        query = length - 1
    if isinstance(query, bool) or not isinstance(query, int | np.integer):
        raise InputError(f"query must be a token position, got {query!r}.")
    if not 0 <= query < length:
        raise InputError(
            f"There is no query position {query}: the text has {length} tokens (0 to {length - 1})."
        )
    query = int(query)
    with lm.lock:
        ours = our_blocks(lm)[layer].ours
    count = query + 1 if parts.causal else length
    keys = slice(0, count)  # a view, not a copy of [S, K, D]
    at_query = slice(query, query + 1)
    frozen, normed, sources = parts.frozen, parts.normed, parts.sources
    q = _side(
        ours,
        sources[:, at_query],
        torch.arange(query, query + 1),
        frozen,
        normed[at_query],
        0,
        index,
    )
    k_index = index // ours.groups
    k = _side(ours, sources[:, keys], torch.arange(count), frozen, normed[keys], 1, k_index)
    terms = torch.einsum("ad,bkd->abk", q[:, 0], k) * ours.scale  # (S, S, K)
    names = list(parts.names)
    if parts.position is not None:  # T5: one more term, (position, position)
        terms = torch.nn.functional.pad(terms, (0, 0, 0, 1, 0, 1))
        terms[-1, -1] = parts.position[index, query, :count].to(terms)
        names.append(POSITION)
    s = len(names)
    source = np.arange(s)
    frame = pd.DataFrame(
        {
            "query_source": pd.Categorical.from_codes(np.repeat(source, s * count), names),
            "key_source": pd.Categorical.from_codes(np.tile(np.repeat(source, count), s), names),
            "key": np.tile(np.arange(count), s * s),
            "score": terms.reshape(-1).cpu().numpy(),
        }
    )
    window = ours.sliding_window
    frame.attrs.update(
        tokens=parts.tokens,
        query=query,
        head=f"{parts.layer_label}H{index}",
        sources=names,
        causal=parts.causal,
        window=window,
        masked_keys=[] if window is None else [k for k in range(count) if abs(query - k) >= window],
    )
    return frame


def _check_values(
    ours: MultiHeadSelfAttention,
    normed: torch.Tensor,
    values: torch.Tensor,
    model: str,
    layer: int,
    repeated: bool = False,
) -> None:
    """The normed stream ``normed [T, D]`` rebuilds every head's values as the pass recorded
    them (``[H, T, Dh]`` ``repeated`` for the query heads that share them, else ``[G, T,
    Dh]``): the norm before the attention was found and frozen right.

    Raises:
        UnsupportedModelError: they do not.
    """
    weights, biases = ours.projections()
    b = biases[2]
    rebuilt = normed @ weights[2].to(normed).T + (0 if b is None else b.to(normed))  # (T, G Dh)
    rebuilt = rebuilt.view(len(normed), -1, ours.d_head).transpose(0, 1)  # (G, T, Dh)
    if repeated:  # values repeated for the query heads that share them (H, T, Dh)
        rebuilt = rebuilt.repeat_interleave(ours.groups, dim=0)
    theirs = values.double()
    if not torch.allclose(rebuilt, theirs, atol=1e-4 * (1.0 + float(theirs.abs().max()))):
        raise UnsupportedModelError(
            f"{model}: the norm before layer {layer}'s attention is not one this split "
            "recognises (LayerNorm, RMSNorm, or none): its scores cannot be split."
        )

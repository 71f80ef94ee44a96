"""One head's attention scores split into the pairs of residual-stream parts that make them
(the QK attribution of Anthropic's "Tracing attention computation through feature
interactions", 2025, on the residual decomposition of Elhage et al. 2021).

The residual stream entering a head's layer is a sum of parts (``mhsa.engine.residual``):
``input`` (token and position embeddings), each earlier head's output ``L{l}H{h}``, each
earlier MLP's output ``M{l}``, and ``bias`` (every constant: attention output biases, norm
biases, the query and key biases). With the layer's norm frozen at the real stream
(TransformerLens's ``apply_ln_to_stack``: each position's scale fixed, so the norm is linear),
query and key are sums over parts, q/k norms (Qwen3, Gemma 3, OLMo 2) frozen likewise and
rotary positions applied to each part (a rotation is linear); the score ``q . k * scale`` is a
sum over pairs (query part, key part).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from mhsa.engine.attention import MultiHeadSelfAttention
from mhsa.engine.frozen_norm import FrozenNorm, frozen_norm
from mhsa.engine.generation import Generation
from mhsa.engine.layer_parts import attention_norm_of
from mhsa.engine.models import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.residual import ResidualPass, residual_pass
from mhsa.engine.rmsnorm import RMSNorm
from mhsa.engine.swap import our_blocks
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.heads import check_heads

__all__ = ["BIAS", "INPUT", "qk_attribution", "residual_sources"]

#: the names of the residual parts besides heads (``L{l}H{h}``) and MLPs (``M{l}``)
INPUT, BIAS = "input", "bias"


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
    """``(layer, head)`` of a decoder the residual decomposition can run (its refusals first)."""
    with lm.lock:
        blocks = our_blocks(lm)
    if lm.is_encoder_decoder or not blocks[0].causal:
        raise UnsupportedModelError(
            f"{lm.display_name}: splitting a score into residual parts needs a pre-norm "
            "decoder (GPT-2, the Llama family, GPT-NeoX, GPT-J, Phi, Falcon, OPT, Qwen, Gemma, "
            "OLMo 2, a toy model); a post-norm encoder (BERT family) renormalises its stream "
            "after every layer and an encoder-decoder reads two streams, which this does not "
            "follow."
        )
    names = [f"L{layer}" for layer in range(len(blocks))]
    ((layer, index),) = check_heads([head], names, blocks[0].ours.num_heads)
    return layer, index


def qk_attribution(
    text: str | Generation,
    head: str | tuple[int, int],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    query: int | None = None,
    max_tokens: int | None = None,
) -> pd.DataFrame:
    """``head``'s pre-softmax scores (scaled, before the mask and any soft-cap) at the query
    position ``query`` over every key it may attend to, each split into pairs (query-side
    part, key-side part) of the residual stream entering the head's layer (the module's
    docstring): ``score(q, k) = sum over (a, b) of q_a . k_b * scale``.

    Args:
        text: the text (or a ``Generation``'s ids).
        head: ``"L1H3"`` or ``(layer, head)``.
        model: a pre-norm decoder the residual decomposition runs (``residual_pass``).
        query: the query position (default: the last).
        max_tokens: cut the text to this many tokens.

    Returns:
        One row per (query part, key part, key position 0 .. query): ``query_source``,
        ``key_source`` (categorical), ``key``, ``score``; for each key the scores sum to the
        head's score.
        ``attrs``: ``tokens``, ``query``, ``head``, ``sources`` (the parts' names, in order).

    Raises:
        InputError: no such head, a query outside the text, an empty or too long text.
        UnsupportedModelError: a post-norm encoder, an encoder-decoder, or a layout the
            residual decomposition does not cover.
    """
    lm = resolve_model(model)
    layer, index = _checked(lm, head)
    run = residual_pass(text, model=lm, max_tokens=max_tokens, all_logits=False)
    length = len(run.tokens)
    if query is None:
        query = length - 1
    if isinstance(query, bool) or not isinstance(query, int | np.integer):
        raise InputError(f"query must be a token position, got {query!r}.")
    if not 0 <= query < length:
        raise InputError(
            f"There is no query position {query}: the text has {length} tokens (0 to {length - 1})."
        )
    names, sources = residual_sources(run, layer)  # (S, T, D)
    with lm.lock:
        block = our_blocks(lm)[layer]
    ours = block.ours
    outer, attribute = block.layer_place
    norm = attention_norm_of(getattr(outer, attribute))
    whole = run.resid_pre[layer].double()
    frozen = None if norm is None else frozen_norm(norm, run.resid_pre[layer])
    normed = whole
    if frozen is not None:
        normed = frozen(whole) + (0 if frozen.bias is None else frozen.bias.double())
    _check_values(ours, normed, run, layer, index, lm.display_name)
    keys = torch.arange(query + 1, device=sources.device)
    at_query = keys[query:]
    q = _side(ours, sources[:, at_query], at_query, frozen, normed[at_query], 0, index)
    k_index = index // ours.groups
    k = _side(ours, sources[:, keys], keys, frozen, normed[keys], 1, k_index)  # (S, K, Dh)
    terms = torch.einsum("ad,bkd->abk", q[:, 0], k) * ours.scale  # (S, S, K)
    s, count = len(names), query + 1
    source = np.arange(s)
    frame = pd.DataFrame(
        {
            "query_source": pd.Categorical.from_codes(np.repeat(source, s * count), names),
            "key_source": pd.Categorical.from_codes(np.tile(np.repeat(source, count), s), names),
            "key": np.tile(np.arange(count), s * s),
            "score": terms.reshape(-1).cpu().numpy(),
        }
    )
    frame.attrs.update(tokens=run.tokens, query=query, head=f"L{layer}H{index}", sources=names)
    return frame


def _check_values(
    ours: MultiHeadSelfAttention,
    normed: torch.Tensor,
    run: ResidualPass,
    layer: int,
    index: int,
    model: str,
) -> None:
    """The normed stream ``normed [T, D]`` rebuilds the head's values as the pass recorded
    them: the norm before the attention was found and frozen right.

    Raises:
        UnsupportedModelError: they do not.
    """
    weights, biases = ours.projections()
    dh, g = ours.d_head, index // ours.groups
    rows = slice(g * dh, (g + 1) * dh)
    b = biases[2]
    values = normed @ weights[2][rows].to(normed).T
    values = values + (0 if b is None else b[rows].to(normed))
    theirs = run.values[layer][index].double()
    if not torch.allclose(values, theirs, atol=1e-4 * (1.0 + float(theirs.abs().max()))):
        raise UnsupportedModelError(
            f"{model}: the norm before layer {layer}'s attention is not one this split "
            "recognises (LayerNorm, RMSNorm, or none): its scores cannot be split."
        )

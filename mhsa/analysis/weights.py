"""A head's OV and QK circuits from the weights alone (Elhage et al. 2021, "A Mathematical
Framework for Transformer Circuits"): whether a head copies the token it reads (the copying
score, the top tokens of its full OV circuit) and whether it looks by position (the positional
QK pattern of learned absolute positions).

The weights are processed as TransformerLens's ``HookedTransformer.from_pretrained`` does by
default (``transformer_lens/weight_processing``): each norm's weight folded into the matrices
that read the normed stream (``fold_ln``: the attention norm's into ``W_Q``, ``W_K``, ``W_V``,
the final norm's into ``W_U``), the unembedding centred over the vocabulary
(``center_unembed``) and, for LayerNorm models, the writing weights (``W_E``, ``W_pos``,
``W_O``) and the reading weights centred over ``d_model`` (``center_writing_weights``,
``fold_ln``'s ``center_weights``). A norm after the attention output (Gemma 2/3, OLMo 2) has its
weight folded into ``W_O`` (its scale, one number per position, changes no ratio or ranking
here). Grouped-query heads use their key/value head. Matrices are in TransformerLens's
convention (row vectors: ``x @ W_V``), read from our module (``mhsa.engine.runs.swap.our_blocks``).
A post-norm encoder's positional pattern reads its positions through the embeddings' LayerNorm
(``LN(W_pos)``, ``qk_positional_scores``) with ``W_Q``, ``W_K`` as the model holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from mhsa.engine.families.layout import (
    attention_norm_of,
    embedding_norm_of,
    final_norm_of,
    positions_of,
    post_attention_norm_of,
)
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.runs.swap import OurBlock, our_blocks
from mhsa.engine.stream.frozen_norm import frozen_norm
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.heads import check_heads, head_label

__all__ = [
    "COMMON_WORDS",
    "PositionalQK",
    "ov_copying_scores",
    "ov_top_tokens",
    "qk_positional_scores",
]

#: the circuit ``ov_copying_scores`` measures: the full OV circuit where the model has an
#: unembedding that reads the final norm, else the OV circuit alone
FULL_OV, OV_ALONE = "W_E W_V W_O W_U", "W_V W_O (no unembedding)"
#: the most common English words (written English frequency lists): ``ov_top_tokens``'s
#: default inputs for a model with a large vocabulary
COMMON_WORDS = (
    "the of and to a in is that for it as was with on he be by at I you this are not have his "
    "from but they or had she which an were one her all we there been has their"
).split()
#: vocabulary rows read at once when multiplying the unembedding by the embedding
_CHUNK = 4096
#: a vocabulary this small (toy models) is every token's: ``ov_top_tokens`` reads them all
_SMALL_VOCABULARY = 256


@dataclass(frozen=True, eq=False)
class _Heads:
    """Every head's processed weights, float64 on the CPU. N = layers x heads.

    Attributes:
        w_q, w_k, w_v: ``[N, D, Dh]`` (keys and values of a head's key/value head).
        w_o: ``[N, Dh, D]``.
        scale: per layer, the scale of the scores (1 / sqrt(d_head) by default).
        layers, heads: the model's sizes.
        layer_norm: whether the model's norms are LayerNorms (centred).
    """

    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    w_o: torch.Tensor
    scale: tuple[float, ...]
    layers: int
    heads: int
    layer_norm: bool

    def labels(self) -> list[str]:
        return [head_label(li, h) for li in range(self.layers) for h in range(self.heads)]


def _layer(block: OurBlock) -> nn.Module:
    outer, name = block.layer_place
    return getattr(outer, name)


def _norm_weight(norm: nn.Module | None, width: int) -> torch.Tensor | None:
    """A norm's effective weight (Gemma's ``1 + w`` included) in float64, or None."""
    if norm is None:
        return None
    probe = torch.randn(3, width, generator=torch.Generator().manual_seed(0))
    return frozen_norm(norm, probe.to(norm.weight.device)).weight.to("cpu", torch.float64)


def _centred(w: torch.Tensor, dim: int) -> torch.Tensor:
    return w - w.mean(dim, keepdim=True)


def _processed_heads(lm: LoadedModel) -> _Heads:
    """Every head's weights, processed as the module's docstring says."""
    if lm.is_encoder_decoder:
        raise UnsupportedModelError(
            f"{lm.display_name} is an encoder-decoder model: its heads read two residual "
            "streams. Choose an encoder or a decoder model."
        )
    with lm.lock:
        blocks = our_blocks(lm)
    layer_norm = any(isinstance(m, nn.LayerNorm) for m in lm.model.modules())
    parts: dict[str, list[torch.Tensor]] = {"q": [], "k": [], "v": [], "o": []}
    for block in blocks:
        ours = block.ours
        w_q, w_k, w_v, w_o = (w.to("cpu", torch.float64) for w in ours.projections()[0])
        h, g, dh = ours.num_heads, ours.num_kv_heads, ours.d_head
        fold = _norm_weight(attention_norm_of(_layer(block)), ours.d_model)
        reading = {
            "q": w_q.view(h, dh, -1).transpose(1, 2),  # (H, D, Dh)
            "k": w_k.view(g, dh, -1).transpose(1, 2).repeat_interleave(ours.groups, 0),
            "v": w_v.view(g, dh, -1).transpose(1, 2).repeat_interleave(ours.groups, 0),
        }
        for name, w in reading.items():
            w = w if fold is None else fold[:, None] * w
            parts[name].append(_centred(w, 1) if layer_norm else w)
        o = w_o.view(-1, h, dh).permute(1, 2, 0)  # (H, Dh, D)
        after = _norm_weight(post_attention_norm_of(_layer(block)), ours.d_model)
        o = o if after is None else o * after
        parts["o"].append(_centred(o, 2) if layer_norm else o)
    return _Heads(
        *(torch.cat(parts[n]) for n in "qkvo"),
        scale=tuple(float(b.ours.scale) for b in blocks),
        layers=len(blocks),
        heads=blocks[0].ours.num_heads,
        layer_norm=layer_norm,
    )


def _has_unembedding(lm: LoadedModel) -> bool:
    """A next-token head whose unembedding reads the final norm's output."""
    return lm.lm_head == "causal" and lm.head_model is not None


def _embeddings(lm: LoadedModel) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``W_E [V, D]``, the unembedding's weight ``[V, D]`` (nn.Linear layout, as stored) and
    the final norm's effective weight (None: no norm), the vocabulary cut to what both have."""
    emb = lm.head_model.get_input_embeddings().weight.detach()
    unemb = lm.head_model.get_output_embeddings().weight.detach()
    if emb.shape[1] != unemb.shape[1]:
        raise UnsupportedModelError(
            f"{lm.display_name}: its embedding ({emb.shape[1]} wide) and unembedding "
            f"({unemb.shape[1]}) differ in width (a projection between them): the full OV "
            "circuit does not cover it."
        )
    vocab = min(emb.shape[0], unemb.shape[0])
    return emb[:vocab], unemb[:vocab], _norm_weight(final_norm_of(lm), emb.shape[1])


def _unembed_embed(lm: LoadedModel, layer_norm: bool) -> torch.Tensor:
    """``W_U W_E`` ``[D, D]`` of the processed weights, in float64, without a vocabulary-square
    matrix: ``P diag(w_f) U^T (I - 1 1^T / V) E P`` (``P``: centring over ``d_model`` for
    LayerNorm models, else the identity), summed over chunks of the vocabulary."""
    emb, unemb, w_f = _embeddings(lm)
    vocab, width = emb.shape
    product = torch.zeros(width, width, dtype=torch.float64)
    sum_u = torch.zeros(width, dtype=torch.float64)
    sum_e = torch.zeros(width, dtype=torch.float64)
    for start in range(0, vocab, _CHUNK):
        u = unemb[start : start + _CHUNK].to("cpu", torch.float64)
        e = emb[start : start + _CHUNK].to("cpu", torch.float64)
        product += u.T @ e
        sum_u += u.sum(0)
        sum_e += e.sum(0)
    product -= torch.outer(sum_u, sum_e) / vocab  # the unembedding centred over the vocabulary
    if w_f is not None:
        product = w_f[:, None] * product
    if layer_norm:
        product = _centred(_centred(product, 0), 1)
    return product


def ov_copying_scores(model: str | LoadedModel = DEFAULT_MODEL) -> pd.Series:
    """Each head's copying score (Elhage et al. 2021): ``sum(Re lambda) / sum(|lambda|)`` over
    the eigenvalues ``lambda`` of its full OV circuit ``W_E W_V^h W_O^h W_U`` (``[V, V]``), as
    TransformerLens computes it from ``FactoredMatrix.eigenvalues``: near 1, the head raises
    the logit of the token it attends to (copying); near -1, it lowers it. The eigenvalues
    come from the small factor ``W_O^h (W_U W_E) W_V^h`` (``[Dh, Dh]``: the non-zero
    eigenvalues of ``A B`` are those of ``B A``), never a vocabulary-square matrix. Weights
    processed as the module's docstring says.

    An encoder without a next-token head has no unembedding: its scores are of the OV circuit
    ``W_V^h W_O^h`` alone (``[D, D]``), and ``attrs["circuit"]`` says so. A post-norm encoder
    (BERT) has no norm before its attention: nothing is folded into its ``W_V`` (the previous
    layer's output norm is not; TransformerLens processes no encoder's weights), ``W_O`` is
    centred (the norm after the residual sum removes the mean), and centring ``W_V`` then
    changes no eigenvalue.

    Returns:
        Indexed by head (``L{l}H{h}``), named ``"copying score"``; ``attrs["circuit"]``: the
        circuit measured (``FULL_OV`` or ``OV_ALONE``).

    Raises:
        UnsupportedModelError: an encoder-decoder, or a model our module does not run.
    """
    lm = resolve_model(model)
    heads = _processed_heads(lm)
    full = _has_unembedding(lm)
    if full:
        middle = _unembed_embed(lm, heads.layer_norm)  # (D, D)
        factor = heads.w_o @ middle @ heads.w_v  # (N, Dh, Dh)
    else:
        factor = heads.w_o @ heads.w_v  # (N, Dh, Dh)
    eigenvalues = torch.linalg.eigvals(factor)  # (N, Dh) complex
    scores = eigenvalues.real.sum(-1) / eigenvalues.abs().sum(-1)
    series = pd.Series(
        scores.numpy(), index=pd.Index(heads.labels(), name="head"), name="copying score"
    )
    series.attrs["circuit"] = FULL_OV if full else OV_ALONE
    return series


def _one_head(heads: _Heads, head: str | tuple[int, int]) -> int:
    """The row of ``head`` in ``heads``' weights."""
    names = [f"L{layer}" for layer in range(heads.layers)]
    ((layer, index),) = check_heads([head], names, heads.heads)
    return layer * heads.heads + index


def _token_ids(lm: LoadedModel, tokens: list[str | int] | None, vocab: int) -> list[int]:
    """Ids of ``tokens`` (strings as the tokenizer spells them, or ids); None: the model's
    common tokens (every ordinary token of a toy vocabulary, else those of ``COMMON_WORDS``).

    Raises:
        InputError: a token the vocabulary does not have.
    """
    tokenizer = lm.tokenizer
    special = set(tokenizer.all_special_ids)
    if tokens is None:
        if vocab <= _SMALL_VOCABULARY:
            return [i for i in range(vocab) if i not in special]
        text = " " + " ".join(COMMON_WORDS)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return [i for i in dict.fromkeys(ids) if i not in special and i < vocab]
    found = []
    for token in tokens:
        if isinstance(token, int) and not isinstance(token, bool):
            index = token
        else:
            index = tokenizer.convert_tokens_to_ids(str(token))
            if index is None or (index == tokenizer.unk_token_id and token != tokenizer.unk_token):
                raise InputError(
                    f"{str(token)!r} is not a token of {lm.display_name}'s vocabulary."
                )
        if not 0 <= index < vocab:
            raise InputError(
                f"There is no token {index}: the vocabulary has {vocab} (0 to {vocab - 1})."
            )
        found.append(index)
    if not found:
        raise InputError("Give at least one token.")
    return found


def ov_top_tokens(
    head: str | tuple[int, int],
    model: str | LoadedModel = DEFAULT_MODEL,
    tokens: list[str | int] | None = None,
    k: int = 10,
) -> pd.DataFrame:
    """For each input token, the ``k`` output tokens whose logits ``head``'s full OV circuit
    raises most when the head attends to it: the rows of ``W_E W_V^h W_O^h W_U`` (processed
    as the module's docstring says), computed row by row (``[tokens, V]``, no
    vocabulary-square matrix).

    Args:
        head: ``"L1H3"`` or ``(layer, head)``.
        model: a model with a next-token head.
        tokens: input tokens as the tokenizer spells them (``"Ġthe"``) or ids; None: the common
            ones (a toy model's whole vocabulary; else the tokens of ``COMMON_WORDS``).
        k: output tokens per input token.

    Returns:
        One row per (input, rank): ``input``, ``output`` (token strings), ``score`` (the
        circuit's entry), ``copies`` (the output is the input), largest first per input.

    Raises:
        InputError: no such head, an unknown token, k < 1.
        UnsupportedModelError: a model without an unembedding (an encoder).
    """
    lm = resolve_model(model)
    if not _has_unembedding(lm):
        raise UnsupportedModelError(
            f"{lm.display_name} has no next-token head, so no unembedding W_U: the tokens a "
            "head's OV circuit writes are defined for causal language models (GPT-2, the "
            "Llama family, a toy model). Its copying scores use W_V W_O alone."
        )
    if k < 1:
        raise InputError(f"k must be at least 1, got {k}.")
    heads = _processed_heads(lm)
    row = _one_head(heads, head)
    emb, unemb, w_f = _embeddings(lm)
    ids = _token_ids(lm, tokens, emb.shape[0])
    x = emb[ids].to("cpu", torch.float64)  # (n, D)
    if heads.layer_norm:
        x = _centred(x, 1)
    x = x @ heads.w_v[row] @ heads.w_o[row]  # (n, D)
    if heads.layer_norm:  # W_U centred over d_model: P diag(w_f) U^T
        x = _centred(x, 1)
    if w_f is not None:
        x = x * w_f
    logits = x @ unemb.to("cpu", torch.float64).T  # (n, V)
    logits = _centred(logits, 1)  # the unembedding centred over the vocabulary
    top = logits.topk(min(k, logits.shape[1]), dim=1)
    names = lm.tokenizer.convert_ids_to_tokens
    rows = []
    for i, token in enumerate(ids):
        outputs = top.indices[i].tolist()
        for out, score in zip(names(outputs), top.values[i].tolist(), strict=True):
            rows.append((names(token), out, score, out == names(token)))
    return pd.DataFrame(rows, columns=["input", "output", "score", "copies"])


@dataclass(frozen=True, eq=False)
class PositionalQK:
    """The positional part of every head's QK circuit (``qk_positional_scores``).

    Attributes:
        pattern: ``[L, H, P, P]`` float32, rows the query position, columns the key position:
            ``softmax(P W_Q^h W_K^hT P^T * scale)`` over keys (causally masked for decoders),
            ``P`` the positions as the heads read them (``reads``).
        previous_token: per head (``L{l}H{h}``), the mean of the pattern's sub-diagonal
            (attention from each position to the one before it).
        reads: what ``P`` is: ``"W_pos"`` (a decoder's position embeddings) or
            ``"LN(W_pos)"`` (a post-norm encoder's, through its embedding LayerNorm alone).
    """

    pattern: np.ndarray
    previous_token: pd.Series
    reads: str = "W_pos"


def _position_embeddings(lm: LoadedModel) -> torch.Tensor | None:
    """The learned absolute position embeddings ``[positions, D]`` (GPT-2's ``wpe``, OPT's
    ``embed_positions`` past its offset; an encoder's ``embeddings.position_embeddings``,
    RoBERTa's past its padding index), or None."""
    module = positions_of(lm)
    if not isinstance(module, nn.Embedding):
        return None
    offset = int(getattr(module, "offset", 0))
    if module.padding_idx is not None:
        offset = module.padding_idx + 1  # RoBERTa counts from padding_idx + 1
    return module.weight.detach()[offset:]


def _encoder_positions(lm: LoadedModel, w_pos: torch.Tensor) -> torch.Tensor:
    """A post-norm encoder's positions as its layers read them: each row of ``w_pos``
    through the embeddings' LayerNorm alone (its own mean and standard deviation, eps
    included, times the norm's weight; the norm's bias left out), float64.

    Raises:
        UnsupportedModelError: no embedding LayerNorm, or a projection after it (ALBERT,
            ELECTRA with a narrower embedding).
    """
    norm = embedding_norm_of(lm)
    projected = hasattr(getattr(lm.model, "encoder", None), "embedding_hidden_mapping_in")
    projected = projected or hasattr(lm.model, "embeddings_project")
    if not isinstance(norm, nn.LayerNorm) or projected:
        raise UnsupportedModelError(
            f"{lm.display_name}: the positional pattern of an encoder reads its position "
            "embeddings through the embeddings' LayerNorm straight into the first layer (BERT, "
            "RoBERTa, MiniLM, DistilBERT); this model has no such norm, or projects the "
            "embeddings after it (ALBERT, ELECTRA)."
        )
    pos = w_pos.to("cpu", torch.float64)
    centred = _centred(pos, 1)
    sigma = torch.sqrt(centred.pow(2).mean(1, keepdim=True) + norm.eps)
    return centred / sigma * norm.weight.detach().to("cpu", torch.float64)


def _raw_qk(blocks: list[OurBlock]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head's ``W_Q``, ``W_K`` ``[N, D, Dh]`` as the model holds them (float64; keys of
    a head's key/value head): a post-norm layer reads the stream with no norm before its
    attention, so nothing is folded or centred."""
    w_q, w_k = [], []
    for block in blocks:
        ours = block.ours
        q, k = (w.to("cpu", torch.float64) for w in ours.projections()[0][:2])
        h, g, dh = ours.num_heads, ours.num_kv_heads, ours.d_head
        w_q.append(q.view(h, dh, -1).transpose(1, 2))
        w_k.append(k.view(g, dh, -1).transpose(1, 2).repeat_interleave(ours.groups, 0))
    return torch.cat(w_q), torch.cat(w_k)


def qk_positional_scores(
    model: str | LoadedModel = DEFAULT_MODEL, positions: int = 64
) -> PositionalQK:
    """Each head's positional QK pattern (Elhage et al. 2021): the attention its QK circuit
    gives the learned position embeddings alone, ``softmax(P W_Q^h W_K^hT P^T / sqrt(d_head))``
    (the module's scale), causally masked for decoders, and its previous-token score, the mean
    of the pattern's sub-diagonal; every layer's heads read ``P`` directly (the direct path: in
    layers past the first, what earlier layers wrote adds to it). Query and key biases are
    constants, not positions: left out.

    - Decoders: ``P = W_pos``, weights processed as the module's docstring says (``W_pos``
      centred for LayerNorm models).
    - Post-norm encoders (BERT, RoBERTa, MiniLM, DistilBERT): the positions enter the first
      layer through the embeddings' LayerNorm, so ``P = LN(W_pos)``: each row put through that
      norm alone (centred, divided by its own standard deviation, eps included, times the
      norm's weight; its bias, a constant, left out), the positional part alone as
      TransformerLens reads ``W_pos`` for GPT-2 with ``fold_ln``; ``W_Q``, ``W_K`` as the
      model holds them (no norm before a post-norm attention: nothing to fold); no mask.

    Args:
        positions: the first this many positions (at most the model's).

    Raises:
        InputError: ``positions`` below 2.
        UnsupportedModelError: rotary positions (they rotate queries and keys by position:
            there is no position vector in the residual stream), no learned absolute
            positions, or an encoder that projects its embeddings after their norm.
    """
    lm = resolve_model(model)
    if positions < 2:
        raise InputError(f"positions must be at least 2, got {positions}.")
    with lm.lock:
        blocks = our_blocks(lm)
    if any(b.ours.rotary is not None for b in blocks):
        raise UnsupportedModelError(
            f"{lm.display_name} has rotary positions: they rotate each query and key by its "
            "position inside the attention, so there is no position embedding W_pos in the "
            "residual stream to read a positional pattern from."
        )
    if lm.is_encoder_decoder:
        raise UnsupportedModelError(
            f"{lm.display_name} is an encoder-decoder model: its heads read two residual "
            "streams. Choose an encoder or a decoder model."
        )
    w_pos = _position_embeddings(lm)
    if w_pos is None:
        raise UnsupportedModelError(
            f"{lm.display_name}: the positional pattern is defined for models with learned "
            "absolute position embeddings that the residual stream carries (GPT-2, OPT; "
            "BERT, RoBERTa, MiniLM, DistilBERT through their embedding norm); this model has "
            "none."
        )
    causal = blocks[0].causal
    w_pos = w_pos[:positions]
    if causal:
        heads = _processed_heads(lm)
        pos = w_pos.to("cpu", torch.float64)
        pos = _centred(pos, 1) if heads.layer_norm else pos
        w_q, w_k = heads.w_q, heads.w_k
    else:
        pos = _encoder_positions(lm, w_pos)
        w_q, w_k = _raw_qk(blocks)
    q = torch.einsum("pd,nde->npe", pos, w_q)  # (N, P, Dh)
    k = torch.einsum("pd,nde->npe", pos, w_k)
    n_heads = blocks[0].ours.num_heads
    scale = torch.tensor([float(b.ours.scale) for b in blocks], dtype=torch.float64)
    scores = q @ k.transpose(1, 2) * scale.repeat_interleave(n_heads)[:, None, None]  # (N, P, P)
    n = pos.shape[0]
    if causal:
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    pattern = scores.softmax(-1)
    previous = pattern.diagonal(offset=-1, dim1=1, dim2=2).mean(-1)
    labels = [head_label(li, h) for li in range(len(blocks)) for h in range(n_heads)]
    return PositionalQK(
        pattern=pattern.view(len(blocks), n_heads, n, n).float().numpy(),
        previous_token=pd.Series(
            previous.numpy(), index=pd.Index(labels, name="head"), name="previous token"
        ),
        reads="W_pos" if causal else "LN(W_pos)",
    )

"""The T5 family: ``q``/``k``/``v``/``o`` without biases or score scaling, and a relative
position bias that the first layer's block computes and hands on to the others (T5, Flan-T5 /
T5 v1.1). The bias is not a weight of our module: it comes in as a float mask added to the
scores (``t5_position_bias``).

A ``T5Block`` holds its sublayers in ``layer``: ``T5LayerSelfAttention`` (``layer_norm`` then
``SelfAttention``), in a decoder ``T5LayerCrossAttention``, and last ``T5LayerFF``
(``layer_norm`` then ``DenseReluDense``); each stack ends in a ``final_layer_norm``.

transformers: ``models/t5/modeling_t5.py`` (``T5Attention``, ``T5Block``); TransformerLens:
``pretrained/weight_conversions/t5.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.record import Family, LayerLayout, load_linears, store_linears, whole

__all__ = ["FAMILY", "LAYERS", "is_t5", "load_t5", "store_t5", "t5_position_bias"]


def is_t5(m: nn.Module) -> bool:
    """A T5 attention block (``q``/``k``/``v``/``o`` and relative attention buckets)."""
    return all(hasattr(m, p) for p in ("q", "k", "v", "o", "relative_attention_num_buckets"))


def _linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q, attention.k, attention.v, attention.o)


def load_t5(attention: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a T5 block (``q``/``k``/``v``/``o``, no biases, no score scaling: T5,
    Flan-T5 / T5 v1.1). Its relative position bias is not a weight of our module: it comes in
    as a float mask added to the scores (``t5_position_bias``)."""
    return load_linears(
        _linears(attention), num_heads=attention.n_heads, scale=float(attention.scaling)
    )


def store_t5(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a T5 block (its relative position bias stays the model's)."""
    store_linears(ours, _linears(attention))


def t5_position_bias(
    attention: nn.Module, given: torch.Tensor | None, t: int, s: int
) -> torch.Tensor | None:
    """The relative position bias ``[1, H, T, S]`` a T5 block adds to its scores: the one its
    layer passed down, else the block's own (the first layer's block holds the bucket
    embedding: the model's ``compute_bias``, reused rather than ported, so the buckets are the
    model's by construction), else none (cross-attention)."""
    if given is not None:
        return given
    if not attention.has_relative_attention_bias:
        return None
    return attention.compute_bias(t, s, device=attention.relative_attention_bias.weight.device)


def _returns(
    out: torch.Tensor, weights: torch.Tensor | None, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(output, position_bias, weights)``, as a T5 block returns them: its layer hands the bias
    on to the next layers (None where there is none; T5 hands on zeros there, which the next
    block of ours would only add)."""
    return out, bias, weights


#: a ``T5Block`` (the layer; the attention block's own parent is its ``layer[0]``): its
#: feed-forward sublayer is the last of ``layer``, after a cross-attention in a decoder
LAYERS = LayerLayout(
    attention="layer.0.SelfAttention",
    projections=("q", "k", "v", "o"),
    attention_norm="layer.0.layer_norm",
    mlp_norm=lambda block: block.layer[-1].layer_norm,
    mlp=lambda block: block.layer[-1].DenseReluDense,
    final_norm="decoder.final_layer_norm",
    encoder_final_norm="encoder.final_layer_norm",
    embeddings="shared",
)

FAMILY = Family(
    "T5 family",
    "q/k/v/o without biases or scaling, relative position bias: T5, Flan-T5",
    is_t5,
    lambda block, _model: load_t5(block),
    lambda block: bool(block.is_causal),
    store=store_t5,
    values=lambda block: (block.v, whole),
    score_bias=t5_position_bias,
    returns=_returns,
    kinds=("encoder-decoder",),
    layers=LAYERS,
)

"""The BART family: ``q_proj``/``k_proj``/``v_proj``/``out_proj`` and ``scaling``, learned
positions, self- and cross-attention (BART, mBART, Marian); the same module of ours serves both
attentions (cross-attention: ``forward(x, memory=encoder_output)``).

BART and Marian layers are post-norm (``self_attn_layer_norm`` after the attention's residual
sum, ``final_layer_norm`` after the MLP's); mBART's (and M2M-100's, Pegasus's, Blenderbot's)
are pre-norm, with the same norms before the attention and the MLP and a ``layer_norm`` after
each stack. Nothing in a layer's structure tells the two apart (the forward does), so the
layout asks the block's config for its model type.

transformers: ``models/bart/modeling_bart.py`` (``BartAttention``, ``BartEncoderLayer``),
``models/mbart/modeling_mbart.py``.
"""

from __future__ import annotations

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.record import (
    Family,
    LayerLayout,
    load_linears,
    store_linears,
    v_proj_values,
)

__all__ = ["FAMILY", "LAYERS", "is_bart", "load_bart", "store_bart"]

#: model types of the BART family whose layers norm before their attention and MLP
PRE_NORM_TYPES = ("mbart", "m2m_100", "nllb-moe", "blenderbot", "pegasus", "pegasus_x")


def is_bart(m: nn.Module) -> bool:
    """A BART-family attention block (four projections, ``scaling``, ``is_decoder`` and
    ``is_causal``)."""
    return all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj", "out_proj", "scaling")) and (
        hasattr(m, "is_decoder") and hasattr(m, "is_causal")
    )


def _linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj)


def load_bart(attention: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a BART-family block (``q_proj``/``k_proj``/``v_proj``/``out_proj``,
    ``scaling``: BART, mBART, Marian); the same module serves its self- and cross-attention
    (cross-attention: ``forward(x, memory=encoder_output)``)."""
    return load_linears(
        _linears(attention), num_heads=attention.num_heads, scale=float(attention.scaling)
    )


def store_bart(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a BART-family block (the inverse of ``load_bart``)."""
    store_linears(ours, _linears(attention))


def is_pre_norm(layer: nn.Module) -> bool:
    """Whether a BART-family layer norms before its attention and MLP (mBART) rather than
    after their residual sums (BART, Marian)."""
    config = getattr(layer.self_attn, "config", None)
    return getattr(config, "model_type", None) in PRE_NORM_TYPES


def _before(name: str):
    return lambda layer: getattr(layer, name) if is_pre_norm(layer) else None


def _after(name: str):
    return lambda layer: None if is_pre_norm(layer) else getattr(layer, name)


#: an encoder (or decoder) layer: ``self_attn``, its norm ``self_attn_layer_norm``, the MLP
#: ``fc2(act(fc1(.)))`` and its norm ``final_layer_norm`` (a decoder layer's cross-attention
#: ``encoder_attn`` has its own ``encoder_attn_layer_norm``); mBART's stacks end in a
#: ``layer_norm``, BART's and Marian's in none; the token embedding is the encoder's (the
#: decoder's shares its weight, Marian's ``shared`` is another module)
LAYERS = LayerLayout(
    attention="self_attn",
    projections=("q_proj", "k_proj", "v_proj", "out_proj"),
    attention_norm=_before("self_attn_layer_norm"),
    mlp_norm=_before("final_layer_norm"),
    attention_sum_norm=_after("self_attn_layer_norm"),
    mlp_sum_norm=_after("final_layer_norm"),
    mlp="fc2",
    mlp_input="fc1",
    final_norm="decoder.layer_norm",
    encoder_final_norm="encoder.layer_norm",
    embeddings="encoder.embed_tokens",
    positions="decoder.embed_positions",
    embedding_norm="encoder.layernorm_embedding",
)

FAMILY = Family(
    "BART family",
    "q_proj/k_proj/v_proj/out_proj with learned positions, self- and cross-attention: BART, "
    "mBART, Marian",
    is_bart,
    lambda block, _model: load_bart(block),
    lambda block: bool(block.is_causal),
    store=store_bart,
    values=v_proj_values,
    kinds=("encoder-decoder",),
    layers=LAYERS,
)

"""Phi (Phi-1, Phi-1.5, Phi-2): ``q_proj``/``k_proj``/``v_proj``/``dense`` with biases, partial
rotary positions (``partial_rotary_factor``: the first ``rotary_ndims`` features of each head,
``rotate_half`` within them) and parallel layers: attention and MLP read the same normed input.

transformers: ``models/phi/modeling_phi.py`` (``PhiAttention``); TransformerLens:
``pretrained/weight_conversions/phi.py``.
"""

from __future__ import annotations

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.record import (
    Family,
    LayerLayout,
    load_linears,
    our_rotary,
    rotary_of,
    store_linears,
    whole,
)

__all__ = ["FAMILY", "LAYERS", "is_phi", "load_phi", "store_phi"]


def is_phi(m: nn.Module) -> bool:
    """A Phi attention block (``q_proj``/``k_proj``/``v_proj``/``dense`` with ``rotary_ndims``)."""
    return all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj", "dense", "rotary_ndims"))


def _linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q_proj, attention.k_proj, attention.v_proj, attention.dense)


def load_phi(attention: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a Phi block, with the model's partial rotary embedding.

    Raises:
        ValueError: the block normalises Q and K (``qk_layernorm``), or its rotary width
            differs from the model's rotary embedding.
    """
    if getattr(attention, "qk_layernorm", False):
        raise ValueError("Phi's qk_layernorm (a LayerNorm on each head's Q and K) is not loaded")
    d_head = attention.head_dim
    rotary = our_rotary(rotary_of(model)).to(attention.q_proj.weight.device)
    if rotary.rot_dim != attention.rotary_ndims:
        raise ValueError(
            f"the rotary embedding rotates {rotary.rot_dim} features, the block "
            f"rotary_ndims={attention.rotary_ndims}"
        )
    return load_linears(
        _linears(attention),
        num_heads=attention.q_proj.weight.shape[0] // d_head,
        num_kv_heads=attention.k_proj.weight.shape[0] // d_head,
        scale=float(attention.scaling),
        rotary=rotary,
    )


def store_phi(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a Phi block (the inverse of ``load_phi``)."""
    store_linears(ours, _linears(attention))


#: ``x + self_attn(input_layernorm(x)) + mlp(input_layernorm(x))``: one norm for both blocks
LAYERS = LayerLayout(
    attention="self_attn",
    projections=("q_proj", "k_proj", "v_proj", "dense"),
    attention_norm="input_layernorm",
    final_norm="final_layernorm",
    embeddings="embed_tokens",
    parallel=lambda _block: True,
)

FAMILY = Family(
    "Phi",
    "q_proj/k_proj/v_proj/dense, partial rotary positions, parallel attention and MLP: "
    "Phi-1, Phi-1.5, Phi-2",
    is_phi,
    load_phi,
    lambda _block: True,
    store=store_phi,
    values=lambda block: (block.v_proj, whole),
    kinds=("decoder",),
    layers=LAYERS,
)

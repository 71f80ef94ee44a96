"""GPT-NeoX (Pythia): one fused ``query_key_value`` laid out per head, ``dense``, partial rotary
positions (``rotary_pct`` / ``partial_rotary_factor``: the first ``rotary_ndims`` features of
each head are rotated, ``rotate_half`` within them), and parallel residual layers when
``use_parallel_residual`` (attention and MLP both read the layer's input).

transformers: ``models/gpt_neox/modeling_gpt_neox.py`` (``GPTNeoXAttention``); TransformerLens:
``pretrained/weight_conversions/neox.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.fused import load_fused, store_fused, value_rows
from mhsa.engine.families.record import Family, LayerLayout, ValueOf, our_rotary, rotary_of

__all__ = ["FAMILY", "LAYERS", "is_neox", "load_neox", "store_neox"]


def is_neox(m: nn.Module) -> bool:
    """A GPT-NeoX attention block (fused per-head ``query_key_value`` with ``rotary_ndims``)."""
    return all(hasattr(m, p) for p in ("query_key_value", "dense", "rotary_ndims", "head_size"))


def _heads(attention: nn.Module) -> int:
    return attention.query_key_value.weight.shape[0] // (3 * attention.head_size)


def load_neox(attention: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a GPT-NeoX block, with the model's (partial) rotary embedding.

    Raises:
        ValueError: the model's rotary embedding rotates another width than the block does.
    """
    heads, d_head = _heads(attention), attention.head_size
    sizes = {"heads": heads, "kv_heads": heads, "d_head": d_head}
    fused = attention.query_key_value
    rotary = our_rotary(rotary_of(model)).to(fused.weight.device)
    if rotary.rot_dim != attention.rotary_ndims:
        raise ValueError(
            f"the rotary embedding rotates {rotary.rot_dim} features, the block "
            f"rotary_ndims={attention.rotary_ndims}"
        )
    return load_fused(
        fused, attention.dense, "per-head", **sizes, scale=float(attention.scaling), rotary=rotary
    )


def store_neox(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a GPT-NeoX block (the inverse of ``load_neox``)."""
    store_fused(ours, attention.query_key_value, attention.dense, "per-head")


def _values(attention: nn.Module) -> tuple[nn.Module, ValueOf]:
    heads, d_head = _heads(attention), attention.head_size

    def value_of(out: torch.Tensor) -> torch.Tensor:
        return value_rows(out, "per-head", heads=heads, kv_heads=heads, d_head=d_head)

    return attention.query_key_value, value_of


#: ``x + attention(input_layernorm(x)) + mlp(post_attention_layernorm(x))`` when parallel,
#: else ``h = x + attention(input_layernorm(x))``, ``h + mlp(post_attention_layernorm(h))``
LAYERS = LayerLayout(
    attention="attention",
    projections=("query_key_value", "dense"),
    attention_norm="input_layernorm",
    mlp_norm="post_attention_layernorm",
    final_norm="final_layer_norm",
    embeddings="embed_in",
    # the head's own: transformers renamed GPT-NeoX's ``embed_out`` to ``lm_head``
    unembedding=lambda head: head.get_output_embeddings(),
    parallel=lambda block: bool(getattr(block.config, "use_parallel_residual", False)),
)

FAMILY = Family(
    "GPT-NeoX",
    "fused per-head query_key_value + dense, partial rotary positions, parallel residual: "
    "GPT-NeoX, Pythia",
    is_neox,
    load_neox,
    lambda _block: True,
    store=store_neox,
    values=_values,
    kinds=("decoder",),
    layers=LAYERS,
)

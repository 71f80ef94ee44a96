"""Falcon: one fused ``query_key_value`` in one of three layouts, ``dense``, rotary positions,
parallel attention and MLP.

- ``new_decoder_architecture`` (Falcon-40B/180B, Falcon2): grouped-query attention, the fused
  rows grouped per key/value head (its query heads, then its K, then its V);
- ``multi_query`` (Falcon-7B/RW): multi-query attention, all Q rows then one K and one V head;
- neither: one K and V per query head, the rows laid out per head as GPT-NeoX's.

ALiBi Falcons are refused by the swap (``alibi``). transformers: ``models/falcon/
modeling_falcon.py`` (``FalconAttention._split_heads``).
"""

from __future__ import annotations

import math

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.fused import load_fused, store_fused, value_rows
from mhsa.engine.families.record import Family, LayerLayout, ValueOf, our_rotary, rotary_of

__all__ = ["FAMILY", "LAYERS", "is_falcon", "load_falcon", "store_falcon"]


def is_falcon(m: nn.Module) -> bool:
    """A Falcon attention block (fused ``query_key_value`` with ``multi_query`` and
    ``new_decoder_architecture`` flags)."""
    parts = ("query_key_value", "dense", "multi_query", "new_decoder_architecture")
    return all(hasattr(m, p) for p in parts)


def _layout(attention: nn.Module) -> tuple[str, dict[str, int]]:
    """The fused layout and the sizes (``heads``, ``kv_heads``, ``d_head``) of a block."""
    heads, d_head = attention.num_heads, attention.head_dim
    if attention.new_decoder_architecture:
        kv = attention.num_kv_heads
        return "grouped", {"heads": heads, "kv_heads": kv, "d_head": d_head}
    if attention.multi_query:
        return "stacked", {"heads": heads, "kv_heads": 1, "d_head": d_head}
    return "per-head", {"heads": heads, "kv_heads": heads, "d_head": d_head}


def load_falcon(attention: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a Falcon block with rotary positions (multi-query or grouped-query
    attention as the block has it)."""
    layout, sizes = _layout(attention)
    fused = attention.query_key_value
    return load_fused(
        fused,
        attention.dense,
        layout,
        **sizes,
        scale=1.0 / math.sqrt(sizes["d_head"]),
        rotary=our_rotary(rotary_of(model)).to(fused.weight.device),
    )


def store_falcon(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a Falcon block (the inverse of ``load_falcon``)."""
    store_fused(ours, attention.query_key_value, attention.dense, _layout(attention)[0])


def _values(attention: nn.Module) -> tuple[nn.Module, ValueOf]:
    layout, sizes = _layout(attention)
    return attention.query_key_value, lambda out: value_rows(out, layout, **sizes)


def _parallel(block: nn.Module) -> bool:
    config = block.config
    return bool(config.parallel_attn or config.new_decoder_architecture)


def _two_norms(layer: nn.Module) -> bool:
    """Whether the layer has a norm for each block (``ln_attn``, ``ln_mlp``): the new decoder
    architecture with ``num_ln_in_parallel_attn`` 2 (the layer's default there)."""
    config = layer.config
    two = getattr(config, "num_ln_in_parallel_attn", None) or 2
    return bool(config.new_decoder_architecture) and two == 2


def _attention_norm(layer: nn.Module) -> nn.Module | None:
    """``ln_attn`` in the new decoder architecture (with two norms), else ``input_layernorm``."""
    if _two_norms(layer):
        return layer.ln_attn
    return layer.input_layernorm


def _mlp_norm(layer: nn.Module) -> nn.Module | None:
    """``ln_mlp`` in the new decoder architecture (with two norms), ``post_attention_layernorm``
    in a sequential layer, else None: the MLP reads the attention's norm."""
    config = layer.config
    if _two_norms(layer):
        return layer.ln_mlp
    if not config.parallel_attn and not config.new_decoder_architecture:
        return layer.post_attention_layernorm
    return None


LAYERS = LayerLayout(
    attention="self_attention",
    projections=("query_key_value", "dense"),
    attention_norm=_attention_norm,
    mlp_norm=_mlp_norm,
    final_norm="ln_f",
    embeddings="word_embeddings",
    parallel=_parallel,
)

FAMILY = Family(
    "Falcon",
    "fused query_key_value (multi-query, grouped or per head) + dense, rotary positions, "
    "parallel attention and MLP: Falcon",
    is_falcon,
    load_falcon,
    lambda _block: True,
    store=store_falcon,
    values=_values,
    kinds=("decoder",),
    layers=LAYERS,
)

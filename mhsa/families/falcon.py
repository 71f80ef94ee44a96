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

import torch
from torch import nn

from mhsa.attention import MultiHeadSelfAttention
from mhsa.families.fused import join_qkv, split_linear_qkv, value_rows
from mhsa.families.record import Family, ValueOf, bias_of, our_rotary, rotary_of

__all__ = ["FAMILY", "is_falcon", "load_falcon", "store_falcon"]


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
    w_q, w_k, w_v, b_q, b_k, b_v = split_linear_qkv(attention.query_key_value, layout, **sizes)
    return MultiHeadSelfAttention.from_projections(
        w_q,
        w_k,
        w_v,
        attention.dense.weight.detach(),
        b_q,
        b_k,
        b_v,
        bias_of(attention.dense),
        num_heads=sizes["heads"],
        num_kv_heads=sizes["kv_heads"],
        scale=1.0 / math.sqrt(sizes["d_head"]),
        rotary=our_rotary(rotary_of(model)).to(w_q.device),
    )


def store_falcon(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a Falcon block (the inverse of ``load_falcon``)."""
    layout, sizes = _layout(attention)
    counts = {"heads": sizes["heads"], "kv_heads": sizes["kv_heads"]}
    (w_q, w_k, w_v, w_o), (b_q, b_k, b_v, b_o) = ours.projections()
    with torch.no_grad():
        fused = attention.query_key_value
        fused.weight.copy_(join_qkv(w_q, w_k, w_v, layout, **counts))
        if fused.bias is not None and b_q is not None:
            fused.bias.copy_(join_qkv(b_q, b_k, b_v, layout, **counts))
        attention.dense.weight.copy_(w_o)
        if attention.dense.bias is not None and b_o is not None:
            attention.dense.bias.copy_(b_o)


def _values(attention: nn.Module) -> tuple[nn.Module, ValueOf]:
    layout, sizes = _layout(attention)
    return attention.query_key_value, lambda out: value_rows(out, layout, **sizes)


def _parallel(block: nn.Module) -> bool:
    config = block.config
    return bool(config.parallel_attn or config.new_decoder_architecture)


FAMILY = Family(
    "Falcon",
    "fused query_key_value (multi-query, grouped or per head) + dense, rotary positions, "
    "parallel attention and MLP: Falcon",
    is_falcon,
    load_falcon,
    lambda _block: True,
    store=store_falcon,
    values=_values,
    parallel=_parallel,
    kinds=("decoder",),
)

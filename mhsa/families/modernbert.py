"""ModernBERT: an encoder whose W_Q, W_K, W_V are fused in one ``Wqkv`` (rows: queries, keys,
values, as our fused projection), ``Wo``, rotary positions with one base on its global layers
and another on its local ones, and a bidirectional sliding window on the local layers: a token
sees tokens at most ``local_attention / 2`` positions away (the block's ``sliding_window`` is
that plus one, as ``attention_core`` counts windows)."""

from __future__ import annotations

import torch
from torch import nn

from mhsa.attention import MultiHeadSelfAttention
from mhsa.families.parts import linear_bias, rotary_for, store_linear, window_of

__all__ = ["is_modernbert", "load_modernbert", "modernbert_finish", "store_modernbert"]


def is_modernbert(m: nn.Module) -> bool:
    """A block with a fused ``Wqkv`` and a ``Wo``."""
    return hasattr(m, "Wqkv") and hasattr(m, "Wo")


def load_modernbert(block: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a ModernBERT block (``Wqkv`` split in three equal parts).

    Raises:
        ValueError: dynamic rope.
    """
    w_q, w_k, w_v = block.Wqkv.weight.detach().chunk(3)
    bias = linear_bias(block.Wqkv)
    b_q, b_k, b_v = (None,) * 3 if bias is None else bias.chunk(3)
    return MultiHeadSelfAttention.from_projections(
        w_q,
        w_k,
        w_v,
        block.Wo.weight.detach(),
        b_q,
        b_k,
        b_v,
        linear_bias(block.Wo),
        num_heads=block.config.num_attention_heads,
        scale=float(block.head_dim**-0.5),
        rotary=rotary_for(block, model),
        sliding_window=window_of(block),
    )


def store_modernbert(ours: MultiHeadSelfAttention, block: nn.Module) -> None:
    """Our module's weights into a ModernBERT block (``Wqkv`` whole again)."""
    (w_q, w_k, w_v, w_o), (b_q, b_k, b_v, b_o) = ours.projections()
    fused_bias = None if b_q is None else torch.cat([b_q, b_k, b_v])
    store_linear(block.Wqkv, torch.cat([w_q, w_k, w_v]), fused_bias)
    store_linear(block.Wo, w_o, b_o)


def modernbert_finish(block: nn.Module, out: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
    """The block's dropout after ``Wo`` (the residual sum is the layer's)."""
    return block.out_drop(out)

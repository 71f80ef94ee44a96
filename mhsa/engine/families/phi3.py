"""Phi-3: W_Q, W_K, W_V fused in one ``qkv_proj`` (rows: queries, then keys, then values, as our
module's own fused projection), ``o_proj``, grouped-query attention, rotary positions on the
first ``partial_rotary_factor * head_dim`` features of each head (``rotate_half``, as ours), and
a sliding window over every layer when the config sets one. Phi-3's LongRoPE (the 128k
models) changes its frequencies with the length and is refused by name."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.fused import load_fused, store_fused
from mhsa.engine.families.parts import rotary_for, window_of
from mhsa.engine.families.projected import LLAMA_LAYERS
from mhsa.engine.families.record import Family, causal_unless_told

__all__ = ["FAMILY", "LAYERS", "is_phi3", "load_phi3", "phi3_values", "store_phi3"]


def is_phi3(m: nn.Module) -> bool:
    """A block with a fused ``qkv_proj``, an ``o_proj`` and a ``head_dim``."""
    return all(hasattr(m, p) for p in ("qkv_proj", "o_proj", "head_dim"))


def _sizes(block: nn.Module) -> list[int]:
    d_head = block.head_dim
    q = block.config.num_attention_heads * d_head
    kv = block.config.num_key_value_heads * d_head
    return [q, kv, kv]


def load_phi3(block: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a Phi-3 block (``qkv_proj`` split into W_Q, W_K, W_V).

    Raises:
        ValueError: dynamic rope (LongRoPE).
    """
    return load_fused(
        block.qkv_proj,
        block.o_proj,
        "stacked",
        heads=block.config.num_attention_heads,
        kv_heads=block.config.num_key_value_heads,
        d_head=block.head_dim,
        scale=float(block.scaling),
        rotary=rotary_for(block, model),
        sliding_window=window_of(block),
    )


def store_phi3(ours: MultiHeadSelfAttention, block: nn.Module) -> None:
    """Our module's weights into a Phi-3 block (``qkv_proj`` whole again)."""
    store_fused(ours, block.qkv_proj, block.o_proj, "stacked")


def phi3_values(block: nn.Module) -> tuple[nn.Module, object]:
    """V is the last ``kv heads * head_dim`` features of ``qkv_proj``'s output."""
    q, kv, _ = _sizes(block)
    return block.qkv_proj, lambda qkv: qkv[..., q + kv :]


#: Llama's layer layout with the fused projection
LAYERS = replace(LLAMA_LAYERS, projections=("qkv_proj", "o_proj"))

FAMILY = Family(
    "Phi-3",
    "fused qkv_proj + o_proj with rotary positions (partial) and grouped-query attention",
    is_phi3,
    load_phi3,
    causal_unless_told,
    store=store_phi3,
    values=phi3_values,
    kinds=("decoder",),
    layers=LAYERS,
)

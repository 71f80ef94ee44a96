"""Qwen3: Llama's layout with an RMSNorm of each head's query and key (``q_norm``/``k_norm`` of
width ``head_dim``), before the rotary positions; sliding windows on the layers its
``layer_types`` name."""

from __future__ import annotations

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.projected import is_projected, load_projected, projected_decoder

__all__ = ["FAMILY", "is_qwen3", "load_qwen3"]


def is_qwen3(m: nn.Module) -> bool:
    """A four-projection block with per-head q/k norms and no soft-capping (Gemma 3 has it)."""
    norm = getattr(m, "q_norm", None)
    return (
        is_projected(m)
        and norm is not None
        and norm.weight.numel() == m.head_dim
        and not hasattr(m, "attn_logit_softcapping")
    )


def load_qwen3(block: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a Qwen3 block: its projections, per-head q/k norms, window, rope."""
    return load_projected(block, model)


#: Llama's layer layout (``projected.LLAMA_LAYERS``)
FAMILY = projected_decoder(
    "Qwen3",
    "q_proj/k_proj/v_proj/o_proj with an RMSNorm of each head's query and key (q_norm/k_norm)",
    is_qwen3,
    load_qwen3,
)

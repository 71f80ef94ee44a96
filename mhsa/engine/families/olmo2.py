"""OLMo 2: Llama's layout with an RMSNorm of the whole query and key projections (``q_norm`` of
width ``heads * head_dim``, before splitting into heads), and norms after the attention and the
MLP outputs inside each layer (``post_attention_layernorm``, ``post_feedforward_layernorm``;
the residual decomposition of ``mhsa.causal.attribution`` follows them)."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.projected import (
    LLAMA_LAYERS,
    is_projected,
    load_projected,
    projected_decoder,
)

__all__ = ["FAMILY", "LAYERS", "is_olmo2", "load_olmo2"]


def is_olmo2(m: nn.Module) -> bool:
    """A four-projection block whose q norm spans the whole projection."""
    norm = getattr(m, "q_norm", None)
    return (
        is_projected(m)
        and norm is not None
        and norm.weight.numel() == m.q_proj.weight.shape[0] != m.head_dim
    )


def load_olmo2(block: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from an OLMo 2 block: its projections, whole-projection q/k norms, rope."""
    return load_projected(block, model)


#: ``h = x + post_attention_layernorm(self_attn(x))``, then
#: ``h + post_feedforward_layernorm(mlp(h))``: no norm before either block
LAYERS = replace(
    LLAMA_LAYERS,
    attention_norm=None,
    mlp_norm=None,
    post_attention_norm="post_attention_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
)

FAMILY = projected_decoder(
    "OLMo 2",
    "q_proj/k_proj/v_proj/o_proj with an RMSNorm of the whole query and key projections, "
    "norms after attention and MLP outputs",
    is_olmo2,
    load_olmo2,
    LAYERS,
)

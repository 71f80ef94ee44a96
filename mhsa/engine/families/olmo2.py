"""OLMo 2: Llama's layout with an RMSNorm of the whole query and key projections (``q_norm`` of
width ``heads * head_dim``, before splitting into heads), and norms after the attention and the
MLP outputs inside each layer (``post_attention_layernorm``, ``post_feedforward_layernorm``;
the residual decomposition of ``mhsa.causal.attribution`` follows them)."""

from __future__ import annotations

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.projected import is_projected, load_projected

__all__ = ["is_olmo2", "load_olmo2"]


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

"""The Gemma families: Llama's layout with Gemma's own parts.

- Gemma: the block is Llama's; the model around it scales the embeddings by ``sqrt(d_model)``
  and its norms compute ``x / rms(x) * (1 + w)`` (``mhsa.causal.attribution`` follows both).
- Gemma 2: attention-logit soft-capping ``c * tanh(s / c)`` before the mask, the score scale
  ``query_pre_attn_scalar ** -0.5``, a sliding window on every other layer, norms after the
  attention and MLP outputs, and a final soft-cap of the logits.
- Gemma 3 (text): Gemma 2's block without the soft-cap by default, with per-head q/k norms
  (``1 + w``), and its own rope frequencies on the sliding-window layers.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.parts import check_flags
from mhsa.engine.families.projected import (
    LLAMA_LAYERS,
    is_projected,
    load_projected,
    projected_decoder,
)

__all__ = [
    "FAMILY",
    "FAMILY_2",
    "FAMILY_3",
    "LAYERS_2",
    "is_gemma",
    "is_gemma2",
    "is_gemma3",
    "load_gemma",
]


def _model_type(m: nn.Module) -> str | None:
    return getattr(getattr(m, "config", None), "model_type", None)


def is_gemma(m: nn.Module) -> bool:
    """A Gemma (1) block: Llama's layout in a model of type ``gemma``."""
    return (
        is_projected(m)
        and getattr(m, "q_norm", None) is None
        and not hasattr(m, "attn_logit_softcapping")
        and _model_type(m) == "gemma"
    )


def is_gemma2(m: nn.Module) -> bool:
    """A Gemma 2 block: four projections and ``attn_logit_softcapping``, no q/k norms."""
    return (
        is_projected(m)
        and hasattr(m, "attn_logit_softcapping")
        and getattr(m, "q_norm", None) is None
    )


def is_gemma3(m: nn.Module) -> bool:
    """A Gemma 3 block: four projections, ``attn_logit_softcapping`` and q/k norms."""
    return (
        is_projected(m)
        and hasattr(m, "attn_logit_softcapping")
        and getattr(m, "q_norm", None) is not None
    )


def load_gemma(block: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a Gemma, Gemma 2 or Gemma 3 block (``projected.load_projected``).

    Raises:
        ValueError: ``use_bidirectional_attention`` (EmbeddingGemma's bidirectional layers,
            whose window transformers counts differently), dynamic rope.
    """
    check_flags(block.config, ("use_bidirectional_attention",))
    return load_projected(block, model)


#: Gemma 2/3: ``h = x + post_attention_layernorm(self_attn(input_layernorm(x)))``, then
#: ``h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))``
LAYERS_2 = replace(
    LLAMA_LAYERS,
    mlp_norm="pre_feedforward_layernorm",
    post_attention_norm="post_attention_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
)

#: Llama's layer layout (``projected.LLAMA_LAYERS``)
FAMILY = projected_decoder(
    "Gemma",
    "Llama's layout; embeddings scaled by sqrt(d_model), norms x / rms(x) * (1 + w)",
    is_gemma,
    load_gemma,
)

FAMILY_2 = projected_decoder(
    "Gemma 2",
    "q_proj/k_proj/v_proj/o_proj with attention-logit soft-capping, query_pre_attn_scalar, "
    "sliding windows on alternate layers, norms after attention and MLP outputs",
    is_gemma2,
    load_gemma,
    LAYERS_2,
)

FAMILY_3 = projected_decoder(
    "Gemma 3 (text)",
    "Gemma 2's layout with per-head q/k norms (1 + w) and local rope on sliding layers",
    is_gemma3,
    load_gemma,
    LAYERS_2,
)

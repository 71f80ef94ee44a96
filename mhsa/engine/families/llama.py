"""The Llama layout: ``q_proj``/``k_proj``/``v_proj``/``o_proj`` with rotary positions and
grouped-query attention (Llama, Qwen2, Mistral and models with the same layout), less the
blocks the newer families of that layout claim (Qwen3, OLMo 2, Gemma 1-3: their own modules).

transformers: ``models/llama/modeling_llama.py`` (``LlamaAttention``, ``LlamaDecoderLayer``);
TransformerLens: ``pretrained/weight_conversions/llama.py``.
"""

from __future__ import annotations

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention, RotaryEmbedding
from mhsa.engine.families.gemma import is_gemma, is_gemma2, is_gemma3
from mhsa.engine.families.olmo2 import is_olmo2
from mhsa.engine.families.parts import window_of
from mhsa.engine.families.projected import LLAMA_LAYERS
from mhsa.engine.families.qwen3 import is_qwen3
from mhsa.engine.families.record import (
    Family,
    bias_of,
    causal_unless_told,
    our_rotary,
    rotary_of,
    store_linears,
    v_proj_values,
)

__all__ = ["FAMILY", "is_llama", "load_llama", "store_llama"]


def is_llama(m: nn.Module) -> bool:
    """Llama's layout, less the blocks the newer families of the same layout claim (q/k norms:
    Qwen3, OLMo 2, Gemma 3; soft-capping: Gemma 2/3; Gemma)."""
    claimed = (is_qwen3, is_olmo2, is_gemma, is_gemma2, is_gemma3)
    layout = all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim"))
    return layout and not any(claims(m) for claims in claimed)


def _linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj)


def _our_rotary(
    attention: nn.Module, rotary: RotaryEmbedding | nn.Module | None, d_head: int
) -> RotaryEmbedding:
    """The model's rotary embedding as ours (default: RoPE from the block's config)."""
    if rotary is None:
        params = getattr(getattr(attention, "config", None), "rope_parameters", None) or {}
        return RotaryEmbedding.default(d_head, float(params.get("rope_theta", 10000.0)))
    if isinstance(rotary, RotaryEmbedding):
        return rotary
    return our_rotary(rotary)


def load_llama(
    attention: nn.Module, rotary: RotaryEmbedding | nn.Module | None = None
) -> MultiHeadSelfAttention:
    """Our module from a Llama-layout block (``q_proj``/``k_proj``/``v_proj``/``o_proj``: Llama,
    Qwen2, Mistral and models with the same layout), with grouped-query attention.

    Args:
        attention: the block.
        rotary: the model's rotary embedding (``model.rotary_emb``: its ``inv_freq`` and
            ``attention_scaling`` carry the model's rope scaling) or a ``RotaryEmbedding``;
            default: RoPE from the block's config (``rope_theta``, no scaling).

    Raises:
        ValueError: the block normalises Q/K (Qwen3, OLMo-2...) or its rope is dynamic.
    """
    for norm in ("q_norm", "k_norm", "q_layernorm"):
        if getattr(attention, norm, None) is not None:
            raise ValueError(f"load_llama cannot load blocks with {norm} (Q/K normalisation)")
    d_head = attention.head_dim
    projections = _linears(attention)
    return MultiHeadSelfAttention.from_projections(
        *(p.weight.detach() for p in projections),
        *(bias_of(p) for p in projections),
        num_heads=attention.q_proj.weight.shape[0] // d_head,
        num_kv_heads=attention.k_proj.weight.shape[0] // d_head,
        scale=float(attention.scaling),
        rotary=_our_rotary(attention, rotary, d_head).to(attention.q_proj.weight.device),
    )


def store_llama(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a Llama-layout block (the rotary positions are the model's)."""
    store_linears(ours, _linears(attention))


def _load_of_model(block: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    config = getattr(block, "config", None)
    for unsupported in ("attn_logit_softcapping", "query_pre_attn_scalar"):
        if getattr(config, unsupported, None) is not None:
            raise ValueError(f"the model's attention uses {unsupported}")
    ours = load_llama(block, rotary_of(model))
    ours.sliding_window = window_of(block)  # Mistral, Qwen2 configs with a window
    return ours


FAMILY = Family(
    "Llama-style",
    "q_proj/k_proj/v_proj/o_proj with rotary positions and grouped-query attention: Llama, "
    "Qwen2, Mistral",
    is_llama,
    _load_of_model,
    causal_unless_told,
    store=store_llama,
    values=v_proj_values,
    kinds=("decoder",),
    layers=LLAMA_LAYERS,
)

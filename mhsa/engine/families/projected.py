"""Blocks with four projections ``q_proj``/``k_proj``/``v_proj``/``o_proj``, rotary positions and
grouped-query attention, and the options the newer families add to Llama's layout: q/k norms
(Qwen3, Gemma 3, OLMo 2), attention-logit soft-capping (Gemma 2), ``query_pre_attn_scalar``
(Gemma 2/3: the block's ``scaling``), sliding windows on some layers (Qwen2/3, Gemma 2/3)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.parts import (
    our_rms_norm,
    rotary_for,
    window_of,
)
from mhsa.engine.families.record import (
    Family,
    LayerLayout,
    bias_of,
    causal_unless_told,
    copy_linear,
    v_proj_values,
)

__all__ = [
    "LLAMA_LAYERS",
    "is_projected",
    "load_projected",
    "projected_decoder",
    "projected_linears",
    "store_projected",
]

#: Llama's pre-norm sequential layer, which Qwen2/3, Mistral, Gemma and Phi-3 share:
#: ``h = x + self_attn(input_layernorm(x))``, then ``h + mlp(post_attention_layernorm(h))``
#: (in this layout ``post_attention_layernorm`` is the norm before the MLP, not after the
#: attention: Gemma 2/3 and OLMo 2 use the same name for a norm after the attention)
LLAMA_LAYERS = LayerLayout(
    attention="self_attn",
    projections=("q_proj", "k_proj", "v_proj", "o_proj"),
    attention_norm="input_layernorm",
    mlp_norm="post_attention_layernorm",
    final_norm="norm",
    embeddings="embed_tokens",
)


def is_projected(m: nn.Module) -> bool:
    """Whether ``m`` has Llama's four projections and a ``head_dim``."""
    return all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim"))


def projected_linears(block: nn.Module) -> tuple[nn.Module, ...]:
    """W_Q, W_K, W_V, W_O of the block."""
    return (block.q_proj, block.k_proj, block.v_proj, block.o_proj)


def load_projected(block: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a four-projection rotary block, with the options it uses: q/k norms (per
    head when the norm's width is ``head_dim``, else over the whole projection), soft-capping
    (``attn_logit_softcapping``), its score scale (``scaling``: ``query_pre_attn_scalar ** -0.5``
    for Gemma 2/3), its sliding window and its layer type's rotary frequencies.

    Raises:
        ValueError: a q/k norm that is no RMSNorm, or dynamic rope.
    """
    d_head = block.head_dim
    norms = {}
    for name in ("q_norm", "k_norm"):
        norm = getattr(block, name, None)
        if norm is not None:
            norms[name] = our_rms_norm(norm, per_head=norm.weight.numel() == d_head)
    softcap = getattr(block, "attn_logit_softcapping", None)
    linears = projected_linears(block)
    return MultiHeadSelfAttention.from_projections(
        *(p.weight.detach() for p in linears),
        *(bias_of(p) for p in linears),
        num_heads=block.q_proj.weight.shape[0] // d_head,
        num_kv_heads=block.k_proj.weight.shape[0] // d_head,
        scale=float(block.scaling),
        rotary=rotary_for(block, model),
        softcap=None if softcap is None else float(softcap),
        sliding_window=window_of(block),
        **norms,
    )


def store_projected(ours: MultiHeadSelfAttention, block: nn.Module) -> None:
    """Our module's weights (projections, q/k norm weights) into the block: ``load_projected``'s
    inverse."""
    weights, biases = ours.projections()
    for linear, w, b in zip(projected_linears(block), weights, biases, strict=True):
        copy_linear(linear, w, b)
    with torch.no_grad():
        for name in ("q_norm", "k_norm"):
            norm = getattr(ours, name)
            if norm is not None:
                getattr(block, name).weight.copy_(norm.weight)


def projected_decoder(
    name: str,
    layout: str,
    matches: Callable[[nn.Module], bool],
    load: Callable[[nn.Module, nn.Module], MultiHeadSelfAttention],
    layers: LayerLayout = LLAMA_LAYERS,
) -> Family:
    """A decoder family of separate ``q_proj/k_proj/v_proj/o_proj`` (``store_projected``, V
    from ``v_proj``), causal unless the block says otherwise, in Llama's layer layout unless
    ``layers`` says another."""
    return Family(
        name,
        layout,
        matches,
        load,
        causal_unless_told,
        store=store_projected,
        values=v_proj_values,
        kinds=("decoder",),
        layers=layers,
    )

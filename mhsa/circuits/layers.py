"""The parts of a pre-norm decoder layer a circuit run touches (``mhsa.circuits.runs``), found by
its family's layer layout (``mhsa.engine.families.layout``, the same parts the residual
decomposition reads): the norm before its attention, the norm its MLP reads, whether it is a
parallel block, and its attention weights per head (grouped-query attention ungrouped).

A sequential layer computes ``h = x + attn(ln_1(x))`` then ``h + mlp(ln_2(h))``; a parallel
layer (GPT-J, GPT-NeoX/Pythia with ``use_parallel_residual``, Phi, Falcon) computes
``x + attn(ln_a(x)) + mlp(ln_m(x))``: its MLP reads the layer's input, so no head of its own
layer (EAP-IG's ``parallel_attn_mlp`` graphs, hannamw/EAP-IG ``src/eap/graph.py``). ``ln_m`` is
the layer's own MLP norm where it has one (GPT-NeoX ``post_attention_layernorm``, Falcon's new
architecture ``ln_mlp``), else the attention's (GPT-J ``ln_1``, Phi and Falcon
``input_layernorm``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.layout import (
    attention_norm_of,
    mlp_input_of,
    mlp_norm_of,
    mlp_of,
    post_norms_of,
)
from mhsa.engine.runs.swap import OurBlock
from mhsa.errors import UnsupportedModelError

__all__ = ["is_parallel", "layer_norms", "per_head", "ungrouped"]


def is_parallel(block: OurBlock) -> bool:
    """Whether ``block``'s layer feeds its MLP the layer's input (``Family.parallel``)."""
    return block.family.parallel is not None and bool(block.family.parallel(block.original))


def layer_norms(
    layer: nn.Module, parallel: bool, unsupported: Callable[[str], Exception]
) -> tuple[nn.Module, nn.Module]:
    """The norm ``layer`` applies before its attention and the norm its MLP reads (see the
    module's docstring).

    Raises:
        the exception ``unsupported(why)`` makes: norms after attention or the MLP, a layer
        without those norms and an MLP, or an MLP that is no module of its own (OPT).
    """
    if post_norms_of(layer):
        raise unsupported("norms after attention or the MLP")
    attention, mlp = attention_norm_of(layer), mlp_norm_of(layer)
    if parallel and mlp is None:
        mlp = attention
    if attention is None or mlp is None or mlp_of(layer) is None:
        raise unsupported("a layer without a norm before its attention and before its MLP")
    if mlp_input_of(layer) is not mlp_of(layer):
        # OPT: fc1, the activation and fc2 are the layer's own, run on the tokens flattened
        # to [B T, D]; the MLP node's hooks read and write one module on [B, T, D]
        raise unsupported("an MLP that is no module of its own (OPT's fc1 and fc2 inline)")
    return attention, mlp


def ungrouped(ours: MultiHeadSelfAttention) -> MultiHeadSelfAttention:
    """``ours`` with one key/value head per query head (each a copy of its group's), as
    TransformerLens's ``ungroup_grouped_query_attention``; q/k norms, soft-cap and window kept.

    Raises:
        UnsupportedModelError: a key norm over all key/value heads together (its statistics
            would change with the copies).
    """
    if ours.groups == 1:
        return ours
    if ours.k_norm is not None and not ours.k_norm.per_head:
        raise UnsupportedModelError(
            "A key norm over all key/value heads together with grouped-query attention: "
            "circuits run each query head with its own copy of its key head, which that norm "
            "does not allow."
        )
    (w_q, w_k, w_v, w_o), (b_q, b_k, b_v, b_o) = ours.projections()

    def spread(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        heads = t.reshape(ours.num_kv_heads, ours.d_head, *t.shape[1:])
        return heads.repeat_interleave(ours.groups, dim=0).reshape(-1, *t.shape[1:])

    module = MultiHeadSelfAttention.from_projections(
        w_q,
        spread(w_k),  # type: ignore[arg-type]
        spread(w_v),  # type: ignore[arg-type]
        w_o,
        b_q,
        spread(b_k),
        spread(b_v),
        b_o,
        num_heads=ours.num_heads,
        scale=ours.scale,
        rotary=ours.rotary,
        q_norm=ours.q_norm,  # per head (Qwen3): the same on every copy of a key head
        k_norm=ours.k_norm,
        softcap=ours.softcap,
        sliding_window=ours.sliding_window,
    )
    return module.eval()


def per_head(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """``[H Dh, D]`` (``nn.Linear`` layout) -> ``[H, Dh, D]``."""
    return weight.reshape(heads, -1, weight.shape[-1])

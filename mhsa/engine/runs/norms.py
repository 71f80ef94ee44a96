"""Value-weighted attention (Kobayashi et al. 2020, "Attention is Not Only a Weight").

Head h's output at query i is ``sum_j alpha_ij f_h(x_j)`` with
``f_h(x) = (x W_V^h + b_V^h) W_O^h``: the head's value projection and its slice of the output
projection (the output bias ``b_O`` is shared by all heads and left out, as in the paper). A
large weight on a vector of small norm moves the output little: ``alpha_ij * ||f_h(x_j)||``
says how much key j actually contributes to query i in head h.

Both engines take ``W_O`` from our module of each block (``mhsa.engine.runs.swap.our_blocks``: the
model's
weights). The ``mhsa`` engine observes the per-head V our module computes anyway ("per-head V");
the ``transformers`` engine reads the V the model's own block computes, with a forward hook on
its value projection (``Family.values``; a family that does not name it: a pre-hook projects the
block's input with our module).
Values are not rotated (rotary positions turn Q and K only), so the norms need no positions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mhsa.engine.attention.module import MultiHeadSelfAttention, Observer
from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.swap import OurBlock, our_blocks
from mhsa.engine.stream.hooks import Hook, after, before, hooked
from mhsa.errors import UnsupportedModelError

__all__ = [
    "blocks_for_norms",
    "check_norms_apply",
    "norm_observers",
    "norms_as_attention",
    "recording_value_norms",
    "value_norms",
    "values_of",
    "weighted_by_norm",
]


def value_norms(ours: MultiHeadSelfAttention, values: torch.Tensor) -> torch.Tensor:
    """``||f_h(x_j)||`` for every query head h and key position j.

    Args:
        ours: the module whose output projection ``W_O`` the heads write through.
        values: its per-head values ``[B, G, S, Dh]`` (bias included); with grouped-query
            attention each of the G key/value heads serves H / G consecutive query heads.

    Returns:
        ``[B, H, S]``: the norm of each head's value vector after its slice of ``W_O``
        (float32).
    """
    w_o = ours.out.weight  # (D, H Dh): head h reads columns h Dh .. (h + 1) Dh
    per_head = w_o.view(w_o.shape[0], ours.num_heads, ours.d_head).transpose(0, 1)  # (H, D, Dh)
    # ||v W_O^h||^2 = v (W_O^h^T W_O^h) v^T: a Dh x Dh Gram matrix per head instead of
    # mapping every value to d_model (Dh / D of the work)
    per_head = per_head.float()  # 16-bit models: the squares summed in float32
    gram = per_head.transpose(1, 2) @ per_head  # (H, Dh, Dh)
    v = values.float().repeat_interleave(ours.groups, dim=1)  # (B, H, S, Dh)
    squared = (torch.matmul(v, gram) * v).sum(-1)  # (B, H, S)
    return squared.clamp_min_(0).sqrt_()


def values_of(ours: MultiHeadSelfAttention, hidden: torch.Tensor) -> torch.Tensor:
    """Our module's per-head values ``[B, G, S, Dh]`` of the hidden states ``[B, S, D]`` its
    block receives: ``X W_V + b_V`` split into heads, as its "per-head V" observation point."""
    (_, _, w_v, _), (_, _, b_v, _) = ours.projections()
    return _per_head(ours, F.linear(hidden.to(w_v.dtype), w_v, b_v))


def _per_head(ours: MultiHeadSelfAttention, v: torch.Tensor) -> torch.Tensor:
    """Values ``[B, S, G Dh]`` -> ``[B, G, S, Dh]``."""
    return v.view(*v.shape[:2], ours.num_kv_heads, ours.d_head).transpose(1, 2)


def check_norms_apply(lm: LoadedModel) -> None:
    """Value norms are computed for encoders and decoders.

    Raises:
        UnsupportedModelError: ``lm`` is an encoder-decoder model.
    """
    if lm.is_encoder_decoder:
        raise UnsupportedModelError(
            "Attention weighted by value norm is computed for encoders and decoders, not yet "
            "for encoder-decoder models. The weights themselves need no norms: ask for them "
            "without norms (in the app: Values = attention weights)."
        )


def blocks_for_norms(lm: LoadedModel) -> list[OurBlock]:
    """Our module for every attention block of ``lm`` (its weights), whose ``W_O`` the
    ``transformers`` engine's value norms go through. The caller holds ``lm.lock``.

    Raises:
        UnsupportedModelError: our module cannot load this model's blocks.
    """
    check_norms_apply(lm)
    try:
        return our_blocks(lm)
    except UnsupportedModelError as e:
        raise UnsupportedModelError(
            f"Attention weighted by value norm reads each head's W_O through our module, which "
            f"cannot load this model ({e}). The weights themselves need no norms: ask for "
            f"them without norms (in the app: Values = attention weights)."
        ) from e


def norm_observers(blocks: list[OurBlock], out: dict[int, torch.Tensor]) -> dict[int, Observer]:
    """Per layer, an observer of our module that puts the layer's ``value_norms`` ``[B, H, S]``
    into ``out[layer]`` when it sees "per-head V" (and changes nothing)."""

    def observer(block: OurBlock) -> Observer:
        def observe(name: str, tensor: torch.Tensor) -> None:
            if name == "per-head V":
                out[block.layer] = value_norms(block.ours, tensor)

        return observe

    return {block.layer: observer(block) for block in blocks}


@contextmanager
def recording_value_norms(
    blocks: list[OurBlock], out: dict[int, torch.Tensor]
) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, every forward of the model's own attention blocks (``block.original``)
    puts its layer's ``value_norms`` ``[B, H, S]`` into ``out[layer]``: a forward hook reads
    the V the block computes itself (``Family.values``), or, for a family that does not say
    where, a pre-hook projects the hidden states the block receives with our module."""
    turns: dict[int, list[OurBlock]] = {}  # a block the model calls in several layers (ALBERT)
    for block in blocks:
        turns.setdefault(id(block.original), []).append(block)
    with hooked([_value_hook(group, out) for group in turns.values()]):
        yield out


def _value_hook(turns: list[OurBlock], out: dict[int, torch.Tensor]) -> Hook:
    """The hook that records the value norms of the layers of one of the model's blocks into
    ``out`` (``turns``: the layers that call it, in order; one for most models)."""
    block = turns[0]
    ours = block.ours
    calls = [0]

    def layer() -> int:
        calls[0] += 1
        return turns[(calls[0] - 1) % len(turns)].layer

    if block.family.values is not None:
        module, value_of = block.family.values(block.original)

        def hook(_module: torch.nn.Module, _args: Any, output: torch.Tensor) -> None:
            out[layer()] = value_norms(ours, _per_head(ours, value_of(output)))

        return after(module, hook)

    def pre_hook(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        out[layer()] = value_norms(ours, values_of(ours, hidden))

    return before(block.original, pre_hook, kwargs=True)


def stacked_norms(norms: dict[int, torch.Tensor], layers: int) -> torch.Tensor:
    """Every layer's recorded value norms ``[1, H, S]`` (batch 1) in one ``[L, H, S]``."""
    if sorted(norms) != list(range(layers)):
        raise RuntimeError(f"value norms were recorded for layers {sorted(norms)} of {layers}")
    return torch.stack([norms[i][0] for i in range(layers)])  # (L, H, S)


def weighted_by_norm(attention: np.ndarray, value_norms: np.ndarray) -> np.ndarray:
    """``alpha_ij * ||f_h(x_j)||``: the weights ``[L, H, T, S]`` times each key's value norm
    ``[L, H, S]``, float32. In numpy, after the move to the CPU: a fresh array of this size
    costs more to allocate in torch than to fill (page faults; numpy asks for huge pages)."""
    return np.multiply(attention, value_norms[:, :, None, :], dtype=np.float32)


def norms_as_attention(
    result: AttentionResult, *, rows_sum_to_one: bool = False
) -> AttentionResult:
    """The result with its ``norms`` in place of its attention weights, for views and statistics
    that read ``attention``.

    Args:
        result: a result computed with ``norms=True``.
        rows_sum_to_one: divide each query's row by its sum (rows of nothing stay 0), so that
            statistics defined on distributions (entropy, shares) apply to the norms.

    Raises:
        ValueError: the result has no norms.
    """
    if result.norms is None:
        raise ValueError("this result has no value norms: compute it with attend(norms=True)")
    values = result.norms
    if rows_sum_to_one:
        total = values.sum(axis=-1, keepdims=True)
        values = np.divide(values, total, out=np.zeros_like(values), where=total > 0)
    return dataclasses.replace(result, attention=values, norms=None)

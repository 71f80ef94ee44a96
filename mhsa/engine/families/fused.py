"""Fused QKV projections: how a family lays Q, K and V out in one weight, and back.

Each layout is a pair of functions on the first axis of a weight ``[rows, D]`` or a bias
``[rows]`` (or, moved there, the last axis of the projection's output):

- ``"per-head"``: each head's Q, K and V rows side by side, head after head
  (GPT-NeoX's ``query_key_value``, Falcon without multi-query: ``view(H, 3, Dh)``);
- ``"grouped"``: per key/value group, its query heads' rows, then its K, then its V (Falcon's
  ``new_decoder_architecture``: ``view(G, H / G + 2, Dh)``);
- ``"stacked"``: all of Q, then all of K, then all of V (GPT-2's ``c_attn``, Phi-3's
  ``qkv_proj``, Falcon's multi-query ``[H Dh; Dh; Dh]``).

Our module's own fused weight is ``"stacked"``. ``load_fused`` and ``store_fused`` move a
block's fused projection and its output projection into our module and back (GPT-NeoX, Falcon,
Phi-3, ModernBERT).
"""

from __future__ import annotations

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.record import bias_of, copy_linear

__all__ = [
    "LAYOUTS",
    "join_qkv",
    "load_fused",
    "split_linear_qkv",
    "split_qkv",
    "store_fused",
    "value_rows",
]

LAYOUTS = ("per-head", "grouped", "stacked")


def split_qkv(
    fused: torch.Tensor, layout: str, *, heads: int, kv_heads: int, d_head: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Q [H Dh, ...], K [G Dh, ...], V [G Dh, ...])`` rows of a fused ``[rows, ...]``.

    Raises:
        ValueError: an unknown layout, or rows that do not fit the heads.
    """
    rest = fused.shape[1:]
    want = (heads + 2 * kv_heads) * d_head
    if fused.shape[0] != want:
        raise ValueError(f"a fused QKV of {fused.shape[0]} rows, not {want}, for {layout!r}")
    if layout == "per-head":
        if heads != kv_heads:
            raise ValueError("the per-head fused layout has one K and V per query head")
        parts = fused.reshape(heads, 3, d_head, *rest).unbind(1)  # 3 x (H, Dh, ...)
        return tuple(p.reshape(heads * d_head, *rest) for p in parts)  # type: ignore[return-value]
    if layout == "grouped":
        per = heads // kv_heads
        grid = fused.reshape(kv_heads, per + 2, d_head, *rest)  # (G, H/G + 2, Dh, ...)
        q = grid[:, :per].reshape(heads * d_head, *rest)
        return q, grid[:, per].reshape(-1, *rest), grid[:, per + 1].reshape(-1, *rest)
    if layout == "stacked":
        q, k, v = fused.split([heads * d_head, kv_heads * d_head, kv_heads * d_head])
        return q, k, v
    raise ValueError(f"unknown fused QKV layout {layout!r}: one of {', '.join(LAYOUTS)}")


def split_linear_qkv(
    linear: torch.nn.Module, layout: str, *, heads: int, kv_heads: int, d_head: int
) -> tuple[torch.Tensor, ...]:
    """``(w_q, w_k, w_v, b_q, b_k, b_v)`` of a fused ``nn.Linear``-layout projection, detached
    (the biases None when it has none): ``split_qkv`` of its weight and of its bias.

    Raises:
        ValueError: as ``split_qkv``.
    """
    sizes = {"heads": heads, "kv_heads": kv_heads, "d_head": d_head}
    weights = split_qkv(linear.weight.detach(), layout, **sizes)
    if linear.bias is None:
        return (*weights, None, None, None)
    return (*weights, *split_qkv(linear.bias.detach(), layout, **sizes))


def join_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str, *, heads: int, kv_heads: int
) -> torch.Tensor:
    """The fused rows of ``layout`` from Q ``[H Dh, ...]``, K and V ``[G Dh, ...]``: the
    inverse of ``split_qkv``."""
    rest = q.shape[1:]
    d_head = q.shape[0] // heads
    if layout == "per-head":
        parts = [t.reshape(heads, 1, d_head, *rest) for t in (q, k, v)]
        return torch.cat(parts, dim=1).reshape(-1, *rest)
    if layout == "grouped":
        per = heads // kv_heads
        grid = [
            q.reshape(kv_heads, per, d_head, *rest),
            k.reshape(kv_heads, 1, d_head, *rest),
            v.reshape(kv_heads, 1, d_head, *rest),
        ]
        return torch.cat(grid, dim=1).reshape(-1, *rest)
    if layout == "stacked":
        return torch.cat([q, k, v])
    raise ValueError(f"unknown fused QKV layout {layout!r}: one of {', '.join(LAYOUTS)}")


def value_rows(
    output: torch.Tensor, layout: str, *, heads: int, kv_heads: int, d_head: int
) -> torch.Tensor:
    """V ``[..., G Dh]`` from the fused projection's output ``[..., rows]``."""
    moved = output.movedim(-1, 0)
    return split_qkv(moved, layout, heads=heads, kv_heads=kv_heads, d_head=d_head)[2].movedim(0, -1)


def load_fused(
    fused: nn.Module,
    out: nn.Module,
    layout: str,
    *,
    heads: int,
    kv_heads: int,
    d_head: int,
    **options: object,
) -> MultiHeadSelfAttention:
    """Our module from a block's fused QKV projection (``nn.Linear`` layout, its rows in
    ``layout``) and its output projection ``out``, with their biases where they have them.

    Args:
        fused, out: the block's projections.
        layout, heads, kv_heads, d_head: as for ``split_qkv``.
        **options: ``MultiHeadSelfAttention.from_projections``'s (``scale``, ``rotary``,
            ``sliding_window``...).

    Raises:
        ValueError: as ``split_qkv``.
    """
    w_q, w_k, w_v, b_q, b_k, b_v = split_linear_qkv(
        fused, layout, heads=heads, kv_heads=kv_heads, d_head=d_head
    )
    return MultiHeadSelfAttention.from_projections(
        w_q,
        w_k,
        w_v,
        out.weight.detach(),
        b_q,
        b_k,
        b_v,
        bias_of(out),
        num_heads=heads,
        num_kv_heads=kv_heads,
        **options,
    )


def store_fused(
    ours: MultiHeadSelfAttention, fused: nn.Module, out: nn.Module, layout: str
) -> None:
    """Our module's weights into a block's fused QKV projection (rows in ``layout``) and its
    output projection, in place: the inverse of ``load_fused``.

    Raises:
        ValueError: one side has a bias and the other not (``copy_linear``).
    """
    (w_q, w_k, w_v, w_o), (b_q, b_k, b_v, b_o) = ours.projections()
    counts = {"heads": ours.num_heads, "kv_heads": ours.num_kv_heads}
    fused_bias = None if b_q is None else join_qkv(b_q, b_k, b_v, layout, **counts)
    copy_linear(fused, join_qkv(w_q, w_k, w_v, layout, **counts), fused_bias)
    copy_linear(out, w_o, b_o)

"""Rotary position embeddings (RoPE, Su et al. 2021, "RoFormer"): ``RotaryEmbedding``, the
frequencies and the rotation our ``MultiHeadSelfAttention`` applies to queries and keys
(``mhsa.engine.attention.module`` re-exports it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

import torch
from torch import nn

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings (RoPE, Su et al. 2021).

    The first ``rot_dim = 2 * len(inv_freq)`` features of each head are rotated; the rest pass
    unchanged (partial rotary: GPT-NeoX's ``rotary_pct``, Phi's ``partial_rotary_factor``,
    GPT-J's ``rotary_dim``). By default (the Llama / GPT-NeoX convention) feature ``i`` is paired
    with ``i + rot_dim / 2`` (``rotate_half``); with ``interleaved=True`` (GPT-J, the original
    paper) feature ``2i`` with ``2i + 1`` (``rotate_every_two``), pair ``i`` at frequency
    ``inv_freq[i]`` either way. ``attention_scaling`` multiplies cos and sin (the YaRN /
    LongRoPE convention, 1 otherwise). ``inv_freq`` carries any static rope scaling (linear,
    llama3, yarn...), exactly as the model computed it.
    """

    def __init__(
        self, inv_freq: torch.Tensor, attention_scaling: float = 1.0, *, interleaved: bool = False
    ) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.detach().float().clone(), persistent=False)
        self.attention_scaling = float(attention_scaling)
        self.interleaved = bool(interleaved)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Self:
        """Moves with the module but stays float32: ``module.to(torch.float16)`` must not round
        the frequencies, or the angle ``p * theta`` drifts by ``p * theta * u`` with position."""
        exact = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = exact.to(fn(exact).device)
        return self

    @classmethod
    def default(
        cls, d_head: int, base: float = 10000.0, *, rot_dim: int | None = None, **options: bool
    ) -> RotaryEmbedding:
        """The original RoPE frequencies, ``base ** (-2i / rot_dim)`` over the first ``rot_dim``
        features (``d_head`` by default; fewer: partial rotary); ``options``: ``interleaved``."""
        dim = d_head if rot_dim is None else rot_dim
        return cls(1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), **options)

    @property
    def rot_dim(self) -> int:
        return 2 * self.inv_freq.numel()

    def extra_repr(self) -> str:
        pairs = ", interleaved=True" if self.interleaved else ""
        return f"rot_dim={self.rot_dim}, attention_scaling={self.attention_scaling}{pairs}"

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and sin ``[B|1, T, rot_dim]`` for positions ``[T]`` or ``[B, T]`` (float32 maths):
        each pair's angle at both of its features."""
        if positions.dim() == 1:
            positions = positions[None]
        freqs = positions[..., None].float() * self.inv_freq.float()  # (B, T, rot_dim / 2)
        if self.interleaved:
            emb = freqs.repeat_interleave(2, dim=-1)  # (B, T, rot_dim): f0 f0 f1 f1 ...
        else:
            emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, rot_dim): f0 f1 ... f0 f1 ...
        return (
            (emb.cos() * self.attention_scaling).to(dtype),
            (emb.sin() * self.attention_scaling).to(dtype),
        )

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[B, heads, T, Dh]`` by the angles of ``cos``/``sin``."""
        r = self.rot_dim
        rot, rest = x[..., :r], x[..., r:]
        if self.interleaved:
            even, odd = rot[..., 0::2], rot[..., 1::2]
            rotated = torch.stack((-odd, even), dim=-1).flatten(-2)  # rotate_every_two
        else:
            half1, half2 = rot[..., : r // 2], rot[..., r // 2 :]
            rotated = torch.cat((-half2, half1), dim=-1)  # rotate_half
        out = rot * cos[:, None] + rotated * sin[:, None]
        return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)

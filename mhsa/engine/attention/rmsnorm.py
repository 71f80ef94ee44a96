"""RMSNorm of queries and keys (q/k normalisation), as our module applies it to Q and K once split
into heads, before rotary positions: per head (Qwen3, Gemma 3) or over the whole projection
(OLMo 2).

``x / sqrt(mean(x^2) + eps) * w`` (Zhang & Sennrich 2019), or ``* (1 + w)`` with Gemma's unit
offset; computed in float32 and multiplied by the weight before rounding back, as transformers'
Gemma and OLMo 2 norms do (Qwen3 rounds before the weight: the same bits in float32).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """Root-mean-square normalisation of Q or K ``[B, T, n Dh]`` (``n`` heads of ``Dh``).

    Attributes:
        weight: ``[Dh]`` (per head) or ``[n Dh]`` (over the whole projection).
        eps: added to the mean square.
        unit_offset: multiply by ``1 + weight`` (Gemma's norms) instead of ``weight``.
        per_head: normalise each head's ``Dh`` features apart (else all ``n Dh`` together).
    """

    def __init__(
        self, weight: torch.Tensor, eps: float, *, unit_offset: bool = False, per_head: bool
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.eps = float(eps)
        self.unit_offset = unit_offset
        self.per_head = per_head

    def extra_repr(self) -> str:
        kind = "per head" if self.per_head else "whole projection"
        offset = ", 1 + weight" if self.unit_offset else ""
        return f"{self.weight.numel()}, eps={self.eps}, {kind}{offset}"

    def identity_copy(self) -> RMSNorm:
        """A norm of the same kind whose weight scales nothing (0 with a unit offset, else 1),
        on the same device and dtype."""
        weight = torch.full_like(self.weight, 0.0 if self.unit_offset else 1.0)
        return RMSNorm(weight, self.eps, unit_offset=self.unit_offset, per_head=self.per_head)

    def per_head_layout(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[B, n, T, Dh]`` (split into heads) normalised, of the same shape: per head
        directly, over the whole projection through ``[B, T, n Dh]``."""
        if self.per_head:
            return self(x)
        b, n, t, dh = x.shape
        whole = x.transpose(1, 2).reshape(b, t, n * dh)  # (B, T, n Dh)
        return self(whole).view(b, t, n, dh).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[B, T, n Dh]`` normalised, of the same shape and dtype."""
        width = self.weight.numel()
        shape = x.shape
        grouped = x.view(*shape[:-1], shape[-1] // width, width) if self.per_head else x
        normed = grouped.float()
        normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + self.eps)
        scale = self.weight.float() + 1.0 if self.unit_offset else self.weight.float()
        return (normed * scale).to(x.dtype).view(shape)

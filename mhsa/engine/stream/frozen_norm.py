"""A norm with its scale frozen at the vector it normalised, which makes it linear
(TransformerLens's ``apply_ln_to_stack``): how direct logit attribution and information flow
pass each part of the residual stream through the final norm, and through a norm after the
attention output (Gemma 2/3, OLMo 2), which the stream recorder finds in its pass
(``mhsa.engine.stream.recorder.NORMED_POINTS``). LayerNorm, RMSNorm ``x / rms(x) * w`` and
Gemma's ``x / rms(x) * (1 + w)`` are recognised by reproducing the norm's own output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mhsa.errors import UnsupportedModelError

__all__ = ["FrozenNorm", "frozen_final_norm", "frozen_norm"]


@dataclass(frozen=True, eq=False)
class FrozenNorm:
    """A norm with its scale frozen at the whole vector it normalised: linear.

    Attributes:
        kind: ``"LayerNorm"`` (centred) or ``"RMSNorm"`` (not centred).
        inverse_scale: 1 / the whole vector's standard deviation (LayerNorm) or root mean
            square (RMSNorm), eps included as the model computes it: a float for one vector,
            ``[..., 1]`` for one per position.
        weight: the norm's effective weight ``[D]`` (Gemma's ``1 + w`` included).
        bias: the norm's bias ``[D]`` (LayerNorm), or None.
    """

    kind: str
    inverse_scale: float | torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, parts: torch.Tensor) -> torch.Tensor:
        """``parts [..., D]`` through the frozen norm, its bias left out (a part of its own)."""
        if self.kind == "LayerNorm":
            parts = parts - parts.mean(-1, keepdim=True)
        return parts * self.inverse_scale * self.weight

    def at(self, position: int | slice) -> FrozenNorm:
        """The norm frozen at one position (or rows) of a per-position frozen norm."""
        if not isinstance(self.inverse_scale, torch.Tensor):
            return self
        return FrozenNorm(self.kind, self.inverse_scale[position], self.weight, self.bias)


def frozen_norm(norm: nn.Module, whole: torch.Tensor) -> FrozenNorm:
    """``norm`` with its scale frozen at ``whole [..., D]``, one scale per vector
    (TransformerLens's ``apply_ln_to_stack``): a LayerNorm, an RMSNorm ``x / rms(x) * w`` or
    Gemma's ``x / rms(x) * (1 + w)``, recognised by reproducing ``norm(whole)``.

    Raises:
        UnsupportedModelError: the norm computes something else.
    """
    whole = whole.float()
    weight = norm.weight.float()
    if isinstance(norm, nn.LayerNorm):
        variance = whole.var(-1, unbiased=False, keepdim=True)
        bias = None if norm.bias is None else norm.bias.float()
        candidates = [FrozenNorm("LayerNorm", torch.rsqrt(variance + norm.eps), weight, bias)]
    else:
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        if eps is None:
            raise UnsupportedModelError(f"norm {type(norm).__name__}: no eps found")
        inverse = torch.rsqrt(whole.pow(2).mean(-1, keepdim=True) + eps)
        candidates = [FrozenNorm("RMSNorm", inverse, w, None) for w in (weight, 1.0 + weight)]
    theirs = norm(whole.to(norm.weight.dtype)).float()
    for frozen in candidates:
        rebuilt = frozen(whole) + (0 if frozen.bias is None else frozen.bias)
        if torch.allclose(rebuilt, theirs, atol=1e-4 * float(theirs.abs().max()) + 1e-5):
            return frozen
    raise UnsupportedModelError(
        f"the norm {type(norm).__name__} computes something other than a LayerNorm or an "
        "RMSNorm (x / rms(x) * w, or Gemma's * (1 + w)): direct logit attribution does not "
        "cover it."
    )


def frozen_final_norm(norm: nn.Module, whole: torch.Tensor) -> FrozenNorm:
    """``norm`` with its scale frozen at ``whole [D]`` (``frozen_norm`` of one vector; the
    scale a float).

    Raises:
        UnsupportedModelError: the norm is neither a LayerNorm nor an RMSNorm (``w`` or
            Gemma's ``1 + w``) that this reconstruction reproduces on ``whole``.
    """
    frozen = frozen_norm(norm, whole.reshape(1, -1))
    return FrozenNorm(frozen.kind, float(frozen.inverse_scale), frozen.weight, frozen.bias)

"""What the families' loaders share beside ``record``'s projections in and out of ``nn.Linear``
layout (``bias_of``, ``copy_linear``): the model's rotary embedding for a block (per layer type
where the model has several), its sliding window and its q/k norms as ours."""

from __future__ import annotations

import torch
from torch import nn

from mhsa.engine.attention.module import RMSNorm, RotaryEmbedding

__all__ = [
    "check_flags",
    "our_rms_norm",
    "rotary_for",
    "window_of",
]


def check_flags(config: object, flags: tuple[str, ...]) -> None:
    """Refuse config flags our module does not reproduce, naming the flag.

    Args:
        config: the block's config.
        flags: names of flags that must be off (absent, None, False or 0).

    Raises:
        ValueError: ``"the config's <flag>=<value> is not reproduced by our module"``.
    """
    for flag in flags:
        value = getattr(config, flag, None)
        if value:
            raise ValueError(f"the config's {flag}={value!r} is not reproduced by our module")


def _layer_type(block: nn.Module) -> str | None:
    """The block's layer type ("full_attention", "sliding_attention"), where the model has
    layer types."""
    kind = getattr(block, "layer_type", None)
    if kind is not None:
        return kind
    types = getattr(getattr(block, "config", None), "layer_types", None)
    index = getattr(block, "layer_idx", None)
    return None if types is None or index is None else types[index]


def rotary_for(block: nn.Module, model: nn.Module) -> RotaryEmbedding:
    """The model's rotary embedding for ``block`` as ours: its ``inv_freq`` and
    ``attention_scaling``, or those of the block's layer type where the model keeps one set per
    type (Gemma 3, ModernBERT: ``{layer_type}_inv_freq``).

    Raises:
        ValueError: no rotary embedding, or rope that changes with the sequence length.
    """
    kind = _layer_type(block)
    for module in model.modules():
        if "rotary" not in type(module).__name__.lower():
            continue
        prefix = f"{kind}_" if hasattr(module, f"{kind}_inv_freq") else ""
        inv_freq = getattr(module, f"{prefix}inv_freq", None)
        if inv_freq is None:
            continue
        rope_type = getattr(module, "rope_type", "default")
        if isinstance(rope_type, dict):
            rope_type = rope_type.get(kind, "default")
        if rope_type in ("dynamic", "longrope"):
            raise ValueError(
                f"rope type {rope_type!r} changes its frequencies with the sequence length; "
                "our module loads static rope (default, linear, llama3, yarn)"
            )
        scaling = getattr(module, f"{prefix}attention_scaling", 1.0)
        return RotaryEmbedding(inv_freq, scaling).to(inv_freq.device)
    raise ValueError("no rotary embedding with inv_freq found in the model")


def window_of(block: nn.Module) -> int | None:
    """The block's sliding window as ``attention_core`` counts it (``|i - j| < window``): the
    block's own ``sliding_window`` where it keeps one (None on its full-attention layers:
    Qwen2/3, Gemma 2/3, ModernBERT), else its config's (Mistral, Phi-3: every layer) unless
    the config says it does not use it (``use_sliding_window=False``)."""
    config = getattr(block, "config", None)
    if hasattr(block, "sliding_window"):
        window = block.sliding_window
    elif getattr(config, "use_sliding_window", True) is False:
        window = None  # a window in the config that the model does not use (Qwen2-MoE)
    else:
        window = getattr(config, "sliding_window", None)
    return None if window is None else int(window)


def our_rms_norm(norm: nn.Module, *, per_head: bool) -> RMSNorm:
    """The block's q or k norm as our ``RMSNorm``, recognised by what it computes: on a random
    input it must equal ``x / rms(x) * w`` or Gemma's ``x / rms(x) * (1 + w)``.

    Raises:
        ValueError: neither (a LayerNorm, a norm without eps...).
    """
    weight = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if weight is None or eps is None:
        raise ValueError(f"the q/k norm {type(norm).__name__} is not an RMSNorm with a weight")
    width = weight.numel()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, width, generator=gen).to(weight.device, weight.dtype)
    with torch.no_grad():
        theirs = norm(x).float()
        for unit_offset in (False, True):
            ours = RMSNorm(weight.detach(), eps, unit_offset=unit_offset, per_head=per_head)
            tol = 1e-5 if weight.dtype == torch.float32 else 1e-2
            if torch.allclose(ours.to(weight.device)(x).float(), theirs, atol=tol, rtol=tol):
                return ours.to(weight.device)
    raise ValueError(
        f"the q/k norm {type(norm).__name__} computes something other than an RMSNorm "
        "(x / rms(x) * w, or * (1 + w))"
    )

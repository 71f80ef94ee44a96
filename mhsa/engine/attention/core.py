"""The attention core: the one place where attention is computed, with its observation points
and its backends.

Shapes use B = batch, T = query length, S = key length, H = query heads, G = key/value heads
(grouped-query attention: each key/value head serves H / G query heads), D = d_model,
Dh = d_head.

Everything goes through one function, ``attention_core``: scores, scale, mask, softmax, context,
head gates. It has named observation points (in the spirit of TransformerLens hook points): an
``observe(name, tensor)`` callable sees each intermediate and may return a replacement. The
teaching trace, the weights-only path and the engine all read from it.

How it computes is a backend picked once per call by name (``ATTENTION_BACKENDS``, as
transformers picks an attention implementation): the eager steps written out in order, the same
steps in one reused buffer for inference, or torch's fused kernel when nobody needs the weights.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mhsa.deprecation import renamed_kwargs

__all__ = [
    "ATTENTION_BACKENDS",
    "OBSERVATION_POINTS",
    "Observer",
    "Recorder",
    "TraceStep",
    "attention_backend",
    "attention_core",
    "combine_masks",
    "nobody",
    "observed",
    "scaled_dot_product_attention",
]

#: ``observe(name, tensor) -> tensor or None``: sees an intermediate; a returned tensor replaces it.
Observer = Callable[[str, torch.Tensor], torch.Tensor | None]

#: Every observation point, in the order the forward pass reaches them, with its formula.
#: "rotated Q"/"rotated K" exist only with rotary positions, "normed Q"/"normed K" only with q/k
#: normalisation, "capped scores" only with soft-capping, "gated context" only with head gates.
OBSERVATION_POINTS: dict[str, str] = {
    "X": "X (the layer's input)",
    "Q": "Q = X W_Q + b_Q",
    "K": "K = X W_K + b_K",
    "V": "V = X W_V + b_V",
    "per-head Q": "Q_h: reshape to [batch, heads, length, d_head]",
    "per-head K": "K_g: reshape to [batch, kv heads, length, d_head]",
    "per-head V": "V_g: reshape to [batch, kv heads, length, d_head]",
    "normed Q": "RMSNorm(Q): per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2)",
    "normed K": "RMSNorm(K): per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2)",
    "rotated Q": "RoPE(Q_h) = Q_h cos(p θ) + rotate_half(Q_h) sin(p θ)   (on the first rot_dim "
    "features: partial rotary; GPT-J pairs neighbours: rotate_every_two)",
    "rotated K": "RoPE(K_g) = K_g cos(p θ) + rotate_half(K_g) sin(p θ)   (likewise)",
    "raw scores": "Q_h K_g(h)^T   (query head h reads key/value head g(h))",
    "scaled scores": "Q_h K_g(h)^T * scale   (scale = 1 / sqrt(d_head) by default)",
    "capped scores": "c * tanh(scaled scores / c)   (attention-logit soft-capping, Gemma 2)",
    "masked scores": "scores + mask   (-inf where attention is not allowed: padding, later "
    "positions, keys outside a sliding window)",
    "probabilities": "A_h = softmax(masked scores) over keys",
    "per-head context": "A_h V_g(h)",
    "gated context": "gate_h * A_h V_g(h)   (head gates; 0 switches a head off)",
    "concatenated heads": "Concat(head_1, ..., head_H)",
    "output": "Concat(...) W_O + b_O",
}


@dataclass(frozen=True)
class TraceStep:
    """One named intermediate of the attention computation, for teaching.

    Attributes:
        name: the observation point ("Q", "raw scores", ...).
        formula: the step written as a formula (plain text, LaTeX-free).
        tensor: the value, detached.
    """

    name: str
    formula: str
    tensor: torch.Tensor


class Recorder:
    """An observer that keeps a detached copy of every intermediate it sees, in order."""

    def __init__(self) -> None:
        self.steps: list[TraceStep] = []

    def __call__(self, name: str, tensor: torch.Tensor) -> None:
        formula = OBSERVATION_POINTS.get(name, name)
        self.steps.append(TraceStep(name, formula, tensor.detach().clone()))


@renamed_kwargs(attn_mask="mask", attention_mask="padding_mask")
def combine_masks(
    mask: torch.Tensor | None,
    padding_mask: torch.Tensor | None,
    *,
    is_causal: bool,
    q_len: int,
    k_len: int,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Fold the three ways of masking into one mask broadcastable to ``[B, H, T, S]``.

    Args:
        mask: boolean ``[T, S]`` or ``[B, H|1, T, S]`` (True = may attend), or a float mask
            added to the scores.
        padding_mask: ``[B, S]``, 1 = real token, 0 = padding (a tokenizer's
            ``attention_mask``).
        is_causal: forbid attention to later positions. When T < S the queries are the last T
            positions (query i may see keys up to S - T + i), as with a cache of earlier keys.
        q_len: T.
        k_len: S.
        device: where the mask lives.
        dtype: the float dtype of the scores (for float masks).

    Returns:
        None when nothing is masked; a boolean mask when every part is boolean; otherwise a float
        mask with ``-inf`` where attention is forbidden.
    """
    allowed: torch.Tensor | None = None  # boolean, True = may attend
    if is_causal:
        allowed = _causal(q_len, k_len, device)
    if padding_mask is not None:
        padding = _padding_allowed(padding_mask, k_len, device)  # (B, 1, 1, S)
        allowed = padding if allowed is None else allowed & padding
    if mask is None:
        return allowed
    if mask.dim() not in (2, 4) or mask.shape[-2:] != (q_len, k_len):
        raise ValueError(
            f"mask must have shape [{q_len}, {k_len}] or [batch, heads, {q_len}, {k_len}], "
            f"got {list(mask.shape)}"
        )
    mask = mask.to(device)
    if mask.dtype == torch.bool:
        return mask if allowed is None else mask & allowed
    mask = mask.to(dtype)
    if allowed is None:
        return mask
    return mask.masked_fill(~allowed, float("-inf"))


def _padding_allowed(padding_mask: torch.Tensor, k_len: int, device: torch.device) -> torch.Tensor:
    """``[B, S]`` (1 = token) -> boolean ``[B, 1, 1, S]``, True where a key may be attended."""
    if padding_mask.dim() != 2 or padding_mask.shape[-1] != k_len:
        raise ValueError(
            f"padding_mask must have shape [batch, {k_len}] (1 = token, 0 = padding), "
            f"got {list(padding_mask.shape)}"
        )
    return padding_mask.to(device=device).bool()[:, None, None, :]


def _with_causal(mask: torch.Tensor | None, t: int, s: int, device: torch.device) -> torch.Tensor:
    """``mask`` and a causal mask in one (boolean stays boolean, float gets ``-inf``)."""
    allowed = _causal(t, s, device)
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def _with_window(
    mask: torch.Tensor | None, t: int, s: int, window: int, device: torch.device
) -> torch.Tensor:
    """``mask`` and a sliding-window (band) mask in one (boolean stays boolean, float gets
    ``-inf``)."""
    allowed = _band(t, s, window, device)
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def _band(t: int, s: int, window: int, device: torch.device) -> torch.Tensor:
    """``[T, S]``, True where query i (the last T of S positions) is less than ``window``
    positions from key j: ``|i - j| < window`` (transformers' causal ``kv > q - window``, and
    ModernBERT's local ``|q - kv| <= window - 1``)."""
    queries = torch.arange(s - t, s, device=device)[:, None]
    keys = torch.arange(s, device=device)[None, :]
    return (queries - keys).abs() < window


def _causal(t: int, s: int, device: torch.device) -> torch.Tensor:
    """``[T, S]``, True where query i (the last T of S positions) may see key j."""
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(s - t)


# ---------------------------------------------------------------------------------------------
# The attention core
# ---------------------------------------------------------------------------------------------


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, G, S, Dh]`` -> ``[B, G * groups, S, Dh]``: each key/value head serves ``groups``
    consecutive query heads (the Llama convention)."""
    if groups == 1:
        return x
    b, g, s, dh = x.shape
    return x[:, :, None].expand(b, g, groups, s, dh).reshape(b, g * groups, s, dh)


def nobody(_name: str, _tensor: torch.Tensor) -> None:
    """The observer when nobody observes: sees everything, replaces nothing."""
    return None


def observed(observe: Observer, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` after ``observe`` saw it: the observer's replacement, if it returned one."""
    replaced = observe(name, tensor)
    return tensor if replaced is None else replaced


def _gate(context: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """Multiply each head's context ``[B, H, T, Dh]`` by its gate (``[H]`` or ``[B, H]``)."""
    b, h = context.shape[:2]
    if gates.dim() == 1:
        gates = gates[None]
    if gates.dim() != 2 or gates.shape[-1] != h or gates.shape[0] not in (1, b):
        raise ValueError(f"head_gates must have shape [{h}] or [{b}, {h}], got {list(gates.shape)}")
    return context * gates.to(context.dtype)[:, :, None, None]


class _Steps:
    """The arithmetic of the eager steps, each making a new tensor: autograd can differentiate
    every one of them, whatever the mask."""

    def scores(
        self, query: torch.Tensor, key_t: torch.Tensor, out: torch.Tensor | None
    ) -> torch.Tensor:
        """Q K^T per head (``out``: a weights buffer the in-place steps may compute into)."""
        return torch.matmul(query, key_t)  # (B, H, T, S)

    def scale(self, scores: torch.Tensor, scale: float) -> torch.Tensor:
        return scores * scale

    def softcap(self, scores: torch.Tensor, cap: float) -> torch.Tensor:
        """``cap * tanh(scores / cap)``, in transformers' (Gemma 2's) order of operations."""
        return torch.tanh(scores / cap) * cap

    def mask(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Boolean mask (True = may attend) -> ``-inf`` elsewhere; float mask -> added."""
        if mask.dtype == torch.bool:
            return scores.masked_fill(~mask, float("-inf"))
        return scores + mask

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """Softmax over keys; 16-bit scores get their exp and sum in float32."""
        upcast = torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else None
        return torch.softmax(scores, dim=-1, dtype=upcast).to(scores.dtype)

    def empty_rows_to_zero(self, weights: torch.Tensor) -> torch.Tensor:
        """A query with nothing to attend to has 0 / 0 weights: 0 instead of NaN."""
        return torch.where(weights.isnan(), 0, weights)


def _fits(small: torch.Size, shape: torch.Size) -> bool:
    """Whether ``small`` broadcasts to ``shape`` without changing it (``torch.broadcast_shapes``
    in plain Python: its reference implementation costs more than a small model's step)."""
    return len(small) <= len(shape) and all(
        m in (1, s) for m, s in zip(reversed(small), reversed(shape), strict=False)
    )


class _InPlaceSteps(_Steps):
    """The same arithmetic (bit for bit) in one buffer reused from step to step, for inference:
    on the CPU a fresh ``[B, H, T, S]`` buffer per step costs more than the step itself (page
    faults). The scores are computed straight into the caller's weights buffer when it fits."""

    def scores(
        self, query: torch.Tensor, key_t: torch.Tensor, out: torch.Tensor | None
    ) -> torch.Tensor:
        b, h, t, dh = query.shape
        s = key_t.shape[-1]
        if out is None or out.shape != (b, h, t, s) or out.dtype != query.dtype:
            return torch.matmul(query, key_t)  # (B, H, T, S)
        if not out.is_contiguous():
            return torch.matmul(query, key_t)
        torch.bmm(query.reshape(b * h, t, dh), key_t.reshape(b * h, dh, s), out=out.view(-1, t, s))
        return out

    def scale(self, scores: torch.Tensor, scale: float) -> torch.Tensor:
        return scores.mul_(scale)

    def softcap(self, scores: torch.Tensor, cap: float) -> torch.Tensor:
        return scores.div_(cap).tanh_().mul_(cap)

    def mask(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if mask.dtype == torch.bool:
            return scores.masked_fill_(~mask, float("-inf"))
        if _fits(mask.shape, scores.shape):
            return scores.add_(mask)
        return scores + mask

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        if scores.dtype != torch.float32:
            return super().softmax(scores)
        return torch.ops.aten._softmax.out(scores, -1, False, out=scores)

    def empty_rows_to_zero(self, weights: torch.Tensor) -> torch.Tensor:
        return weights.nan_to_num_(0.0)


def _eager(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    mask: torch.Tensor | None,
    *,
    is_causal: bool,
    scale: float,
    dropout_p: float,
    head_gates: torch.Tensor | None,
    observe: Observer,
    weights_out: torch.Tensor | None,
    steps: _Steps,
    softcap: float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Attention written out step by step, each step observed: the one copy of the maths."""
    groups = query.shape[1] // key.shape[1]
    if is_causal:
        mask = _with_causal(mask, query.shape[2], key.shape[2], query.device)
    # bmm on head-major contiguous operands: no hidden copies inside the two matmuls
    query = query.contiguous()
    key_t = _repeat_kv(key.contiguous(), groups).transpose(-2, -1)  # (B, H, Dh, S)
    scores = steps.scores(query, key_t, weights_out)  # (B, H, T, S)
    scores = observed(observe, "raw scores", scores)
    scores = steps.scale(scores, scale)
    scores = observed(observe, "scaled scores", scores)
    if softcap is not None:
        scores = observed(observe, "capped scores", steps.softcap(scores, softcap))
    if mask is not None:
        scores = steps.mask(scores, mask)
    scores = observed(observe, "masked scores", scores)
    weights = steps.softmax(scores)  # (B, H, T, S)
    if mask is not None:
        weights = steps.empty_rows_to_zero(weights)
    if weights_out is not None and weights is not weights_out:
        weights = weights_out.copy_(weights)
    weights = observed(observe, "probabilities", weights)
    if value is None:
        return None, weights
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    context = torch.matmul(weights, _repeat_kv(value.contiguous(), groups))  # (B, H, T, Dh)
    context = observed(observe, "per-head context", context)
    if head_gates is not None:
        context = _gate(context, head_gates)
        context = observed(observe, "gated context", context)
    return context, weights


def _sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    mask: torch.Tensor | None,
    *,
    is_causal: bool,
    scale: float,
    dropout_p: float,
    head_gates: torch.Tensor | None,
    softcap: float | None = None,
    **_unobserved: object,
) -> tuple[torch.Tensor, None]:
    """The same maths through torch's fused kernel, for when nobody needs the weights (nothing
    to observe, no weights buffer, no soft-capping: ``attention_backend`` picks it only then)."""
    assert value is not None and softcap is None  # as attention_backend picks this backend
    t, s = query.shape[2], key.shape[2]
    if is_causal and (mask is not None or t != s):
        mask = _with_causal(mask, t, s, query.device)
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    context = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout_p,
        is_causal=is_causal and mask is None,  # the kernel masks without building a mask
        scale=scale,
    )  # (B, H, T, Dh)
    if mask is not None and context.device.type != "cpu":
        # some GPU kernels give NaN for rows with nothing to attend to: 0, as everywhere else
        context = torch.where(torch.isnan(context), 0.0, context)
    return (context if head_gates is None else _gate(context, head_gates)), None


#: The ways ``attention_core`` can compute, by name (``attention_backend`` picks one per call):
#: "eager" is the readable sequence, "eager-inplace" the same arithmetic in one reused buffer
#: (no autograd), "sdpa" torch's fused kernel (no weights, no observation points).
ATTENTION_BACKENDS: dict[str, Callable[..., tuple[torch.Tensor | None, torch.Tensor | None]]] = {
    "eager": functools.partial(_eager, steps=_Steps()),
    "eager-inplace": functools.partial(_eager, steps=_InPlaceSteps()),
    "sdpa": _sdpa,
}


def attention_backend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    *,
    need_weights: bool,
    observed: bool,
    weights_out: torch.Tensor | None,
    softcap: float | None = None,
) -> str:
    """The name of the backend ``attention_core`` runs for these arguments.

    The fused kernel when nothing but the context is wanted (and the scores are not
    soft-capped, which the kernel cannot do); else the eager steps, in place when no gradient
    can flow back through the scores.
    """
    fused = not need_weights and not observed and weights_out is None and softcap is None
    if fused and value is not None:
        return "sdpa"
    differentiated = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad)
    return "eager" if differentiated else "eager-inplace"


def attention_core(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor | None,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    head_gates: torch.Tensor | None = None,
    need_weights: bool = True,
    observe: Observer | None = None,
    weights_out: torch.Tensor | None = None,
    softcap: float | None = None,
    sliding_window: int | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """softmax(Q K^T * scale + mask) V per head: the one place where attention is computed.

    Args:
        query: ``[B, H, T, Dh]``.
        key: ``[B, G, S, Dh]``, G divides H (G = H: ordinary multi-head attention).
        value: ``[B, G, S, Dh]``; None computes the weights only.
        mask: boolean (True = may attend) or float additive mask broadcastable to ``[B, H, T, S]``.
        is_causal: also forbid attention to later positions (the T queries are the last T of
            the S positions).
        scale: score scale, ``1 / sqrt(Dh)`` by default.
        dropout_p: dropout on the weights (pass 0 outside training).
        head_gates: ``[H]`` or ``[B, H]``, multiplies each head's context (0 removes the head).
        need_weights: compute the weights explicitly; without them (and with no observer and no
            ``weights_out``) the fused ``torch.nn.functional.scaled_dot_product_attention`` runs.
        observe: sees "raw scores", "scaled scores", "masked scores", "probabilities",
            "per-head context" and "gated context"; a returned tensor replaces the value.
            Observing changes no bit of the result.
        weights_out: a preallocated tensor to receive the weights (no gradient).
        softcap: attention-logit soft-capping: the scaled scores become
            ``softcap * tanh(scores / softcap)`` before the mask (Gemma 2's
            ``attn_logit_softcapping``; observed as "capped scores").
        sliding_window: a query attends only to keys less than this many positions away,
            ``|i - j| < sliding_window`` (a band mask, added to ``mask``: Mistral's and Gemma's
            causal ``kv > q - window``, ModernBERT's local ``|q - kv| <= window // 2`` with
            ``sliding_window = window // 2 + 1``); None: no window.

    Returns:
        ``(context [B, H, T, Dh] or None, weights [B, H, T, S] or None)``. A query row with
        nothing to attend to gets all-zero weights and a zero context, never NaN. 16-bit inputs
        get their softmax in float32; weights come back in the input dtype.
    """
    h, g = query.shape[1], key.shape[1]
    if h % g:
        raise ValueError(f"{h} query heads cannot share {g} key/value heads: {g} must divide {h}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive, got {softcap}")
    if sliding_window is not None:
        if sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1, got {sliding_window}")
        t, s = query.shape[2], key.shape[2]
        mask = _with_window(mask, t, s, sliding_window, query.device)
    backend = attention_backend(
        query,
        key,
        value,
        need_weights=need_weights,
        observed=observe is not None,
        weights_out=weights_out,
        softcap=softcap,
    )
    return ATTENTION_BACKENDS[backend](
        query,
        key,
        value,
        mask,
        is_causal=is_causal,
        scale=1.0 / math.sqrt(query.shape[-1]) if scale is None else scale,
        dropout_p=dropout_p,
        head_gates=head_gates,
        observe=observe or nobody,
        weights_out=weights_out,
        softcap=softcap,
    )


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T * scale + mask) V, returning the weights too (``attention_core`` with
    weights): ``(context [B, H, T, Dh], weights [B, H, T, S])``."""
    context, weights = attention_core(query, key, value, mask, scale=scale, dropout_p=dropout_p)
    assert context is not None and weights is not None  # value given, weights asked for
    return context, weights

"""The project's own multi-head self-attention, from scratch, proven against trusted ones.

Shapes use B = batch, T = query length, S = key length, H = query heads, G = key/value heads
(grouped-query attention: each key/value head serves H / G query heads), D = d_model,
Dh = d_head.

Everything goes through one function, ``attention_core``: scores, scale, mask, softmax, context,
head gates. It has named observation points (in the spirit of TransformerLens hook points): an
``observe(name, tensor)`` callable sees each intermediate and may return a replacement. The
teaching trace, the weights-only path and the engine all read from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "OBSERVATION_POINTS",
    "MultiHeadSelfAttention",
    "Observer",
    "Recorder",
    "RotaryEmbedding",
    "TraceStep",
    "attention_core",
    "combine_masks",
    "scaled_dot_product_attention",
]

#: ``observe(name, tensor) -> tensor or None``: sees an intermediate; a returned tensor replaces it.
Observer = Callable[[str, torch.Tensor], torch.Tensor | None]

#: Every observation point, in the order the forward pass reaches them, with its formula.
#: "rotated Q"/"rotated K" exist only with rotary positions, "gated context" only with head gates.
OBSERVATION_POINTS: dict[str, str] = {
    "X": "X (the layer's input)",
    "Q": "Q = X W_Q + b_Q",
    "K": "K = X W_K + b_K",
    "V": "V = X W_V + b_V",
    "per-head Q": "Q_h: reshape to [batch, heads, length, d_head]",
    "per-head K": "K_g: reshape to [batch, kv heads, length, d_head]",
    "per-head V": "V_g: reshape to [batch, kv heads, length, d_head]",
    "rotated Q": "RoPE(Q_h) = Q_h cos(p θ) + rotate_half(Q_h) sin(p θ)",
    "rotated K": "RoPE(K_g) = K_g cos(p θ) + rotate_half(K_g) sin(p θ)",
    "raw scores": "Q_h K_g(h)^T   (query head h reads key/value head g(h))",
    "scaled scores": "Q_h K_g(h)^T * scale   (scale = 1 / sqrt(d_head) by default)",
    "masked scores": "scores + mask   (-inf where attention is not allowed)",
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


def combine_masks(
    attn_mask: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    *,
    is_causal: bool,
    q_len: int,
    k_len: int,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Fold the three ways of masking into one mask broadcastable to ``[B, H, T, S]``.

    Args:
        attn_mask: boolean ``[T, S]`` or ``[B, H|1, T, S]`` (True = may attend), or a float mask
            added to the scores.
        attention_mask: ``[B, S]`` padding mask, 1 = real token, 0 = padding.
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
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[-1] != k_len:
            raise ValueError(
                f"attention_mask must have shape [batch, {k_len}] (1 = token, 0 = padding), "
                f"got {list(attention_mask.shape)}"
            )
        padding = attention_mask.to(device=device).bool()[:, None, None, :]  # (B, 1, 1, S)
        allowed = padding if allowed is None else allowed & padding
    if attn_mask is None:
        return allowed
    if attn_mask.dim() not in (2, 4) or attn_mask.shape[-2:] != (q_len, k_len):
        raise ValueError(
            f"attn_mask must have shape [{q_len}, {k_len}] or [batch, heads, {q_len}, {k_len}], "
            f"got {list(attn_mask.shape)}"
        )
    attn_mask = attn_mask.to(device)
    if attn_mask.dtype == torch.bool:
        return attn_mask if allowed is None else attn_mask & allowed
    attn_mask = attn_mask.to(dtype)
    if allowed is None:
        return attn_mask
    return attn_mask.masked_fill(~allowed, float("-inf"))


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, G, S, Dh]`` -> ``[B, G * groups, S, Dh]``: each key/value head serves ``groups``
    consecutive query heads (the Llama convention)."""
    if groups == 1:
        return x
    b, g, s, dh = x.shape
    return x[:, :, None].expand(b, g, groups, s, dh).reshape(b, g * groups, s, dh)


def _identity(_name: str, tensor: torch.Tensor) -> None:
    return None


def _seen(observe: Observer, name: str, tensor: torch.Tensor) -> torch.Tensor:
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
        weights_out: a preallocated tensor to receive the weights (no gradient).

    Returns:
        ``(context [B, H, T, Dh] or None, weights [B, H, T, S] or None)``. A query row with
        nothing to attend to gets all-zero weights and a zero context, never NaN. 16-bit inputs
        get their softmax in float32; weights come back in the input dtype.
    """
    h, g = query.shape[1], key.shape[1]
    if h % g:
        raise ValueError(f"{h} query heads cannot share {g} key/value heads: {g} must divide {h}")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    t, s = query.shape[2], key.shape[2]
    if not need_weights and observe is None and weights_out is None and value is not None:
        if is_causal and (mask is not None or t != s):
            mask = _with_causal(mask, t, s, query.device)
        causal_flag = is_causal and mask is None  # the kernel masks without building a mask
        return _fused(query, key, value, mask, causal_flag, scale, dropout_p, head_gates), None
    if is_causal:
        mask = _with_causal(mask, t, s, query.device)
    observe = observe or _identity
    # Inference only: the scores' buffer is reused for every step (a fresh [B, H, T, S] buffer
    # per step costs more than the step itself on the CPU, from page faults). With autograd the
    # steps stay out of place, so every mask kind can be differentiated.
    inplace = not torch.is_grad_enabled() or not (query.requires_grad or key.requires_grad)
    groups = h // g
    key_t = _repeat_kv(key, groups).transpose(-2, -1)  # (B, H, Dh, S)
    if observe is _identity:  # scaling Q (T x Dh values) is cheaper than the scores (T x S)
        scores = torch.matmul(query * scale, key_t)  # (B, H, T, S)
    else:  # both steps, for whoever watches them
        scores = torch.matmul(query, key_t)  # (B, H, T, S)
        scores = _seen(observe, "raw scores", scores)
        scores = scores.mul_(scale) if inplace else scores * scale
        scores = _seen(observe, "scaled scores", scores)
    scores = _apply_mask(scores, mask, inplace)
    scores = _seen(observe, "masked scores", scores)
    weights = _softmax(scores, inplace=inplace, out=weights_out, masked=mask is not None)
    weights = _seen(observe, "probabilities", weights)
    if value is None:
        return None, weights
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    context = torch.matmul(weights, _repeat_kv(value, groups))  # (B, H, T, Dh)
    context = _seen(observe, "per-head context", context)
    if head_gates is not None:
        context = _gate(context, head_gates)
        context = _seen(observe, "gated context", context)
    return context, weights


def _with_causal(mask: torch.Tensor | None, t: int, s: int, device: torch.device) -> torch.Tensor:
    """``mask`` and a causal mask in one (boolean stays boolean, float gets ``-inf``)."""
    allowed = _causal(t, s, device)
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, float("-inf"))


def _causal(t: int, s: int, device: torch.device) -> torch.Tensor:
    """``[T, S]``, True where query i (the last T of S positions) may see key j."""
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(s - t)


def _fused(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    dropout_p: float,
    head_gates: torch.Tensor | None,
) -> torch.Tensor:
    """The same maths through torch's fused kernel, when nobody needs the weights."""
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    context = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )  # (B, H, T, Dh)
    if mask is not None and context.device.type != "cpu":
        # some GPU kernels give NaN for rows with nothing to attend to: 0, as everywhere else
        context = torch.where(torch.isnan(context), 0.0, context)
    return context if head_gates is None else _gate(context, head_gates)


def _apply_mask(scores: torch.Tensor, mask: torch.Tensor | None, inplace: bool) -> torch.Tensor:
    """Boolean mask (True = may attend) -> -inf elsewhere; float mask -> added."""
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        fill = scores.masked_fill_ if inplace else scores.masked_fill
        return fill(~mask, float("-inf"))
    if inplace and torch.broadcast_shapes(scores.shape, mask.shape) == scores.shape:
        return scores.add_(mask)
    return scores + mask


def _softmax(
    scores: torch.Tensor, *, inplace: bool, out: torch.Tensor | None, masked: bool
) -> torch.Tensor:
    """Softmax over keys; float32 arithmetic for 16-bit scores; fully masked rows -> 0."""
    dtype = scores.dtype
    if out is not None and out.dtype == dtype == torch.float32 and out.shape == scores.shape:
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=out)
    elif inplace and dtype == torch.float32:
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
    else:  # 16-bit scores: exp and sum in float32
        upcast = torch.float32 if dtype in (torch.float16, torch.bfloat16) else None
        weights = torch.softmax(scores, dim=-1, dtype=upcast).to(dtype)
    if masked:  # empty rows are 0 / 0
        weights = weights.nan_to_num_(0.0) if inplace else torch.where(weights.isnan(), 0, weights)
    if out is not None and weights is not out:
        out.copy_(weights)
        weights = out
    return weights


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


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings (RoPE, Su et al. 2021) in the Llama convention.

    The first ``2 * len(inv_freq)`` features of each head are rotated, pairing feature ``i`` with
    ``i + rot_dim / 2`` (``rotate_half``); ``attention_scaling`` multiplies cos and sin (the
    YaRN / LongRoPE convention, 1 otherwise). ``inv_freq`` carries any static rope scaling
    (linear, llama3, yarn...), exactly as the model computed it.
    """

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.detach().float().clone(), persistent=False)
        self.attention_scaling = float(attention_scaling)

    @classmethod
    def default(cls, d_head: int, base: float = 10000.0) -> RotaryEmbedding:
        """The original RoPE frequencies, ``base ** (-2i / d_head)``."""
        return cls(1.0 / (base ** (torch.arange(0, d_head, 2, dtype=torch.float) / d_head)))

    @property
    def rot_dim(self) -> int:
        return 2 * self.inv_freq.numel()

    def extra_repr(self) -> str:
        return f"rot_dim={self.rot_dim}, attention_scaling={self.attention_scaling}"

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and sin ``[B|1, T, rot_dim]`` for positions ``[T]`` or ``[B, T]`` (float32 maths)."""
        if positions.dim() == 1:
            positions = positions[None]
        freqs = positions[..., None].float() * self.inv_freq.float()  # (B, T, rot_dim / 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, rot_dim)
        return (
            (emb.cos() * self.attention_scaling).to(dtype),
            (emb.sin() * self.attention_scaling).to(dtype),
        )

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[B, heads, T, Dh]`` by the angles of ``cos``/``sin``."""
        r = self.rot_dim
        rot, rest = x[..., :r], x[..., r:]
        half1, half2 = rot[..., : r // 2], rot[..., r // 2 :]
        rotated = torch.cat((-half2, half1), dim=-1)  # rotate_half
        out = rot * cos[:, None] + rotated * sin[:, None]
        return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)


class MultiHeadSelfAttention(nn.Module):
    """Multi-head attention with a fused QKV projection, grouped-query attention, optional rotary
    positions, head gates and per-head weights.

    ``forward(x)`` is self-attention; passing ``key``/``value`` gives cross-attention (then the
    fused weight is applied in two parts: Q from the query, K and V from the key/value).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        d_head: int | None = None,
        bias: bool = True,
        out_bias: bool | None = None,
        rotary: RotaryEmbedding | None = None,
        dropout: float = 0.0,
        scale: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """
        Args:
            d_model: width of the input and the output.
            num_heads: query heads H.
            num_kv_heads: key/value heads G (grouped-query attention); H by default.
            d_head: width of a head; ``d_model / num_heads`` by default.
            bias: biases on the Q, K, V projections (and on W_O unless ``out_bias`` says).
            out_bias: bias on the output projection; ``bias`` by default.
            rotary: rotary position embeddings applied to Q and K.
            dropout: dropout on the weights in training.
            scale: score scale, ``1 / sqrt(d_head)`` by default.
        """
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if d_head is None:
            if d_model <= 0 or num_heads <= 0 or d_model % num_heads != 0:
                raise ValueError(
                    f"d_model ({d_model}) must be a positive multiple of num_heads ({num_heads})"
                )
            d_head = d_model // num_heads
        if min(d_model, num_heads, num_kv_heads, d_head) <= 0 or num_heads % num_kv_heads:
            raise ValueError(
                f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads}), and every "
                f"size must be positive (d_model {d_model}, d_head {d_head})"
            )
        if rotary is not None and (rotary.rot_dim > d_head or rotary.rot_dim % 2):
            raise ValueError(f"rotary dimension {rotary.rot_dim} does not fit d_head {d_head}")
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.d_head = d_head
        self.dropout = dropout
        self.scale = 1.0 / math.sqrt(d_head) if scale is None else scale
        self.rotary = rotary
        factory = {"device": device, "dtype": dtype}
        self.q_size, self.kv_size = num_heads * d_head, num_kv_heads * d_head
        # rows: [W_Q; W_K; W_V]
        self.qkv = nn.Linear(d_model, self.q_size + 2 * self.kv_size, bias=bias, **factory)
        self.out = nn.Linear(self.q_size, d_model, bias=bias if out_bias is None else out_bias)
        self.out.to(**factory)
        self.reset_parameters()

    @property
    def groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    def reset_parameters(self) -> None:
        """Xavier-uniform weights (each of Q, K, V as its own matrix), zero biases."""
        for w in self.qkv.weight.detach().split(self._qkv_sizes, dim=0):
            nn.init.xavier_uniform_(w)
        nn.init.xavier_uniform_(self.out.weight)
        for lin in (self.qkv, self.out):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    @property
    def _qkv_sizes(self) -> list[int]:
        return [self.q_size, self.kv_size, self.kv_size]

    def extra_repr(self) -> str:
        gqa = f", num_kv_heads={self.num_kv_heads}" if self.groups > 1 else ""
        return f"d_model={self.d_model}, num_heads={self.num_heads}{gqa}, d_head={self.d_head}"

    def fresh_copy(self) -> MultiHeadSelfAttention:
        """A module of the same shape (heads, biases, rotary positions, scale) with fresh xavier
        weights drawn from torch's global generator, on the same device and dtype."""
        w = self.qkv.weight
        module = type(self)(
            self.d_model,
            self.num_heads,
            num_kv_heads=self.num_kv_heads,
            d_head=self.d_head,
            bias=self.qkv.bias is not None,
            out_bias=self.out.bias is not None,
            rotary=self.rotary,
            scale=self.scale,
        )
        return module.to(device=w.device, dtype=w.dtype)

    # --- projections -------------------------------------------------------------------------
    def _project(
        self, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q ``[B, T, H Dh]``, K and V ``[B, S, G Dh]``; one fused matmul for self-attention."""
        self._check_query(query)
        if key is None and value is None:
            return self.qkv(query).split(self._qkv_sizes, dim=-1)
        key = query if key is None else key
        value = key if value is None else value
        w_q, w_k, w_v = self.qkv.weight.split(self._qkv_sizes, dim=0)
        b_q, b_k, b_v = (
            (None,) * 3 if self.qkv.bias is None else self.qkv.bias.split(self._qkv_sizes)
        )
        if key is value:
            kv = F.linear(
                key, torch.cat([w_k, w_v]), None if b_k is None else torch.cat([b_k, b_v])
            )
            k, v = kv.split(self.kv_size, dim=-1)  # (B, S, G Dh)
        else:
            k, v = F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)  # (B, S, G Dh)
        return F.linear(query, w_q, b_q), k, v

    def _check_query(self, query: torch.Tensor) -> None:
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(
                f"query must have shape [batch, length, {self.d_model}], got {list(query.shape)}"
            )

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, length, width = x.shape
        return x.view(b, length, width // self.d_head, self.d_head).transpose(1, 2)  # (B, n, L, Dh)

    def _positions(self, positions: torch.Tensor | None, length: int, device: torch.device):
        if positions is None:
            return torch.arange(length, device=device)
        if positions.shape[-1] != length:
            raise ValueError(f"positions must have {length} entries, got {list(positions.shape)}")
        return positions.to(device)

    # --- forward -----------------------------------------------------------------------------
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = True,
        head_gates: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        observe: Observer | None = None,
        weights_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend.

        Args:
            query: ``[B, T, D]``.
            key: ``[B, S, D]``, defaults to ``query``.
            value: ``[B, S, D]``, defaults to ``key``.
            attn_mask: boolean ``[T, S]`` / ``[B, H|1, T, S]`` (True = may attend) or float mask
                added to the scores.
            attention_mask: ``[B, S]``, 1 = real token, 0 = padding.
            is_causal: forbid attention to later positions.
            need_weights: return the per-head weights; without them the fused
                ``scaled_dot_product_attention`` kernel is used.
            head_gates: ``[H]`` or ``[B, H]``: each head's context is multiplied by its gate
                before W_O (differentiable; 0 removes the head, 1 keeps it unchanged).
            positions: token positions ``[T]`` or ``[B, T]`` for rotary embeddings
                (``0..T-1`` by default).
            observe: sees every intermediate (``OBSERVATION_POINTS``) and may replace it.
            weights_out: preallocated ``[B, H, T, S]`` tensor for the weights (inference).

        Returns:
            ``(output [B, T, D], weights [B, H, T, S] or None)``.
        """
        context, weights = self._attend(
            query,
            key,
            value,
            attn_mask=attn_mask,
            attention_mask=attention_mask,
            is_causal=is_causal,
            need_weights=need_weights,
            head_gates=head_gates,
            positions=positions,
            observe=observe,
            weights_out=weights_out,
        )
        assert context is not None
        obs = observe or _identity
        b, _, t, _ = context.shape
        merged = context.transpose(1, 2).reshape(b, t, self.q_size)  # (B, T, H Dh)
        merged = _seen(obs, "concatenated heads", merged)
        output = self.out(merged)  # (B, T, D)
        return _seen(obs, "output", output), weights

    def _attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        *,
        attn_mask: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        is_causal: bool,
        need_weights: bool,
        head_gates: torch.Tensor | None,
        positions: torch.Tensor | None,
        observe: Observer | None,
        weights_out: torch.Tensor | None,
        weights_only: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Projections, heads, rotary positions, then ``attention_core``."""
        obs = observe or _identity
        query = _seen(obs, "X", query)
        if weights_only:
            self._check_query(query)
            q, k = F.linear(query, *self._qk_parameters()).split(self._qkv_sizes[:2], dim=-1)
            v = None
        else:
            q, k, v = self._project(query, key, value)
        named = {"Q": q, "K": k, "V": v}
        for name, t in named.items():
            if t is not None:
                named[name] = _seen(obs, name, t)
        q, k, v = (None if t is None else self._split_heads(t) for t in named.values())
        q = _seen(obs, "per-head Q", q)  # (B, H, T, Dh)
        k = _seen(obs, "per-head K", k)  # (B, G, S, Dh)
        if v is not None:
            v = _seen(obs, "per-head V", v)
        if self.rotary is not None:
            if q.shape[2] != k.shape[2]:
                raise ValueError("rotary positions need self-attention (equal query/key length)")
            cos, sin = self.rotary.cos_sin(
                self._positions(positions, q.shape[2], q.device), q.dtype
            )
            q, k = self.rotary.rotate(q, cos, sin), self.rotary.rotate(k, cos, sin)
            q = _seen(obs, "rotated Q", q)
            k = _seen(obs, "rotated K", k)
        mask = None
        if attn_mask is not None or attention_mask is not None:
            mask = combine_masks(
                attn_mask,
                attention_mask,
                is_causal=False,
                q_len=q.shape[2],
                k_len=k.shape[2],
                device=q.device,
                dtype=q.dtype,
            )
        if need_weights or observe is not None:
            # bmm on head-major contiguous operands: no hidden copies inside the two matmuls
            q, k = q.contiguous(), k.contiguous()
            v = None if v is None else v.contiguous()
        return attention_core(
            q,
            k,
            v,
            mask,
            is_causal=is_causal,
            scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0,
            head_gates=head_gates,
            need_weights=need_weights,
            observe=observe,
            weights_out=weights_out,
        )

    def _qk_parameters(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = self.q_size + self.kv_size
        return self.qkv.weight[:n], None if self.qkv.bias is None else self.qkv.bias[:n]

    def attention_weights(
        self,
        query: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        positions: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-head self-attention weights ``[B, H, T, T]`` only: Q and K, no V, no output.

        The same computation as ``forward(query, ...)[1]`` (``attention_core`` stops after the
        softmax) for a third less work. ``out``: a preallocated tensor for the weights.
        """
        _, weights = self._attend(
            query,
            None,
            None,
            attn_mask=attn_mask,
            attention_mask=attention_mask,
            is_causal=is_causal,
            need_weights=True,
            head_gates=None,
            positions=positions,
            observe=None,
            weights_out=out,
            weights_only=True,
        )
        assert weights is not None
        return weights

    @torch.no_grad()
    def forward_with_trace(
        self, query: torch.Tensor, *args: torch.Tensor | None, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor, list[TraceStep]]:
        """``forward`` with a ``Recorder`` observing it: the same computation, keeping every
        intermediate (``OBSERVATION_POINTS``, in order). Takes ``forward``'s arguments.

        Returns:
            ``(output, weights, steps)``.
        """
        recorder = Recorder()
        output, weights = self(query, *args, need_weights=True, observe=recorder, **kwargs)
        assert weights is not None
        return output, weights, recorder.steps

    # --- weight loading ----------------------------------------------------------------------
    @classmethod
    def from_projections(
        cls,
        w_q: torch.Tensor,
        w_k: torch.Tensor,
        w_v: torch.Tensor,
        w_o: torch.Tensor,
        b_q: torch.Tensor | None = None,
        b_k: torch.Tensor | None = None,
        b_v: torch.Tensor | None = None,
        b_o: torch.Tensor | None = None,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        scale: float | None = None,
        rotary: RotaryEmbedding | None = None,
    ) -> MultiHeadSelfAttention:
        """Build a module from ``nn.Linear``-layout ``[out, in]`` projection weights.

        ``w_q`` is ``[H Dh, D]``, ``w_k``/``w_v`` ``[G Dh, D]``, ``w_o`` ``[D, H Dh]``. A missing
        Q/K/V bias means none of them has one; a missing ``b_o`` means W_O has none.
        """
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        d_model = w_q.shape[1]
        if w_q.shape[0] % num_heads:
            raise ValueError(f"W_Q has {w_q.shape[0]} rows, not a multiple of {num_heads} heads")
        d_head = w_q.shape[0] // num_heads
        want = {
            "W_Q": (num_heads * d_head, d_model),
            "W_K": (num_kv_heads * d_head, d_model),
            "W_V": (num_kv_heads * d_head, d_model),
            "W_O": (d_model, num_heads * d_head),
        }
        for name, w in zip(want, (w_q, w_k, w_v, w_o), strict=True):
            if tuple(w.shape) != want[name]:
                raise ValueError(f"{name} must be {list(want[name])}, got {list(w.shape)}")
        module = cls(
            d_model,
            num_heads,
            num_kv_heads=num_kv_heads,
            d_head=d_head,
            bias=b_q is not None,
            out_bias=b_o is not None,
            rotary=rotary,
            scale=scale,
            device=w_q.device,
            dtype=w_q.dtype,
        )
        with torch.no_grad():
            module.qkv.weight.copy_(torch.cat([w_q, w_k, w_v]))
            module.out.weight.copy_(w_o)
            if b_q is not None:
                b_k = torch.zeros_like(w_k[:, 0]) if b_k is None else b_k
                b_v = torch.zeros_like(w_v[:, 0]) if b_v is None else b_v
                module.qkv.bias.copy_(torch.cat([b_q, b_k, b_v]))
            if b_o is not None:
                module.out.bias.copy_(b_o)
        return module

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadSelfAttention:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (same embed dim for Q, K, V)."""
        if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
            raise ValueError(
                "from_torch needs nn.MultiheadAttention with kdim == vdim == embed_dim, "
                "add_bias_kv=False and add_zero_attn=False"
            )
        w_q, w_k, w_v = m.in_proj_weight.detach().chunk(3)
        b = (None,) * 3 if m.in_proj_bias is None else m.in_proj_bias.detach().chunk(3)
        b_o = None if m.out_proj.bias is None else m.out_proj.bias.detach()
        return cls.from_projections(
            w_q, w_k, w_v, m.out_proj.weight.detach(), *b, b_o, num_heads=m.num_heads
        )

    @classmethod
    def from_bert(cls, attention: nn.Module) -> MultiHeadSelfAttention:
        """Copy a BERT-family attention block (``.self.query/key/value`` and ``.output.dense``)."""
        s, dense = attention.self, attention.output.dense
        return cls.from_projections(
            s.query.weight.detach(),
            s.key.weight.detach(),
            s.value.weight.detach(),
            dense.weight.detach(),
            *(_bias(p) for p in (s.query, s.key, s.value, dense)),
            num_heads=s.num_attention_heads,
            scale=float(getattr(s, "scaling", s.attention_head_size**-0.5)),
        )

    @classmethod
    def from_distilbert(cls, attention: nn.Module) -> MultiHeadSelfAttention:
        """Copy a DistilBERT attention block (``q_lin``/``k_lin``/``v_lin``/``out_lin``)."""
        a = attention
        lins = (a.q_lin, a.k_lin, a.v_lin, a.out_lin)
        return cls.from_projections(
            *(lin.weight.detach() for lin in lins),
            *(_bias(lin) for lin in lins),
            num_heads=a.n_heads,
        )

    @classmethod
    def from_gpt2(cls, attention: nn.Module) -> MultiHeadSelfAttention:
        """Copy a GPT-2 attention block; ``c_attn``/``c_proj`` are Conv1D, i.e. ``[in, out]``."""
        if getattr(attention, "is_cross_attention", False):
            raise ValueError("from_gpt2 loads self-attention blocks, not GPT-2 cross-attention")
        if getattr(attention, "reorder_and_upcast_attn", False):
            raise ValueError("from_gpt2 does not load blocks with reorder_and_upcast_attn=True")
        d = attention.embed_dim
        w_q, w_k, w_v = attention.c_attn.weight.detach().t().split(d)  # Conv1D -> Linear layout
        b_q, b_k, b_v = attention.c_attn.bias.detach().split(d)
        return cls.from_projections(
            w_q,
            w_k,
            w_v,
            attention.c_proj.weight.detach().t(),
            b_q,
            b_k,
            b_v,
            attention.c_proj.bias.detach(),
            num_heads=attention.num_heads,
            scale=float(attention.scaling),
        )

    @classmethod
    def from_llama(
        cls, attention: nn.Module, rotary: RotaryEmbedding | nn.Module | None = None
    ) -> MultiHeadSelfAttention:
        """Copy a Llama-layout block (``q_proj``/``k_proj``/``v_proj``/``o_proj``: Llama,
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
                raise ValueError(f"from_llama cannot load blocks with {norm} (Q/K normalisation)")
        cfg = getattr(attention, "config", None)
        d_head = attention.head_dim
        num_heads = attention.q_proj.weight.shape[0] // d_head
        num_kv_heads = attention.k_proj.weight.shape[0] // d_head
        if rotary is None:
            params = getattr(cfg, "rope_parameters", None) or {}
            rotary = RotaryEmbedding.default(d_head, float(params.get("rope_theta", 10000.0)))
        elif not isinstance(rotary, RotaryEmbedding):
            rope_type = getattr(rotary, "rope_type", "default")
            if rope_type in ("dynamic", "longrope"):
                raise ValueError(
                    f"rope type {rope_type!r} changes its frequencies with the sequence length; "
                    "from_llama loads static rope (default, linear, llama3, yarn)"
                )
            rotary = RotaryEmbedding(rotary.inv_freq, getattr(rotary, "attention_scaling", 1.0))
        projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj)
        return cls.from_projections(
            *(p.weight.detach() for p in projections),
            *(_bias(p) for p in projections),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            scale=float(attention.scaling),
            rotary=rotary.to(attention.q_proj.weight.device),
        )


def _bias(linear: nn.Module) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach()

"""The project's own multi-head self-attention, from scratch, proven against trusted ones.

Shapes use B = batch, T = query length, S = key length, H = heads, D = d_model, Dh = D / H.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MultiHeadSelfAttention",
    "TraceStep",
    "attention_probabilities",
    "combine_masks",
    "scaled_dot_product_attention",
]


@dataclass(frozen=True)
class TraceStep:
    """One named intermediate of the attention computation, for teaching.

    Attributes:
        name: what the tensor is ("Q", "raw scores", ...).
        formula: the step written as a formula (plain text, LaTeX-free).
        tensor: the value, detached.
    """

    name: str
    formula: str
    tensor: torch.Tensor


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
        attn_mask: boolean ``[T, S]`` or ``[B, H, T, S]`` (True = may attend), or a float mask
            added to the scores.
        attention_mask: ``[B, S]`` padding mask, 1 = real token, 0 = padding.
        is_causal: forbid attention to later positions.
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
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)
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


def _softmax_lastdim(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over keys, in place when no gradient is needed.

    A fresh [B, H, T, S] buffer per call costs more than the softmax itself on the CPU (page
    faults on newly mapped memory: 11 ms against 3 ms for 12 x 1024 x 1024), so the scores'
    buffer is reused for the probabilities. The kernels finish reading a row before writing it.
    """
    if scores.requires_grad:
        return torch.softmax(scores, dim=-1)
    return torch.ops.aten._softmax.out(scores, -1, False, out=scores)


def attention_probabilities(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) over keys, ``[B, H, T, S]``.

    A query row with nothing to attend to gets all-zero weights, never NaN. ``out``: a
    preallocated tensor to write the weights into (no gradient).
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    # Scaling Q (T x Dh values) is cheaper than scaling the scores (T x S values).
    scores = torch.matmul(query * scale, key.transpose(-2, -1))  # (B, H, T, S)
    scores = _apply_mask(scores, mask)
    if out is not None:
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=out)
    else:
        weights = _softmax_lastdim(scores)
    return weights.nan_to_num_(0.0) if mask is not None else weights  # empty rows: 0 / 0


def _apply_mask(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Boolean mask (True = may attend) -> -inf elsewhere; float mask -> added. In place."""
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill_(~mask, float("-inf"))
    if torch.broadcast_shapes(scores.shape, mask.shape) == scores.shape:
        return scores.add_(mask)
    return scores + mask


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T * scale + mask) V, returning the weights too.

    Args:
        query: ``[B, H, T, Dh]``.
        key: ``[B, H, S, Dh]``.
        value: ``[B, H, S, Dh]``.
        mask: boolean (True = may attend) or float additive mask broadcastable to ``[B, H, T, S]``.
        scale: score scale, ``1 / sqrt(Dh)`` by default.
        dropout_p: dropout on the weights (apply only in training).

    Returns:
        ``(context [B, H, T, Dh], weights [B, H, T, S])``. A query row with nothing to attend to
        gets all-zero weights and a zero context, never NaN.
    """
    weights = attention_probabilities(query, key, mask, scale=scale)  # (B, H, T, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, value), weights  # (B, H, T, Dh)


class MultiHeadSelfAttention(nn.Module):
    """Multi-head attention with a fused QKV projection and per-head weights.

    ``forward(x)`` is self-attention; passing ``key``/``value`` gives cross-attention (then the
    fused weight is applied in two parts: Q from the query, K and V from the key/value).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        scale: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if d_model <= 0 or num_heads <= 0 or d_model % num_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) must be a positive multiple of num_heads ({num_heads})"
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.dropout = dropout
        self.scale = 1.0 / math.sqrt(self.d_head) if scale is None else scale
        factory = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias, **factory)  # rows: [W_Q; W_K; W_V]
        self.out = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights (each of Q, K, V as its own square matrix), zero biases."""
        for w in self.qkv.weight.detach().chunk(3, dim=0):
            nn.init.xavier_uniform_(w)
        nn.init.xavier_uniform_(self.out.weight)
        for lin in (self.qkv, self.out):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, d_head={self.d_head}"

    # --- projections -------------------------------------------------------------------------
    def _project(
        self, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V as ``[B, L, D]``; one fused matmul for self-attention."""
        self._check_query(query)
        if key is None and value is None:
            return self.qkv(query).split(self.d_model, dim=-1)  # 3 x (B, T, D)
        key = query if key is None else key
        value = key if value is None else value
        w_q, w_k, w_v = self.qkv.weight.split(self.d_model, dim=0)
        b_q, b_k, b_v = (None,) * 3 if self.qkv.bias is None else self.qkv.bias.split(self.d_model)
        if key is value:
            kv = F.linear(
                key, torch.cat([w_k, w_v]), None if b_k is None else torch.cat([b_k, b_v])
            )
            k, v = kv.split(self.d_model, dim=-1)  # (B, S, D)
        else:
            k, v = F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)  # (B, S, D)
        return F.linear(query, w_q, b_q), k, v

    def _check_query(self, query: torch.Tensor) -> None:
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(
                f"query must have shape [batch, length, {self.d_model}], got {list(query.shape)}"
            )

    @staticmethod
    def _mask(
        q: torch.Tensor,
        k: torch.Tensor,
        attn_mask: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor | None:
        """The combined mask for per-head ``q`` ``[B, H, T, Dh]`` and ``k`` ``[B, H, S, Dh]``."""
        if not is_causal and attn_mask is None and attention_mask is None:
            return None
        return combine_masks(
            attn_mask,
            attention_mask,
            is_causal=is_causal,
            q_len=q.shape[2],
            k_len=k.shape[2],
            device=q.device,
            dtype=q.dtype,
        )

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.num_heads, self.d_head).transpose(1, 2)  # (B, H, L, Dh)

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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend.

        Args:
            query: ``[B, T, D]``.
            key: ``[B, S, D]``, defaults to ``query``.
            value: ``[B, S, D]``, defaults to ``key``.
            attn_mask: boolean ``[T, S]`` / ``[B, H, T, S]`` (True = may attend) or float mask
                added to the scores.
            attention_mask: ``[B, S]``, 1 = real token, 0 = padding.
            is_causal: forbid attention to later positions.
            need_weights: return the per-head weights; without them the fused
                ``scaled_dot_product_attention`` kernel is used.

        Returns:
            ``(output [B, T, D], weights [B, H, T, S] or None)``.
        """
        q, k, v = (self._split_heads(t) for t in self._project(query, key, value))  # (B, H, L, Dh)
        dropout_p = self.dropout if self.training else 0.0
        causal_only = (
            is_causal and attn_mask is None and attention_mask is None and q.shape[2] == k.shape[2]
        )
        # the fused kernel takes a plain causal mask as a flag, without building it
        mask = (
            None
            if causal_only and not need_weights
            else self._mask(q, k, attn_mask, attention_mask, is_causal)
        )
        if need_weights:
            # bmm on head-major contiguous operands: no hidden copies inside the two matmuls
            q, k, v = (t.contiguous() for t in (q, k, v))  # (B, H, L, Dh)
            context, weights = scaled_dot_product_attention(
                q, k, v, mask, scale=self.scale, dropout_p=dropout_p
            )  # (B, H, T, Dh), (B, H, T, S)
        else:
            weights = None
            context = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=None if causal_only else mask,
                dropout_p=dropout_p,
                is_causal=causal_only,
                scale=self.scale,
            )  # (B, H, T, Dh)
            if not causal_only and mask is not None and context.device.type != "cpu":
                context = context.nan_to_num_(0.0)  # some GPU kernels give NaN for empty rows
        b, _, t, _ = context.shape
        merged = context.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, D)
        return self.out(merged), weights

    def attention_weights(
        self,
        query: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-head self-attention weights ``[B, H, T, T]`` only: Q and K, no V, no output.

        The same numbers as ``forward(query, ...)[1]`` for a third less work; what a viewer
        needs when it shows the weights and not the layer's output. ``out``: a preallocated
        ``[B, H, T, T]`` tensor to write the weights into (no gradient).
        """
        self._check_query(query)
        two = 2 * self.d_model
        bias = None if self.qkv.bias is None else self.qkv.bias[:two]
        q, k = F.linear(query, self.qkv.weight[:two], bias).split(self.d_model, dim=-1)
        q, k = (self._split_heads(t).contiguous() for t in (q, k))  # (B, H, T, Dh)
        mask = self._mask(q, k, None, attention_mask, is_causal)
        return attention_probabilities(q, k, mask, scale=self.scale, out=out)  # (B, H, T, T)

    @torch.no_grad()
    def forward_with_trace(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, list[TraceStep]]:
        """The same computation as ``forward``, one step at a time, keeping every intermediate.

        Returns:
            ``(output, weights, steps)``; ``steps`` in order: X, Q, K, V, per-head Q/K/V, raw
            scores, scaled scores, masked scores, probabilities, per-head context, concatenated
            heads, output. Numerically identical to ``forward(..., need_weights=True)``.
        """
        steps = [TraceStep("X", "X (input embeddings)", query)]
        q, k, v = self._project(query, key, value)
        w = "W_Q, W_K, W_V: [d_model, d_model]"
        steps += [
            TraceStep("Q", f"Q = X W_Q + b_Q   ({w})", q),
            TraceStep("K", "K = X W_K + b_K", k),
            TraceStep("V", "V = X W_V + b_V", v),
        ]
        qh, kh, vh = (self._split_heads(t) for t in (q, k, v))  # (B, H, L, Dh)
        split = f"reshape to [batch, heads={self.num_heads}, length, d_head={self.d_head}]"
        steps += [
            TraceStep("per-head Q", f"Q_h: {split}", qh),
            TraceStep("per-head K", f"K_h: {split}", kh),
            TraceStep("per-head V", f"V_h: {split}", vh),
        ]
        raw = torch.matmul(qh, kh.transpose(-2, -1))  # (B, H, T, S)
        scaled = raw * self.scale
        steps += [
            TraceStep("raw scores", "Q_h K_h^T", raw),
            TraceStep("scaled scores", f"Q_h K_h^T / sqrt(d_head)   (sqrt({self.d_head}))", scaled),
        ]
        mask = self._mask(qh, kh, attn_mask, attention_mask, is_causal)
        masked = _apply_mask(scaled.clone(), mask)
        weights = torch.softmax(masked, dim=-1).nan_to_num_(0.0)  # (B, H, T, S)
        context = torch.matmul(weights, vh)  # (B, H, T, Dh)
        b, _, t, _ = context.shape
        merged = context.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, D)
        output = self.out(merged)
        steps += [
            TraceStep(
                "masked scores", "scores + mask   (-inf where attention is not allowed)", masked
            ),
            TraceStep("probabilities", "A_h = softmax(masked scores) over keys", weights),
            TraceStep("per-head context", "A_h V_h", context),
            TraceStep("concatenated heads", "Concat(head_1, ..., head_h)", merged),
            TraceStep("output", "Concat(...) W_O + b_O", output),
        ]
        return output, weights, steps

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
        scale: float | None = None,
    ) -> MultiHeadSelfAttention:
        """Build a module from ``nn.Linear``-layout ``[out, in]`` projection weights."""
        d_model = w_q.shape[1]
        for name, w in (("W_Q", w_q), ("W_K", w_k), ("W_V", w_v), ("W_O", w_o)):
            if tuple(w.shape) != (d_model, d_model):
                raise ValueError(f"{name} must be [{d_model}, {d_model}], got {list(w.shape)}")
        bias = b_q is not None
        module = cls(d_model, num_heads, bias=bias, scale=scale, device=w_q.device, dtype=w_q.dtype)
        with torch.no_grad():
            module.qkv.weight.copy_(torch.cat([w_q, w_k, w_v]))
            module.out.weight.copy_(w_o)
            if bias:
                module.qkv.bias.copy_(torch.cat([b_q, b_k, b_v]))
                module.out.bias.copy_(b_o if b_o is not None else torch.zeros_like(b_q))
        return module

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadSelfAttention:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (same embed dim for Q, K, V)."""
        if not m._qkv_same_embed_dim or m.bias_k is not None:
            raise ValueError(
                "from_torch needs nn.MultiheadAttention with kdim == vdim == embed_dim and "
                "add_bias_kv=False"
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
            s.query.weight,
            s.key.weight,
            s.value.weight,
            dense.weight,
            s.query.bias,
            s.key.bias,
            s.value.bias,
            dense.bias,
            num_heads=s.num_attention_heads,
        )

    @classmethod
    def from_distilbert(cls, attention: nn.Module) -> MultiHeadSelfAttention:
        """Copy a DistilBERT attention block (``q_lin``/``k_lin``/``v_lin``/``out_lin``)."""
        a = attention
        return cls.from_projections(
            a.q_lin.weight,
            a.k_lin.weight,
            a.v_lin.weight,
            a.out_lin.weight,
            a.q_lin.bias,
            a.k_lin.bias,
            a.v_lin.bias,
            a.out_lin.bias,
            num_heads=a.n_heads,
        )

    @classmethod
    def from_gpt2(cls, attention: nn.Module) -> MultiHeadSelfAttention:
        """Copy a GPT-2 attention block; ``c_attn``/``c_proj`` are Conv1D, i.e. ``[in, out]``."""
        if getattr(attention, "is_cross_attention", False):
            raise ValueError("from_gpt2 loads self-attention blocks, not GPT-2 cross-attention")
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

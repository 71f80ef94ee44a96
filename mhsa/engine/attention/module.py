"""Our multi-head self-attention (the project's, from scratch), proven against trusted ones:
``MultiHeadSelfAttention`` (fused QKV projection, grouped-query attention, rotary positions, head
gates) and ``RotaryEmbedding``. The attention itself is computed in ``mhsa.engine.attention.core``'s
``attention_core``; its public names are re-exported here.

Shapes use B = batch, T = query length, S = key length, H = query heads, G = key/value heads,
D = d_model, Dh = d_head.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mhsa.deprecation import renamed_kwargs
from mhsa.engine.attention.core import (
    ATTENTION_BACKENDS,
    OBSERVATION_POINTS,
    Observer,
    Recorder,
    TraceStep,
    attention_backend,
    attention_core,
    combine_masks,
    nobody,
    observed,
    scaled_dot_product_attention,
)
from mhsa.engine.attention.rmsnorm import RMSNorm
from mhsa.engine.attention.rotary import RotaryEmbedding

__all__ = [
    "ATTENTION_BACKENDS",
    "OBSERVATION_POINTS",
    "MultiHeadSelfAttention",
    "Observer",
    "RMSNorm",
    "Recorder",
    "RotaryEmbedding",
    "TraceStep",
    "attention_backend",
    "attention_core",
    "combine_masks",
    "scaled_dot_product_attention",
]


class MultiHeadSelfAttention(nn.Module):
    """Multi-head attention with a fused QKV projection, grouped-query attention, optional rotary
    positions, q/k normalisation, attention-logit soft-capping, a sliding window, head gates and
    per-head weights.

    ``forward(x)`` is self-attention; ``forward(x, memory=m)`` is cross-attention: Q from ``x``,
    K and V from ``m`` (an encoder's output; ``key``/``value`` may also be given apart). The fused
    weight is then applied in two parts. Loaders
    for transformers models' attention blocks live in ``mhsa.engine.families``, one module per
    family.
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
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
        softcap: float | None = None,
        sliding_window: int | None = None,
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
            scale: score scale, ``1 / sqrt(d_head)`` by default (Gemma 2/3:
                ``query_pre_attn_scalar ** -0.5``).
            q_norm: RMSNorm of Q split into heads, before rotary positions (Qwen3, Gemma 3:
                per head; OLMo 2: over the whole projection); observed as "normed Q".
            k_norm: likewise for K ("normed K").
            softcap: attention-logit soft-capping ``c * tanh(s / c)`` of the scaled scores,
                before the mask (Gemma 2); observed as "capped scores".
            sliding_window: each query sees only keys less than this many positions away
                (``attention_core``'s band mask; Mistral, Gemma 2/3 local layers, ModernBERT
                local layers).
        """
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        d_head = _checked_sizes(d_model, num_heads, num_kv_heads, d_head, rotary)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.d_head = d_head
        self.dropout = dropout
        self.scale = 1.0 / math.sqrt(d_head) if scale is None else scale
        self.rotary = rotary
        self.q_norm, self.k_norm = q_norm, k_norm
        self.softcap, self.sliding_window = softcap, sliding_window
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
        options = {"softcap": self.softcap, "sliding_window": self.sliding_window}
        extra = gqa + "".join(f", {k}={v}" for k, v in options.items() if v is not None)
        return f"d_model={self.d_model}, num_heads={self.num_heads}{extra}, d_head={self.d_head}"

    def fresh_copy(self) -> MultiHeadSelfAttention:
        """A module of the same shape (heads, biases, rotary positions, scale, soft-cap, window)
        with fresh xavier weights drawn from torch's global generator, q/k norms (if any) at the
        identity's weight, on the same device and dtype."""
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
            q_norm=None if self.q_norm is None else self.q_norm.identity_copy(),
            k_norm=None if self.k_norm is None else self.k_norm.identity_copy(),
            softcap=self.softcap,
            sliding_window=self.sliding_window,
        )
        return module.to(device=w.device, dtype=w.dtype)

    def projections(
        self,
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]:
        """``((W_Q, W_K, W_V, W_O), (b_Q, b_K, b_V, b_O))`` in ``nn.Linear`` layout ``[out, in]``
        (views of the module's parameters, detached): what ``from_projections`` takes."""
        weights = (*self.qkv.weight.detach().split(self._qkv_sizes), self.out.weight.detach())
        qkv_bias = self.qkv.bias
        biases = (None,) * 3 if qkv_bias is None else qkv_bias.detach().split(self._qkv_sizes)
        b_o = None if self.out.bias is None else self.out.bias.detach()
        return weights, (*biases, b_o)

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

    def _project_qk(
        self, query: torch.Tensor, key: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        """Q and K only (no V), for the weights alone; K from ``key`` when given."""
        self._check_query(query)
        n = self.q_size + self.kv_size
        bias = None if self.qkv.bias is None else self.qkv.bias[:n]
        if key is None:
            q, k = F.linear(query, self.qkv.weight[:n], bias).split(self._qkv_sizes[:2], dim=-1)
            return q, k, None
        w_q, w_k = self.qkv.weight[:n].split(self._qkv_sizes[:2])
        b_q, b_k = (None, None) if bias is None else bias.split(self._qkv_sizes[:2])
        return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), None

    def _keys_values(
        self, key: torch.Tensor | None, value: torch.Tensor | None, memory: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``key`` and ``value`` once ``memory`` (cross-attention: both from it) is folded in.

        Raises:
            ValueError: ``memory`` together with ``key``/``value``, of the wrong shape, or with
                rotary positions (which rotate a query and a key of one sequence).
        """
        if memory is None:
            return key, value
        if key is not None or value is not None:
            raise ValueError("give either memory (keys and values from it) or key/value, not both")
        if memory.dim() != 3 or memory.shape[-1] != self.d_model:
            raise ValueError(
                f"memory must have shape [batch, length, {self.d_model}], got {list(memory.shape)}"
            )
        if self.rotary is not None:
            raise ValueError("rotary positions need self-attention; this module has them")
        return memory, memory

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

    def _heads(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        *,
        positions: torch.Tensor | None,
        observe: Observer,
        weights_only: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """X -> per-head Q ``[B, H, T, Dh]``, K and V ``[B, G, S, Dh]`` (V None for the weights
        alone), rotated when the module has rotary positions; each step observed."""
        query = observed(observe, "X", query)
        if weights_only:
            q, k, v = self._project_qk(query, key)
        else:
            q, k, v = self._project(query, key, value)
        q = observed(observe, "Q", q)  # (B, T, H Dh)
        k = observed(observe, "K", k)  # (B, S, G Dh)
        if v is not None:
            v = observed(observe, "V", v)  # (B, S, G Dh)
        q = observed(observe, "per-head Q", self._split_heads(q))  # (B, H, T, Dh)
        k = observed(observe, "per-head K", self._split_heads(k))  # (B, G, S, Dh)
        if v is not None:
            v = observed(observe, "per-head V", self._split_heads(v))  # (B, G, S, Dh)
        if self.q_norm is not None:
            q = observed(observe, "normed Q", self.q_norm.per_head_layout(q))  # (B, H, T, Dh)
        if self.k_norm is not None:
            k = observed(observe, "normed K", self.k_norm.per_head_layout(k))  # (B, G, S, Dh)
        if self.rotary is None:
            return q, k, v
        if q.shape[2] != k.shape[2]:
            raise ValueError("rotary positions need self-attention (equal query/key length)")
        cos, sin = self.rotary.cos_sin(self._positions(positions, q.shape[2], q.device), q.dtype)
        q = observed(observe, "rotated Q", self.rotary.rotate(q, cos, sin))
        k = observed(observe, "rotated K", self.rotary.rotate(k, cos, sin))
        return q, k, v

    # --- forward -----------------------------------------------------------------------------
    @renamed_kwargs(attn_mask="mask", attention_mask="padding_mask")
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = True,
        head_gates: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        observe: Observer | None = None,
        weights_out: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend.

        Args:
            query: ``[B, T, D]``.
            key: ``[B, S, D]``, defaults to ``query`` (or ``memory``).
            value: ``[B, S, D]``, defaults to ``key``.
            mask: boolean ``[T, S]`` / ``[B, H|1, T, S]`` (True = may attend) or float mask
                added to the scores (a relative position bias, say).
            padding_mask: ``[B, S]``, 1 = real token, 0 = padding (a tokenizer's
                ``attention_mask``).
            is_causal: forbid attention to later positions.
            need_weights: return the per-head weights; without them the fused
                ``scaled_dot_product_attention`` kernel is used.
            head_gates: ``[H]`` or ``[B, H]``: each head's context is multiplied by its gate
                before W_O (differentiable; 0 removes the head, 1 keeps it unchanged).
            positions: token positions ``[T]`` or ``[B, T]`` for rotary embeddings
                (``0..T-1`` by default).
            observe: sees every intermediate (``OBSERVATION_POINTS``) and may replace it.
            weights_out: preallocated ``[B, H, T, S]`` tensor for the weights (inference).
            memory: ``[B, S, D]``: cross-attention, K and V projected from it (an encoder's
                output) while Q comes from ``query``; masks are then ``[.., T, S]`` and
                ``padding_mask`` is the memory's ``[B, S]``.

        Returns:
            ``(output [B, T, D], weights [B, H, T, S] or None)``.
        """
        watch = observe or nobody
        key, value = self._keys_values(key, value, memory)
        q, k, v = self._heads(
            query, key, value, positions=positions, observe=watch, weights_only=False
        )
        context, weights = attention_core(
            q,
            k,
            v,
            self._mask(mask, padding_mask, q, k),
            is_causal=is_causal,
            scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0,
            head_gates=head_gates,
            need_weights=need_weights,
            observe=observe,
            weights_out=weights_out,
            softcap=self.softcap,
            sliding_window=self.sliding_window,
        )
        assert context is not None  # values were given
        b, _, t, _ = context.shape
        merged = context.transpose(1, 2).reshape(b, t, self.q_size)  # (B, T, H Dh)
        merged = observed(watch, "concatenated heads", merged)
        return observed(watch, "output", self.out(merged)), weights  # (B, T, D)

    def _mask(
        self,
        mask: torch.Tensor | None,
        padding_mask: torch.Tensor | None,
        q: torch.Tensor,
        k: torch.Tensor,
    ) -> torch.Tensor | None:
        """``mask`` and ``padding_mask`` as one mask for per-head ``q`` and ``k`` (causal
        masking is left to ``attention_core``, which knows the fastest way)."""
        if mask is None and padding_mask is None:
            return None
        return combine_masks(
            mask,
            padding_mask,
            is_causal=False,
            q_len=q.shape[2],
            k_len=k.shape[2],
            device=q.device,
            dtype=q.dtype,
        )

    @renamed_kwargs(attn_mask="mask", attention_mask="padding_mask")
    def attention_weights(
        self,
        query: torch.Tensor,
        *,
        padding_mask: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        positions: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-head weights ``[B, H, T, T]`` only (``[B, H, T, S]`` with ``memory`` ``[B, S, D]``:
        cross-attention): Q and K, no V, no output.

        The same computation as ``forward(query, ...)[1]`` (``attention_core`` stops after the
        softmax) for a third less work. ``out``: a preallocated tensor for the weights.
        """
        memory, _ = self._keys_values(None, None, memory)
        q, k, _ = self._heads(
            query, memory, None, positions=positions, observe=nobody, weights_only=True
        )
        _, weights = attention_core(
            q,
            k,
            None,
            self._mask(mask, padding_mask, q, k),
            is_causal=is_causal,
            scale=self.scale,
            weights_out=out,
            softcap=self.softcap,
            sliding_window=self.sliding_window,
        )
        assert weights is not None
        return weights

    @torch.no_grad()
    def head_weights(
        self,
        query: torch.Tensor,
        chunks: Sequence[Sequence[int]],
        take: Callable[[Sequence[int], torch.Tensor], None],
        *,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        positions: torch.Tensor | None = None,
    ) -> None:
        """``attention_weights(query, ...)[:, chunk]`` for each chunk of query heads, handed
        to ``take(chunk, weights)`` before the next is computed (Q and K projected once): one
        layer's weights of every head never exist at once (long inputs,
        ``mhsa.engine.runs.partial``)."""
        q, k, _ = self._heads(
            query, None, None, positions=positions, observe=nobody, weights_only=True
        )
        full = self._mask(mask, None, q, k)
        per_head = full is not None and full.dim() == 4 and full.shape[1] > 1
        for chunk in chunks:
            heads = torch.as_tensor(list(chunk), device=q.device)
            _, weights = attention_core(
                q.index_select(1, heads),
                k.index_select(1, heads // self.groups),  # each query head's key head
                None,
                full.index_select(1, heads) if per_head else full,
                is_causal=is_causal,
                scale=self.scale,
            )
            assert weights is not None
            take(chunk, weights)

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
        **options: object,
    ) -> MultiHeadSelfAttention:
        """Build a module from ``nn.Linear``-layout ``[out, in]`` projection weights.

        ``w_q`` is ``[H Dh, D]``, ``w_k``/``w_v`` ``[G Dh, D]``, ``w_o`` ``[D, H Dh]``. A missing
        Q/K/V bias means none of them has one; a missing ``b_o`` means W_O has none.
        ``options``: the constructor's ``q_norm``, ``k_norm``, ``softcap``, ``sliding_window``.
        """
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        d_head = _checked_projections(w_q, w_k, w_v, w_o, num_heads, num_kv_heads)
        module = cls(
            w_q.shape[1],
            num_heads,
            num_kv_heads=num_kv_heads,
            d_head=d_head,
            bias=b_q is not None,
            out_bias=b_o is not None,
            rotary=rotary,
            scale=scale,
            device=w_q.device,
            dtype=w_q.dtype,
            **options,
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


def _checked_sizes(
    d_model: int,
    num_heads: int,
    num_kv_heads: int,
    d_head: int | None,
    rotary: RotaryEmbedding | None,
) -> int:
    """``d_head`` (``d_model / num_heads`` when None) once every size fits the others.

    Raises:
        ValueError: naming the sizes that do not fit.
    """
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
    return d_head


def _checked_projections(
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> int:
    """``d_head`` of ``nn.Linear``-layout projections, once their shapes agree.

    Raises:
        ValueError: naming the projection whose shape is off.
    """
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
    return d_head

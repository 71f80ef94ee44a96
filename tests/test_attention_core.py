"""The attention core: one sequence of steps whatever the backend, so that observing, a weights
buffer, gradients or asking for the weights alone change no bit of the weights."""

from __future__ import annotations

import pytest
import torch

from mhsa import MultiHeadSelfAttention
from mhsa.engine import RotaryEmbedding
from mhsa.engine.attention.module import Recorder, attention_backend, attention_core, combine_masks

# (batch, query heads, key/value heads, query length, key length, d_head)
SHAPES = [(1, 2, 2, 5, 5, 4), (2, 4, 2, 7, 7, 8), (3, 6, 3, 4, 9, 8), (1, 8, 1, 16, 16, 16)]
MASKS = ["none", "padding", "boolean", "float", "causal", "causal+padding"]


def _inputs(shape: tuple[int, ...], kind: str) -> tuple[torch.Tensor, ...]:
    b, h, g, t, s, dh = shape
    gen = torch.Generator().manual_seed(sum(shape))
    q = torch.randn(b, h, t, dh, generator=gen)
    k, v = torch.randn(b, g, s, dh, generator=gen), torch.randn(b, g, s, dh, generator=gen)
    mask = None
    if kind in ("padding", "causal+padding"):
        keep = torch.ones(b, s, dtype=torch.long)
        keep[-1, s // 2 :] = 0
        mask = combine_masks(
            None, keep, is_causal=False, q_len=t, k_len=s, device=q.device, dtype=q.dtype
        )
    elif kind == "boolean":
        mask = torch.rand(t, s, generator=gen) > 0.4
        mask[1] = False  # a query with nothing to attend to
    elif kind == "float":
        mask = torch.randn(b, 1, t, s, generator=gen)
    return q, k, v, mask


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES)
def test_observed_buffered_differentiated_and_weights_only_are_bitwise_equal(
    shape: tuple[int, ...], kind: str
) -> None:
    q, k, v, mask = _inputs(shape, kind)
    causal = kind.startswith("causal")
    with torch.inference_mode():
        context, weights = attention_core(q, k, v, mask, is_causal=causal)
        recorder = Recorder()
        seen_context, seen = attention_core(q, k, v, mask, is_causal=causal, observe=recorder)
        buffer = torch.full_like(weights, float("nan"))
        buffered_context, buffered = attention_core(
            q, k, v, mask, is_causal=causal, weights_out=buffer
        )
        _, alone = attention_core(q, k, None, mask, is_causal=causal)
    q_grad = q.clone().requires_grad_()
    grad_context, grad_weights = attention_core(q_grad, k, v, mask, is_causal=causal)
    assert grad_weights.requires_grad  # the differentiable backend ran
    for other in (seen, buffered, alone, grad_weights.detach()):
        assert torch.equal(weights, other)
    assert buffered is buffer
    for other in (seen_context, buffered_context, grad_context.detach()):
        assert torch.equal(context, other)
    steps = {s.name: s.tensor for s in recorder.steps}
    assert torch.equal(steps["probabilities"], weights)
    assert torch.equal(steps["scaled scores"], steps["raw scores"] * (1 / shape[-1] ** 0.5))
    assert not torch.isnan(weights).any()
    if kind == "boolean":
        assert (weights[:, :, 1] == 0).all()  # the empty row: zeros, never NaN


@pytest.mark.parametrize("kind", ["none", "padding", "causal"])
def test_module_weights_are_the_same_bits_traced_or_not(kind: str) -> None:
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(32, 4, num_kv_heads=2, rotary=RotaryEmbedding.default(8))
    ours.eval()
    x = torch.randn(2, 9, 32)
    kwargs = {
        "none": {},
        "padding": {"padding_mask": torch.tensor([[1] * 9, [1] * 6 + [0] * 3])},
        "causal": {"is_causal": True},
    }[kind]
    with torch.inference_mode():
        out, w = ours(x, **kwargs)
        traced_out, traced_w, _ = ours.forward_with_trace(x, **kwargs)
        alone = ours.attention_weights(x, **kwargs)
        fused_out, none = ours(x, need_weights=False, **kwargs)
    assert torch.equal(w, traced_w) and torch.equal(w, alone) and torch.equal(out, traced_out)
    assert none is None
    assert torch.allclose(fused_out, out, atol=1e-6)  # another kernel: equal up to rounding


def test_the_backend_is_picked_by_what_is_asked() -> None:
    q, k, v, _ = _inputs(SHAPES[0], "none")
    pick = attention_backend
    assert pick(q, k, v, need_weights=False, observed=False, weights_out=None) == "sdpa"
    assert pick(q, k, v, need_weights=True, observed=False, weights_out=None) == "eager-inplace"
    assert pick(q, k, v, need_weights=False, observed=True, weights_out=None) == "eager-inplace"
    assert pick(q, k, None, need_weights=False, observed=False, weights_out=None) != "sdpa"
    q.requires_grad_()
    assert pick(q, k, v, need_weights=True, observed=False, weights_out=None) == "eager"
    with torch.no_grad():
        assert pick(q, k, v, need_weights=True, observed=False, weights_out=None) == (
            "eager-inplace"
        )

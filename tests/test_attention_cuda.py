"""The same agreement on a CUDA GPU, in float32 and half precision. Skipped without CUDA.

Run on an NVIDIA H100 (2026-11-26, torch 2.11+cu130, transformers 5.23; BENCHMARKS.md §19):
all pass there, the MiniLM engine test on the float16-rounded stand-in that
``scripts/device/prepare.sh`` carries. The 16-bit
tolerances are those of ``tests/test_attention_half.py``, set from CPU measurements and the
dtype's rounding; GPU kernels round at the same steps, but cuBLAS may also reduce in 16 bits:
``python -m bench.bench_half --device cuda`` measures the GPU's own maxima.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mhsa import MultiHeadSelfAttention
from tests.test_attention_half import assert_16bit_close, assert_16bit_weights_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("causal", [False, True])
def test_cuda_float32_matches_cpu_and_torch(causal: bool) -> None:
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(64, 8, batch_first=True).eval()
    ours = MultiHeadSelfAttention.from_torch(ref).eval()
    x = torch.randn(2, 33, 64)
    cpu_out, cpu_w = ours(x, is_causal=causal)
    gpu = ours.to("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    out, w = gpu(x.cuda(), is_causal=causal)
    assert torch.allclose(out.cpu(), cpu_out, atol=1e-4)
    assert torch.allclose(w.cpu(), cpu_w, atol=1e-5)
    fast, _ = gpu(x.cuda(), is_causal=causal, need_weights=False)
    assert torch.allclose(fast.cpu(), cpu_out, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_precision_and_empty_rows(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(128, 8).eval()
    x = torch.randn(2, 64, 128)
    want, want_w = ours(x)
    half = ours.to("cuda", dtype)
    out, w = half(x.to("cuda", dtype))
    assert out.dtype == dtype
    assert_16bit_close(out, want, dtype)
    assert_16bit_weights_close(w, want_w, dtype)
    allowed = torch.ones(64, 64, dtype=torch.bool, device="cuda")
    allowed[3] = False
    fast, _ = half(x.to("cuda", dtype), mask=allowed, need_weights=False)
    assert not torch.isnan(fast).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_gqa_and_rope_match_cpu(dtype: torch.dtype) -> None:
    from mhsa.engine import RotaryEmbedding

    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(
        64, 8, num_kv_heads=2, rotary=RotaryEmbedding.default(8), bias=False
    ).eval()
    x = torch.randn(2, 40, 64)
    gates = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0])
    cpu_out, cpu_w = ours(x, is_causal=True, head_gates=gates)
    torch.backends.cuda.matmul.allow_tf32 = False
    gpu = ours.to("cuda", dtype)
    out, w = gpu(x.to("cuda", dtype), is_causal=True, head_gates=gates.cuda())
    assert w.dtype == dtype
    fast, _ = gpu(x.to("cuda", dtype), is_causal=True, head_gates=gates.cuda(), need_weights=False)
    if dtype == torch.float32:
        assert torch.allclose(out.float().cpu(), cpu_out, atol=1e-4)
        assert torch.allclose(w.float().cpu(), cpu_w, atol=1e-4)
        assert torch.allclose(fast.float().cpu(), cpu_out, atol=1e-4)
    else:  # rotary angles rounded to 16 bits too (see test_attention_half): short inputs only
        assert_16bit_close(out, cpu_out, dtype)
        assert_16bit_weights_close(w, cpu_w, dtype)
        assert_16bit_close(fast, cpu_out, dtype)


def test_cuda_backward_through_masks() -> None:
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(32, 4, num_kv_heads=2).cuda()
    x = torch.randn(2, 9, 32, device="cuda", requires_grad=True)
    keep = torch.tensor([[1] * 9, [1] * 6 + [0] * 3], device="cuda")
    out, _ = ours(x, padding_mask=keep, is_causal=True)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert ours.qkv.weight.grad.abs().sum() > 0


def test_cuda_engine_runs_the_model_through_our_module() -> None:
    import numpy as np

    import mhsa

    lm = mhsa.load_model("default", device="cuda")
    r = mhsa.attend("The cat sat on the mat.", model=lm, engine="mhsa", verify=True)
    assert r.device.startswith("cuda")
    assert r.max_abs_diff < 1e-4 and r.hidden_max_abs_diff < 1e-3
    np.testing.assert_allclose(r.attention.sum(-1), 1.0, atol=1e-5)

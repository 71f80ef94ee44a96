"""The same agreement on a CUDA GPU, in float32 and half precision. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mhsa import MultiHeadSelfAttention

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
    assert torch.allclose(out.float().cpu(), want, atol=5e-2)
    assert torch.allclose(w.float().cpu(), want_w, atol=2e-2)
    allowed = torch.ones(64, 64, dtype=torch.bool, device="cuda")
    allowed[3] = False
    fast, _ = half(x.to("cuda", dtype), attn_mask=allowed, need_weights=False)
    assert not torch.isnan(fast).any()

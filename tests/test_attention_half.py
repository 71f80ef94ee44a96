"""Our attention in float16 and bfloat16 on the CPU, against a float64 reference.

The tolerances are in units of the dtype's unit roundoff ``u`` (half of ``finfo.eps``: 2^-8
for bfloat16, 2^-11 for float16), the largest relative error of one rounding. The maxima they
are set from: ``python -m bench.bench_half`` (BENCHMARKS.md §9). ``tests/test_attention_cuda.py``
uses the same tolerances.
"""

from __future__ import annotations

import pytest
import torch

from mhsa import MultiHeadSelfAttention
from mhsa.engine import RotaryEmbedding

HALF = [torch.bfloat16, torch.float16]

#: largest absolute error of the weights, which lie in [0, 1]: one rounding of the weight (u)
#: plus the scores' error, of which softmax passes at most half (|dp| <= p (1 - p) 2 max|ds|)
WEIGHTS_ATOL = {
    torch.bfloat16: 4 * 2**-8,  # 4u: measured at most 1.7u (d_head 32-128, 16-512 tokens)
    torch.float16: 4 * 2**-11,  # 4u: measured at most 1.8u (the same sizes)
}
#: largest absolute error of the output, per unit of its largest magnitude: six roundings
#: (input, QKV, scores, softmax, context, W_O), each at most u of its value
OUTPUT_ATOL_PER_SCALE = {
    torch.bfloat16: 4 * 2**-8,  # 4u: measured at most 1.4u x max|output| (both paths)
    torch.float16: 4 * 2**-11,  # 4u: measured at most 1.7u x max|output| (both paths)
}


def assert_16bit_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """An output of the 16-bit module within its tolerance of the reference ``want``."""
    atol = OUTPUT_ATOL_PER_SCALE[dtype] * want.abs().max().item()
    err = (got.double().cpu() - want.double().cpu()).abs().max().item()
    assert err <= atol, f"{dtype}: output off by {err:.2e} > {atol:.2e}"


def assert_16bit_weights_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """Attention weights of the 16-bit module within their tolerance of ``want``."""
    err = (got.double().cpu() - want.double().cpu()).abs().max().item()
    assert err <= WEIGHTS_ATOL[dtype], f"{dtype}: weights off by {err:.2e}"


def _pair(d_model: int, heads: int, dtype: torch.dtype, **kwargs):
    """A float64 module and a 16-bit copy of it (the same float32 weights)."""
    ref = MultiHeadSelfAttention(d_model, heads, **kwargs).eval()
    torch.nn.init.normal_(ref.qkv.bias, std=0.1)
    torch.nn.init.normal_(ref.out.bias, std=0.1)
    low = MultiHeadSelfAttention(d_model, heads, **kwargs).eval()
    low.load_state_dict(ref.state_dict())
    return ref.double(), low.to(dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    ("d_head", "n"), [(32, 16), (64, 100), pytest.param(128, 256, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_16bit_attention_is_within_its_rounding_of_float64(dtype, d_head, n, causal) -> None:
    torch.manual_seed(d_head + n)
    ref, low = _pair(4 * d_head, 4, dtype)
    x = torch.randn(2, n, 4 * d_head, dtype=torch.float64)
    with torch.inference_mode():
        want, want_w = ref(x, is_causal=causal)
        out, w = low(x.to(dtype), is_causal=causal)
        fused, _ = low(x.to(dtype), is_causal=causal, need_weights=False)
    assert out.dtype == w.dtype == fused.dtype == dtype
    assert_16bit_weights_close(w, want_w, dtype)
    assert_16bit_close(out, want, dtype)
    assert_16bit_close(fused, want, dtype)
    # the tolerance is not loose enough to pass a float32 computation as 16-bit, nor tight
    # enough to need one: the 16-bit error is at least a tenth of a rounding
    u = torch.finfo(dtype).eps / 2
    assert (out.double() - want).abs().max() > 0.1 * u


@pytest.mark.parametrize("dtype", HALF)
def test_16bit_tolerance_catches_a_score_scale_5_percent_off(dtype) -> None:
    """The tolerances are tight enough to see a real error: the same module with its score scale
    5% off fails them (by 4x in bfloat16, 30x in float16)."""
    torch.manual_seed(0)
    ref, low = _pair(256, 4, dtype)
    x = torch.randn(2, 64, 256, dtype=torch.float64)
    with torch.inference_mode():
        want, _ = ref(x)
        low.scale *= 1.05
        out, _ = low(x.to(dtype))
    with pytest.raises(AssertionError, match="output off by"):
        assert_16bit_close(out, want, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_16bit_rows_with_nothing_to_attend_are_zero_not_nan(dtype) -> None:
    torch.manual_seed(0)
    _, low = _pair(64, 4, dtype)
    x = torch.randn(2, 9, 64).to(dtype)
    allowed = torch.ones(9, 9, dtype=torch.bool)
    allowed[3] = False
    with torch.inference_mode():
        out, w = low(x, mask=allowed)
        fused, _ = low(x, mask=allowed, need_weights=False)
    assert torch.equal(w[:, :, 3], torch.zeros_like(w[:, :, 3]))
    for o in (out, fused):
        assert not torch.isnan(o).any()
        assert torch.equal(o[:, 3], low.out.bias.expand_as(o[:, 3]))  # zero context: W_O's bias


@pytest.mark.parametrize("dtype", HALF)
def test_rotary_angles_stay_exact_in_16bit_modules(dtype) -> None:
    rotary = RotaryEmbedding.default(64).to(dtype)
    positions = torch.arange(4096)
    cos, sin = rotary.cos_sin(positions, dtype)
    exact = RotaryEmbedding.default(64).double()
    freqs = positions[:, None].double() * exact.inv_freq.double()
    want = torch.cat((freqs, freqs), dim=-1)
    u = torch.finfo(dtype).eps / 2
    assert (cos[0].double() - want.cos()).abs().max() <= 2 * u  # cos and sin: one rounding each
    assert (sin[0].double() - want.sin()).abs().max() <= 2 * u

"""MultiHeadSelfAttention against trusted implementations: torch's and transformers' own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mhsa import MultiHeadSelfAttention
from mhsa.engine.attention.module import RotaryEmbedding
from mhsa.engine.families.bert import load_bert
from mhsa.engine.families.distilbert import load_distilbert
from mhsa.engine.families.gpt2 import load_gpt2

TOL = 1e-5


def _pair(
    d_model: int, heads: int, seed: int = 0
) -> tuple[nn.MultiheadAttention, MultiHeadSelfAttention]:
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(d_model, heads, batch_first=True).eval()
    with torch.no_grad():  # non-zero biases so that they are tested too
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    return ref, MultiHeadSelfAttention.from_torch(ref).eval()


def _assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert torch.allclose(a, b, atol=TOL, rtol=0), float((a - b).abs().max())


@pytest.mark.parametrize(
    ("batch", "length", "d_model", "heads"),
    [(1, 1, 8, 1), (1, 7, 16, 4), (3, 13, 48, 6), (2, 32, 64, 8)],
)
def test_matches_torch_self_attention(batch: int, length: int, d_model: int, heads: int) -> None:
    ref, ours = _pair(d_model, heads)
    x = torch.randn(batch, length, d_model)
    want_out, want_w = ref(x, x, x, need_weights=True, average_attn_weights=False)
    out, w = ours(x)
    _assert_close(out, want_out)
    _assert_close(w, want_w)
    assert w.shape == (batch, heads, length, length)
    fast_out, none = ours(x, need_weights=False)
    assert none is None
    _assert_close(fast_out, want_out)


def test_padding_mask_matches_torch_and_zeroes_padded_keys() -> None:
    ref, ours = _pair(32, 4)
    x = torch.randn(3, 6, 32)
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    want_out, want_w = ref(
        x, x, x, key_padding_mask=attention_mask == 0, need_weights=True, average_attn_weights=False
    )
    out, w = ours(x, padding_mask=attention_mask)
    _assert_close(out, want_out)
    _assert_close(w, want_w)
    assert (w[1, :, :, 4:] == 0).all() and (w[2, :, :, 2:] == 0).all()
    _assert_close(ours(x, padding_mask=attention_mask, need_weights=False)[0], want_out)


def test_causal_mask_matches_torch_and_is_exactly_zero_above_diagonal() -> None:
    ref, ours = _pair(32, 4)
    x = torch.randn(2, 9, 32)
    forbidden = torch.ones(9, 9, dtype=torch.bool).triu(1)  # torch: True = may NOT attend
    want_out, want_w = ref(
        x, x, x, attn_mask=forbidden, need_weights=True, average_attn_weights=False
    )
    out, w = ours(x, is_causal=True)
    _assert_close(out, want_out)
    _assert_close(w, want_w)
    assert (w.triu(1) == 0).all()
    _assert_close(ours(x, is_causal=True, need_weights=False)[0], want_out)


def test_boolean_and_float_masks_match_torch() -> None:
    ref, ours = _pair(24, 3)
    x = torch.randn(2, 5, 24)
    allowed = torch.rand(5, 5) > 0.4
    allowed.fill_diagonal_(True)
    want_out, want_w = ref(
        x, x, x, attn_mask=~allowed, need_weights=True, average_attn_weights=False
    )
    _assert_close(ours(x, mask=allowed)[1], want_w)
    _assert_close(ours(x, mask=allowed)[0], want_out)
    bias = torch.randn(5, 5)
    want_out, want_w = ref(x, x, x, attn_mask=bias, need_weights=True, average_attn_weights=False)
    out, w = ours(x, mask=bias)
    _assert_close(out, want_out)
    _assert_close(w, want_w)
    _assert_close(ours(x, mask=bias, need_weights=False)[0], want_out)
    # per-head boolean mask [B, H, T, S]
    per_head = torch.rand(2, 3, 5, 5) > 0.5
    per_head[..., 0] = True
    w = ours(x, mask=per_head)[1]
    assert (w[~per_head] == 0).all()
    assert torch.allclose(w.sum(-1), torch.ones(2, 3, 5), atol=TOL)


def test_cross_attention_with_other_key_length_matches_torch() -> None:
    ref, ours = _pair(32, 8)
    q, kv = torch.randn(2, 4, 32), torch.randn(2, 11, 32)
    want_out, want_w = ref(q, kv, kv, need_weights=True, average_attn_weights=False)
    out, w = ours(q, kv)
    _assert_close(out, want_out)
    _assert_close(w, want_w)
    assert w.shape == (2, 8, 4, 11)
    v = torch.randn(2, 11, 32)
    want_out, _ = ref(q, kv, v, need_weights=True)
    _assert_close(ours(q, kv, v)[0], want_out)
    _assert_close(ours(q, kv, v, need_weights=False)[0], want_out)


def test_memory_is_cross_attention_matching_torch_with_masks_and_trace() -> None:
    ref, ours = _pair(32, 4)
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    memory_mask = torch.tensor([[1] * 7, [1, 1, 1, 1, 0, 0, 0]])
    bias = torch.randn(5, 7)  # a float [T, S] mask, as a relative position bias
    want_out, want_w = ref(
        x,
        memory,
        memory,
        key_padding_mask=memory_mask == 0,
        attn_mask=bias,
        need_weights=True,
        average_attn_weights=False,
    )
    kwargs = {"memory": memory, "padding_mask": memory_mask, "mask": bias}
    out, w = ours(x, **kwargs)
    _assert_close(out, want_out)
    _assert_close(w, want_w)
    assert (w[1, :, :, 4:] == 0).all()
    _assert_close(ours(x, need_weights=False, **kwargs)[0], want_out)
    _assert_close(ours.attention_weights(x, **kwargs), want_w)
    traced_out, traced_w, steps = ours.forward_with_trace(x, **kwargs)
    _assert_close(traced_out, want_out)
    _assert_close(traced_w, want_w)
    shapes = {s.name: tuple(s.tensor.shape) for s in steps}
    assert shapes["X"] == (2, 5, 32) and shapes["Q"] == (2, 5, 32)
    assert shapes["K"] == shapes["V"] == (2, 7, 32)
    assert shapes["per-head K"] == (2, 4, 7, 8)
    assert shapes["raw scores"] == shapes["probabilities"] == (2, 4, 5, 7)
    # the queries' own K would be [2, 4, 5, 8]: K came from the memory
    _assert_close(steps[2].tensor, memory @ ours.projections()[0][1].T + ours.qkv.bias[32:64])


def test_memory_refuses_key_too_a_wrong_width_and_rotary() -> None:
    ours = MultiHeadSelfAttention(16, 2)
    x = torch.randn(1, 3, 16)
    with pytest.raises(ValueError, match="either memory"):
        ours(x, x, memory=x)
    with pytest.raises(ValueError, match=r"memory must have shape \[batch, length, 16\]"):
        ours(x, memory=torch.randn(1, 3, 8))
    rotary = MultiHeadSelfAttention(16, 2, rotary=RotaryEmbedding.default(8))
    with pytest.raises(ValueError, match="rotary"):
        rotary(x, memory=x)


def test_rows_sum_to_one_and_fully_masked_rows_are_zero_not_nan() -> None:
    ours = MultiHeadSelfAttention(16, 2)
    x = torch.randn(1, 4, 16)
    allowed = torch.ones(4, 4, dtype=torch.bool)
    allowed[2] = False  # query 2 may attend nowhere
    out, w = ours(x, mask=allowed)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert (w[0, :, 2] == 0).all()
    sums = w.sum(-1)
    assert torch.allclose(sums[0, :, [0, 1, 3]], torch.ones(2, 3), atol=TOL)
    fast, _ = ours(x, mask=allowed, need_weights=False)
    assert not torch.isnan(fast).any()
    _assert_close(fast, out)


def test_trace_lists_every_step_and_equals_forward() -> None:
    ours = MultiHeadSelfAttention(32, 4).eval()
    x = torch.randn(1, 9, 32)
    out, w, steps = ours.forward_with_trace(x, is_causal=True)
    names = [s.name for s in steps]
    assert names == [
        "X",
        "Q",
        "K",
        "V",
        "per-head Q",
        "per-head K",
        "per-head V",
        "raw scores",
        "scaled scores",
        "masked scores",
        "probabilities",
        "per-head context",
        "concatenated heads",
        "output",
    ]
    shapes = {s.name: tuple(s.tensor.shape) for s in steps}
    assert shapes["per-head Q"] == (1, 4, 9, 8)
    assert shapes["raw scores"] == (1, 4, 9, 9)
    assert shapes["concatenated heads"] == (1, 9, 32)
    with torch.no_grad():
        f_out, f_w = ours(x, is_causal=True)
    _assert_close(out, f_out)
    _assert_close(w, f_w)
    assert torch.isinf(steps[names.index("masked scores")].tensor.triu(1)[0, 0, 0, 1:]).all()


def test_bad_sizes_raise_value_errors_naming_the_numbers() -> None:
    with pytest.raises(ValueError, match=r"d_model \(10\).*num_heads \(3\)"):
        MultiHeadSelfAttention(10, 3)
    ours = MultiHeadSelfAttention(8, 2)
    with pytest.raises(ValueError, match=r"\[batch, length, 8\]"):
        ours(torch.randn(1, 3, 9))
    with pytest.raises(ValueError, match="padding_mask"):
        ours(torch.randn(1, 3, 8), padding_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="mask must have shape"):
        ours(torch.randn(1, 3, 8), mask=torch.ones(2, 2, dtype=torch.bool))


def test_xavier_initialisation_and_zero_bias() -> None:
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(256, 8)
    bound = (6 / (256 + 256)) ** 0.5
    for w in ours.qkv.weight.detach().chunk(3):
        assert w.abs().max() <= bound
        assert float(w.std()) == pytest.approx(bound / 3**0.5, rel=0.05)
    assert (ours.qkv.bias == 0).all() and (ours.out.bias == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_on_cpu_stays_close(dtype: torch.dtype) -> None:
    _ref, ours = _pair(64, 8)
    x = torch.randn(2, 16, 64)
    want, want_w = ours(x)
    half = ours.to(dtype)
    out, w = half(x.to(dtype))
    assert out.dtype == dtype and w.dtype == dtype
    assert torch.allclose(out.float(), want, atol=5e-2)
    assert torch.allclose(w.float(), want_w, atol=2e-2)


def _layer_inputs(
    model: nn.Module, blocks: list[nn.Module], inputs: dict
) -> tuple[list[torch.Tensor], object]:
    """The hidden states entering each block during the model's own forward."""
    hidden: list[torch.Tensor] = []

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden.append((args[0] if args else kwargs["hidden_states"]).detach())

    handles = [b.register_forward_pre_hook(hook, with_kwargs=True) for b in blocks]
    try:
        with torch.no_grad():
            outputs = model(**inputs, output_attentions=True, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    return hidden, outputs


def test_every_minilm_layer_is_reproduced(minilm) -> None:
    model, tok = minilm.model, minilm.tokenizer
    enc = tok(
        ["The cat sat on the mat.", "Attention is all you need, they said."],
        padding=True,
        return_tensors="pt",
    )
    dense_out: list[torch.Tensor] = []
    hooks = [
        layer.attention.output.dense.register_forward_hook(lambda _m, _i, o: dense_out.append(o))
        for layer in model.encoder.layer
    ]
    try:
        with torch.no_grad():
            outputs = model(**enc, output_attentions=True, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    assert len(outputs.attentions) == 6
    for li, layer in enumerate(model.encoder.layer):
        ours = load_bert(layer.attention).eval()
        with torch.no_grad():
            out, w = ours(outputs.hidden_states[li], padding_mask=enc["attention_mask"])
        _assert_close(w, outputs.attentions[li])
        _assert_close(out, dense_out[li])  # the layer's attention output, before residual + norm


def test_tiny_gpt2_layers_are_reproduced_and_causal(tiny_gpt2_path) -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_gpt2_path, attn_implementation="eager").eval()
    ids = torch.randint(0, 30522, (2, 12))
    attn_out: list[torch.Tensor] = []
    hooks = [b.attn.register_forward_hook(lambda _m, _i, o: attn_out.append(o[0])) for b in model.h]
    try:
        hidden, outputs = _layer_inputs(model, [b.attn for b in model.h], {"input_ids": ids})
    finally:
        for h in hooks:
            h.remove()
    for li, block in enumerate(model.h):
        ours = load_gpt2(block.attn).eval()
        with torch.no_grad():
            out, w = ours(hidden[li], is_causal=True)
        want_out = attn_out[li]
        _assert_close(w, outputs.attentions[li])
        _assert_close(out, want_out)
        assert (w.triu(1) == 0).all()


def test_tiny_distilbert_layers_are_reproduced(tiny_distilbert_path) -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_distilbert_path, attn_implementation="eager").eval()
    ids = torch.randint(0, 30522, (1, 10))
    blocks = [layer.attention for layer in model.transformer.layer]
    hidden, outputs = _layer_inputs(model, blocks, {"input_ids": ids})
    assert len(hidden) == 2
    for li, block in enumerate(blocks):
        with torch.no_grad():
            _, w = load_distilbert(block).eval()(hidden[li])
        _assert_close(w, outputs.attentions[li])


def test_from_torch_rejects_unequal_dims() -> None:
    with pytest.raises(ValueError, match="kdim"):
        MultiHeadSelfAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))

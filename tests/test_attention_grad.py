"""Our module trains: gradients against torch's, gradcheck, a tiny training loop; head gates;
grouped-query attention and rotary positions against independent constructions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mhsa import MultiHeadSelfAttention
from mhsa.engine import RotaryEmbedding
from mhsa.engine.families.llama import load_llama

B, T, D, H = 2, 6, 16, 4


def _pair64(seed: int = 0) -> tuple[nn.MultiheadAttention, MultiHeadSelfAttention]:
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    return ref, MultiHeadSelfAttention.from_torch(ref).eval()


def _masks(kind: str) -> tuple[dict, dict]:
    """(our keyword arguments, torch's keyword arguments) for one kind of mask."""
    gen = torch.Generator().manual_seed(1)
    if kind == "none":
        return {}, {}
    if kind == "padding":
        keep = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
        return {"padding_mask": keep}, {"key_padding_mask": keep == 0}
    if kind == "causal":
        return {"is_causal": True}, {"attn_mask": torch.ones(T, T, dtype=torch.bool).triu(1)}
    if kind == "boolean":
        allowed = torch.rand(T, T, generator=gen) > 0.5
        allowed.fill_diagonal_(True)
        return {"mask": allowed}, {"attn_mask": ~allowed}
    bias = torch.randn(T, T, generator=gen, dtype=torch.float64)
    return {"mask": bias}, {"attn_mask": bias}


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("kind", ["none", "padding", "causal", "boolean", "float"])
def test_gradients_match_torch(kind: str, need_weights: bool) -> None:
    ref, ours = _pair64()
    ours_kw, ref_kw = _masks(kind)
    x = torch.randn(B, T, D, dtype=torch.float64)
    probe = torch.randn(B, T, D, dtype=torch.float64)  # a loss that weighs every output
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    (ref(x_ref, x_ref, x_ref, need_weights=False, **ref_kw)[0] * probe).sum().backward()
    (ours(x_ours, need_weights=need_weights, **ours_kw)[0] * probe).sum().backward()
    pairs = {
        "input": (x_ours.grad, x_ref.grad),
        "W_QKV": (ours.qkv.weight.grad, ref.in_proj_weight.grad),
        "b_QKV": (ours.qkv.bias.grad, ref.in_proj_bias.grad),
        "W_O": (ours.out.weight.grad, ref.out_proj.weight.grad),
        "b_O": (ours.out.bias.grad, ref.out_proj.bias.grad),
    }
    for name, (mine, theirs) in pairs.items():
        assert mine is not None and float(theirs.abs().max()) > 0, name
        assert torch.allclose(mine, theirs, atol=1e-10, rtol=1e-8), (name, mine - theirs)


@pytest.mark.slow
def test_gradcheck_with_padding_gates_gqa_and_rope() -> None:
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(
        8, 4, num_kv_heads=2, rotary=RotaryEmbedding.default(2), dtype=torch.float64
    )
    with torch.no_grad():
        ours.qkv.bias.normal_()
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    gates = torch.rand(2, 4, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])

    def f(x: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        return ours(x, padding_mask=keep, is_causal=True, head_gates=gates)[0]

    assert torch.autograd.gradcheck(f, (x, gates))


@pytest.mark.slow
def test_tiny_training_loop_learns_to_copy_the_previous_token() -> None:
    """One causal attention layer learns y[t] = x[t-1]: a previous-token head. Chance level is
    ln 8 = 2.08; the stated target is a loss under 0.05 after 300 steps."""
    torch.manual_seed(0)
    vocab, length, width = 8, 10, 32
    embed, positions = nn.Embedding(vocab, width), nn.Embedding(length, width)
    attention = MultiHeadSelfAttention(width, 4)
    readout = nn.Linear(width, vocab)
    parts = nn.ModuleList([embed, positions, attention, readout])
    optimiser = torch.optim.Adam(parts.parameters(), lr=1e-2)
    for _ in range(300):
        tokens = torch.randint(0, vocab, (64, length))
        x = embed(tokens) + positions.weight  # (B, T, D)
        out, _ = attention(x, is_causal=True, need_weights=False)
        logits = readout(out)[:, 1:]  # predict token t-1 at position t
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, :-1].reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    print(f"copy-previous-token loss after 300 steps: {loss.item():.4f}")
    assert loss.item() < 0.05, loss.item()
    with torch.no_grad():  # and the weights show it: each query's heaviest key is the previous one
        _, w = attention(embed(tokens) + positions.weight, is_causal=True)
    heaviest = w.mean(1).argmax(-1)[:, 1:]  # (B, T-1), averaged over heads
    assert (heaviest == torch.arange(length - 1)).float().mean() > 0.9


def test_gates_all_ones_reproduce_and_zero_removes_exactly_that_head() -> None:
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(D, H).eval()
    x = torch.randn(B, T, D)
    plain, w = ours(x)
    ones, w_ones = ours(x, head_gates=torch.ones(H))
    assert torch.equal(plain, ones) and torch.equal(w, w_ones)
    assert torch.equal(
        ours(x, need_weights=False, head_gates=torch.ones(B, H))[0], ours(x, need_weights=False)[0]
    )
    # by hand: the per-head context, head 2 zeroed, concatenated, through W_O
    _, _, steps = ours.forward_with_trace(x)
    context = next(s.tensor for s in steps if s.name == "per-head context").clone()
    context[:, 2] = 0
    by_hand = ours.out(context.transpose(1, 2).reshape(B, T, D))
    gates = torch.tensor([1.0, 1.0, 0.0, 1.0])
    gated, _ = ours(x, head_gates=gates)
    assert torch.allclose(gated, by_hand, atol=1e-6)
    assert (gated - plain).abs().max().item() > 1e-3
    assert torch.allclose(ours(x, head_gates=gates, need_weights=False)[0], by_hand, atol=1e-6)
    # per-example gates: example 0 loses head 2, example 1 keeps everything
    per_example, _ = ours(x, head_gates=torch.stack([gates, torch.ones(H)]))
    assert torch.allclose(per_example[0], by_hand[0], atol=1e-6)
    assert torch.allclose(per_example[1], plain[1], atol=1e-6)
    with pytest.raises(ValueError, match="head_gates"):
        ours(x, head_gates=torch.ones(H + 1))


def test_grouped_query_attention_equals_full_attention_with_repeated_kv() -> None:
    """G key/value heads shared by groups of query heads == H heads whose K/V weights repeat."""
    torch.manual_seed(0)
    gqa = MultiHeadSelfAttention(D, H, num_kv_heads=2).eval()
    dh = D // H
    w_q, w_k, w_v = gqa.qkv.weight.detach().split([D, 2 * dh, 2 * dh])
    b_q, b_k, b_v = gqa.qkv.bias.detach().split([D, 2 * dh, 2 * dh])
    with torch.no_grad():
        b_k.normal_()  # so that bias repetition is tested too
        b_v.normal_()

    def repeat(t: torch.Tensor) -> torch.Tensor:  # kv head g -> query heads 2g and 2g + 1
        return t.reshape(2, dh, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(D, *t.shape[1:])

    full = MultiHeadSelfAttention.from_projections(
        w_q, repeat(w_k), repeat(w_v), gqa.out.weight.detach(),
        b_q, repeat(b_k), repeat(b_v), gqa.out.bias.detach(), num_heads=H,
    ).eval()  # fmt: skip
    x = torch.randn(B, T, D)
    for kwargs in ({}, {"is_causal": True}):
        out, w = gqa(x, **kwargs)
        want, want_w = full(x, **kwargs)
        assert torch.allclose(out, want, atol=1e-6) and torch.allclose(w, want_w, atol=1e-6)
        assert torch.allclose(gqa(x, need_weights=False, **kwargs)[0], want, atol=1e-6)
    assert not torch.allclose(w[:, 0], w[:, 2])  # the groups differ


def test_rotary_scores_depend_on_relative_position_only() -> None:
    rope = RotaryEmbedding.default(8)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> float:
        cq, sq = rope.cos_sin(torch.tensor([m]), torch.float32)
        ck, sk = rope.cos_sin(torch.tensor([n]), torch.float32)
        return float((rope.rotate(q, cq, sq) * rope.rotate(k, ck, sk)).sum())

    assert score(3, 1) == pytest.approx(score(9, 7), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    assert score(0, 0) == pytest.approx(float((q * k).sum()), abs=1e-6)  # position 0: no turn


def test_rotary_matches_the_model_with_its_rope_scaling(tiny_llama_path) -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_llama_path, attn_implementation="eager").eval()
    default = RotaryEmbedding.default(8, model.config.rope_parameters["rope_theta"])
    assert not torch.allclose(model.rotary_emb.inv_freq, default.inv_freq)  # llama3 scaling
    block = model.layers[0].self_attn
    ours = load_llama(block, model.rotary_emb).eval()
    assert (ours.num_heads, ours.num_kv_heads, ours.d_head) == (4, 2, 8)
    positions = torch.arange(20)[None]
    x = torch.randn(1, 20, 32)
    cos, sin = model.rotary_emb(x, positions)
    assert torch.allclose(
        torch.stack(ours.rotary.cos_sin(positions, x.dtype)), torch.stack([cos, sin])
    )
    mask = torch.full((20, 20), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want, want_w = block(x, position_embeddings=(cos, sin), attention_mask=mask)
        out, w = ours(x, is_causal=True, positions=positions)
    assert torch.allclose(w, want_w, atol=1e-6) and torch.allclose(out, want, atol=1e-6)


def test_from_torch_refuses_what_it_cannot_load() -> None:
    with pytest.raises(ValueError, match="add_zero_attn"):
        MultiHeadSelfAttention.from_torch(nn.MultiheadAttention(8, 2, add_zero_attn=True))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadSelfAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="must divide"):
        MultiHeadSelfAttention(16, 4, num_kv_heads=3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_softmax_in_float32(dtype: torch.dtype) -> None:
    """Scores too large for a 16-bit exp: the float32 softmax still gives finite weights that
    sum to one, returned in the input dtype."""
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(D, H, scale=30.0).to(dtype).eval()
    x = (torch.randn(B, T, D) * 4).to(dtype)
    out, w = ours(x)
    assert w.dtype == dtype and out.dtype == dtype
    assert torch.isfinite(w).all() and torch.isfinite(out).all()
    assert torch.allclose(w.float().sum(-1), torch.ones(B, H, T), atol=1e-2)
    want = ours.float()(x.float())[1]
    assert torch.allclose(w.float(), want, atol=5e-2)


def test_an_observer_can_replace_an_intermediate() -> None:
    """Uniform weights put in at "probabilities": each head's context is the mean of its V."""
    torch.manual_seed(0)
    ours = MultiHeadSelfAttention(D, H).eval()
    x = torch.randn(B, T, D)

    def uniform(name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        return torch.full_like(tensor, 1.0 / T) if name == "probabilities" else None

    with torch.no_grad():
        out, w = ours(x, observe=uniform)
        v = torch.nn.functional.linear(x, *[p[2 * D :] for p in (ours.qkv.weight, ours.qkv.bias)])
        want = ours.out(v.mean(1, keepdim=True).expand(B, T, D))
    assert torch.equal(w, torch.full((B, H, T, T), 1.0 / T))
    assert torch.allclose(out, want, atol=1e-6)
    assert not torch.allclose(out, ours(x)[0], atol=1e-3)

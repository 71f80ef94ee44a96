"""The families of issue 39 part A (Qwen3, Gemma, Gemma 2, Gemma 3, OLMo 2, Phi-3, ModernBERT)
through our module, and every tool on each, on tiny random models saved to a folder and opened
by path (``tests.tiny.tiny_family``). One test per tool, parametrised over the families; each
checked against the plain transformers model (its eager attention, torch hooks).
"""

from __future__ import annotations

import itertools
from copy import deepcopy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mhsa
from mhsa.engine.attention.module import RMSNorm, attention_core
from mhsa.engine.runs.swap import OurPass, forward_through_ours, our_blocks
from tests.tiny import FAMILY_MODELS, save_tiny, tiny_family

TEXT = "The quick brown fox jumps over the lazy dog, then sleeps."
CLEAN, CORRUPTED = "the cat sat on the mat and the cat", "the cat sat on the mat and the dog"
DECODERS = [f for f in FAMILY_MODELS if f != "modernbert"]
TOL = 1e-4

_LOADED: dict[str, mhsa.engine.LoadedModel] = {}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("families")


def _model(name: str, folder) -> mhsa.engine.LoadedModel:
    if name not in _LOADED:
        path = save_tiny(folder / name, tiny_family(name))
        _LOADED[name] = mhsa.load_model(path, device="cpu")
    return _LOADED[name]


@pytest.fixture(params=FAMILY_MODELS)
def lm(request, folder) -> mhsa.engine.LoadedModel:
    return _model(request.param, folder)


@pytest.fixture(params=DECODERS)
def decoder(request, folder) -> mhsa.engine.LoadedModel:
    return _model(request.param, folder)


def _out_proj(block: torch.nn.Module) -> torch.nn.Module:
    return getattr(block, "o_proj", None) or block.Wo


def _inputs(lm: mhsa.engine.LoadedModel, texts: list[str]) -> dict[str, torch.Tensor]:
    return dict(lm.tokenizer(texts, return_tensors="pt", padding=True))


def _own_blocks(lm: mhsa.engine.LoadedModel) -> list[torch.nn.Module]:
    with lm.lock:
        return [b.original for b in our_blocks(lm)]


# --- the attention features, against transformers' own definitions ------------------------------


def test_sliding_windows_are_transformers_masks() -> None:
    """The band of ``attention_core`` is transformers' causal sliding window (Mistral, Gemma)
    and its bidirectional one (ModernBERT: distance <= window - 1), key for key."""
    from transformers.masking_utils import (
        sliding_window_bidirectional_overlay,
        sliding_window_causal_mask_function,
    )

    t, window = 9, 3
    q = torch.randn(1, 2, t, 4)
    for causal, allowed in (
        (True, sliding_window_causal_mask_function(window)),
        (False, sliding_window_bidirectional_overlay(window - 1)),
    ):
        _, weights = attention_core(q, q, None, is_causal=causal, sliding_window=window)
        index = torch.arange(t)
        want = allowed(0, 0, index[:, None], index[None, :])  # (T, T), transformers' own rule
        assert torch.equal(weights[0, 0] > 0, want), causal
        assert 0 < int(want.sum()) < t * t  # a band, not everything or nothing


def test_softcap_caps_the_scaled_scores_before_the_mask() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, 4, generator=gen) * 3 for _ in range(2))
    cap, scale = 0.7, 0.5
    _, weights = attention_core(q, k, None, is_causal=True, scale=scale, softcap=cap)
    scores = torch.tanh(q @ k.transpose(-1, -2) * scale / cap) * cap
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(weights, scores.softmax(-1), atol=1e-6, rtol=0)
    uncapped = attention_core(q, k, None, is_causal=True, scale=scale)[1]
    assert float((uncapped - weights).abs().max()) > 1e-2  # the cap changed something


@pytest.mark.parametrize(
    ("cls", "per_head", "unit_offset"),
    [
        ("qwen3.modeling_qwen3.Qwen3RMSNorm", True, False),
        ("gemma3.modeling_gemma3.Gemma3RMSNorm", True, True),
        ("olmo2.modeling_olmo2.Olmo2RMSNorm", False, False),
    ],
)
def test_rms_norm_is_the_families_own(cls: str, per_head: bool, unit_offset: bool) -> None:
    import importlib

    module, name = cls.rsplit(".", 1)
    theirs = getattr(importlib.import_module(f"transformers.models.{module}"), name)(
        8 if per_head else 24
    )
    with torch.no_grad():
        theirs.weight.normal_()
    eps = getattr(theirs, "variance_epsilon", getattr(theirs, "eps", None))
    ours = RMSNorm(theirs.weight, eps, unit_offset=unit_offset, per_head=per_head)
    x = torch.randn(2, 5, 24)  # 3 heads of 8
    want = theirs(x.view(2, 5, 3, 8)).reshape(2, 5, 24) if per_head else theirs(x)
    torch.testing.assert_close(ours(x), want, atol=1e-6, rtol=0)
    heads = x.view(2, 5, 3, 8).transpose(1, 2)  # (B, n, T, Dh): our module's layout
    torch.testing.assert_close(
        ours.per_head_layout(heads), want.view(2, 5, 3, 8).transpose(1, 2), atol=1e-6, rtol=0
    )


# --- point 2: the engine, store -----------------------------------------------------------------


@pytest.mark.slow
def test_engine_runs_through_our_module_and_equals_the_eager_model(lm, monkeypatch) -> None:
    own = _own_blocks(lm)
    classes = {type(b) for b in own}
    with monkeypatch.context() as patch:
        for cls in classes:

            def refuse(*_a, **_k):
                raise AssertionError("the model's own attention ran")

            patch.setattr(cls, "forward", refuse)
        ours = mhsa.attend(TEXT, model=lm, engine="mhsa")
        inputs = _inputs(lm, [TEXT, "A short one."])
        with torch.inference_mode():
            mine = forward_through_ours(lm, inputs, OurPass(need_weights=False)).last_hidden_state
    theirs = mhsa.attend(TEXT, model=lm, engine="transformers")
    per_layer = np.abs(ours.attention - theirs.attention).max(axis=(1, 2, 3))
    assert per_layer.max() <= TOL, per_layer
    with torch.inference_mode(), lm.lock:
        model_hidden = lm.model(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    assert float((mine - model_hidden)[real].abs().max()) <= TOL
    assert float(model_hidden.abs().max()) > 0.1
    verified = mhsa.attend(TEXT, model=lm, engine="mhsa", verify=True)
    assert verified.max_abs_diff <= TOL and verified.hidden_max_abs_diff <= TOL


def test_our_module_alone_reproduces_every_layer_without_the_models_mask(lm) -> None:
    """Window, soft-cap, q/k norms and the layer type's rope are our module's own options:
    given only each layer's input, our module gives the layer's weights (the model's eager
    attention, hooked) without the model's mask."""
    own = _own_blocks(lm)
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(layer: int):
        def hook(_m, args, kwargs, out):
            x = args[0] if args else kwargs["hidden_states"]
            seen[layer] = (x.detach(), out[1].detach())

        return hook

    handles = [b.register_forward_hook(keep(i), with_kwargs=True) for i, b in enumerate(own)]
    try:
        with torch.inference_mode(), lm.lock:
            lm.model(**_inputs(lm, [TEXT]))
    finally:
        for h in handles:
            h.remove()
    with lm.lock:
        blocks = our_blocks(lm)
    windows = [b.ours.sliding_window for b in blocks]
    assert any(w is not None for w in windows) or lm.config.model_type in ("gemma", "olmo2")
    for i, block in enumerate(blocks):
        x, want = seen[i]
        with torch.inference_mode():
            got = block.ours.attention_weights(x, is_causal=block.causal)
        assert float((got - want).abs().max()) <= 1e-5, (i, block.family.name)


def test_store_writes_our_weights_back_bit_for_bit(lm) -> None:
    with lm.lock:
        blocks = our_blocks(lm)
    for block in blocks:
        copy = deepcopy(block.original)
        params = dict(copy.named_parameters())
        assert len(params) >= 2
        with torch.no_grad():
            for p in params.values():
                p.add_(1.0)
        block.family.store(block.ours, copy)
        for name, p in block.original.named_parameters():
            assert torch.equal(params[name], p), (block.family.name, name)


# --- point 3: every tool ------------------------------------------------------------------------


def _zeroed_heads_run(lm, heads: list[tuple[int, int]]):
    """The plain model with ``heads`` zeroed before their output projection: attention and
    the language-model loss (causal) by hand."""
    own = _own_blocks(lm)
    d_head = lm.config.hidden_size // lm.config.num_attention_heads
    d_head = getattr(own[0], "head_dim", d_head)

    def zero(hs: list[int]):
        def hook(_m, args):
            x = args[0].clone()
            for h in hs:
                x[..., h * d_head : (h + 1) * d_head] = 0
            return (x, *args[1:])

        return hook

    handles = []
    for layer, group in itertools.groupby(sorted(heads), key=lambda lh: lh[0]):
        hs = [h for _, h in group]
        handles.append(_out_proj(own[layer]).register_forward_pre_hook(zero(hs)))
    inputs = _inputs(lm, [TEXT])
    try:
        with torch.inference_mode(), lm.lock:
            out = lm.model(**inputs, output_attentions=True)
            loss = None
            if lm.lm_head == "causal":
                loss = float(lm.head_model(**inputs, labels=inputs["input_ids"]).loss)
    finally:
        for h in handles:
            h.remove()
    return torch.stack([a[0] for a in out.attentions]).numpy(), loss


@pytest.mark.slow
def test_knock_outs_equal_zeroing_heads_before_the_models_output_projection(lm) -> None:
    off = [(0, 1), (0, 3)]
    a = mhsa.ablate(TEXT, [f"L{li}H{h}" for li, h in off], model=lm)
    attention, loss = _zeroed_heads_run(lm, off)
    np.testing.assert_allclose(a.ablated.attention, attention, atol=1e-5)
    assert np.abs(a.ablated.attention[1:] - a.intact.attention[1:]).max() > 1e-4
    if loss is not None:
        assert a.ablated_value == pytest.approx(loss, abs=1e-5)


def _gate_gradient(lm, layer: int, head: int) -> float:
    """d(language-model loss) / d(gate of ``head``) at every gate 1, by autograd on the plain
    model: the head's slice of the output projection's input multiplied by a gate."""
    block = _own_blocks(lm)[layer]
    gate = torch.ones((), requires_grad=True)
    cols = slice(head * block.head_dim, (head + 1) * block.head_dim)

    def gated(_m, args):
        x = args[0]
        ones = torch.ones(x.shape[-1])
        scale = torch.cat([ones[: cols.start], gate.expand(block.head_dim), ones[cols.stop :]])
        return (x * scale, *args[1:])

    handle = _out_proj(block).register_forward_pre_hook(gated)
    inputs = _inputs(lm, [TEXT])
    try:
        with lm.lock:
            lm.head_model(**inputs, labels=inputs["input_ids"]).loss.backward()
    finally:
        handle.remove()
    return float(gate.grad)


@pytest.mark.slow
def test_importance_and_pruning_equal_the_gates_by_hand(lm) -> None:
    """Michel et al.'s gradient importance is the loss's gradient at a gate on the plain model
    (autograd through hooks); the pruning curve starts at the intact model and, with every head
    pruned, ends at the model with every head zeroed before its output projection."""
    layers, heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    importance = mhsa.causal.head_importance([TEXT], model=lm, method="gradient")
    assert len(importance) == layers * heads and importance["importance"].max() > 1e-4
    curve = mhsa.causal.pruning_curve([TEXT], model=lm, steps=1, importance=importance)
    rows = curve[curve["order"] == "importance"].set_index("heads_pruned")
    intact = mhsa.ablate(TEXT, [], model=lm)
    assert rows.loc[0, "metric"] == pytest.approx(intact.intact_value, abs=1e-5)
    if lm.lm_head != "causal":  # ModernBERT: its masked-LM loss masks tokens of its own
        return
    for layer, head in ((0, 1), (1, 3)):
        by_hand = _gate_gradient(lm, layer, head)
        got = importance.loc[f"L{layer}H{head}", "gradient"]
        assert got == pytest.approx(by_hand, rel=1e-3, abs=1e-6)
    everything = [(li, h) for li in range(layers) for h in range(heads)]
    _, loss = _zeroed_heads_run(lm, everything)
    assert rows.loc[layers * heads, "metric"] == pytest.approx(loss, abs=1e-5)


@pytest.mark.slow
def test_value_norms_of_both_engines_agree(lm) -> None:
    ours = mhsa.attend(TEXT, model=lm, engine="mhsa", norms=True)
    theirs = mhsa.attend(TEXT, model=lm, engine="transformers", norms=True)
    np.testing.assert_allclose(ours.norms, theirs.norms, atol=1e-4)
    assert float(np.abs(ours.norms).max()) > 1e-3


def test_value_composition_equals_the_weights_by_hand(lm) -> None:
    """V composition (Elhage et al.) from the model's own W_V (its value projection fed the
    identity, through the family's ``values``) and W_O."""
    table = mhsa.analysis.head_composition(model=lm, kind="V")
    with lm.lock:
        blocks = our_blocks(lm)
    ovs = []
    for block in blocks:
        module, take = block.family.values(block.original)
        eye = torch.eye(lm.config.hidden_size)
        with torch.no_grad():
            w_v = take(module(eye)) - take(module(torch.zeros_like(eye)))  # (D, G Dh)
        ours = block.ours
        w_v = w_v.view(-1, ours.num_kv_heads, ours.d_head).repeat_interleave(ours.groups, 1)
        w_o = _out_proj(block.original).weight.detach().t().view(ours.num_heads, ours.d_head, -1)
        ovs += [w_v[:, h] @ w_o[h] for h in range(ours.num_heads)]
    h = blocks[0].ours.num_heads
    a, b = 1, h + 2  # L0H1 writes, L1H2 reads
    want = torch.linalg.norm(ovs[a] @ ovs[b]) / (
        torch.linalg.norm(ovs[a]) * torch.linalg.norm(ovs[b])
    )
    assert table.iloc[a, b] == pytest.approx(float(want), abs=1e-5)
    assert table.iloc[b, a] == 0  # a later head does not write into an earlier one


@pytest.mark.parametrize("what", ["k", "pattern"])
@pytest.mark.slow
def test_patching_keys_and_patterns_measures_each_head(decoder, what) -> None:
    """Keys (per key/value head) and patterns (z, q, v: by hand below): the runs are the
    model's own, and the heads' patches differ."""
    table = mhsa.causal.patch_heads(
        CLEAN, CORRUPTED, model=decoder, answer="mat", wrong="sat", what=what
    )
    assert table.attrs["what"] == what
    clean, corrupted = table.attrs["clean"], table.attrs["corrupted"]
    assert abs(clean - corrupted) > 1e-4
    assert np.isfinite(table["patched"]).all() and np.ptp(table["patched"]) > 0
    tok = decoder.tokenizer
    with torch.inference_mode(), decoder.lock:
        logits = decoder.head_model(**tok(CLEAN, return_tensors="pt")).logits[0, -1]
    a, w = (tok(" " + t, add_special_tokens=False)["input_ids"][0] for t in ("mat", "sat"))
    cap = getattr(decoder.config, "final_logit_softcapping", None)
    diff = float(logits[a] - logits[w])
    if cap is None:
        assert clean == pytest.approx(diff, abs=1e-4)


def _site(block: torch.nn.Module, what: str) -> tuple[torch.nn.Module, bool, int]:
    """Where ``what`` is among the model's own modules: ``(module, its input (True) or its
    output, offset of the activation's features in that tensor)``."""
    if what == "z":  # the concatenated heads entering the output projection
        return _out_proj(block), True, 0
    fused = getattr(block, "qkv_proj", None)  # Phi-3: q | k | v in one projection
    if fused is None:
        return getattr(block, f"{what}_proj"), False, 0
    q = block.config.num_attention_heads * block.head_dim
    kv = block.config.num_key_value_heads * block.head_dim
    return fused, False, {"q": 0, "k": q, "v": q + kv}[what]


@pytest.mark.parametrize(("what", "layer", "head"), [("z", 0, 2), ("q", 1, 2), ("v", 0, 1)])
def test_patching_equals_hand_patching_on_the_models_own_modules(
    decoder, what, layer, head
) -> None:
    """One head's ``what`` (z: before the output projection; q, v: the projections' outputs,
    before q/k norms and rotary positions; v per key/value head) taken from the clean run into
    the corrupted one, by hand with hooks on the plain model."""
    table = mhsa.causal.patch_heads(
        CLEAN, CORRUPTED, model=decoder, answer="mat", wrong="sat", what=what
    )
    block = _own_blocks(decoder)[layer]
    module, is_input, offset = _site(block, what)
    cols = slice(offset + head * block.head_dim, offset + (head + 1) * block.head_dim)
    tok = decoder.tokenizer
    clean, corrupted = (tok(t, return_tensors="pt") for t in (CLEAN, CORRUPTED))
    a, w = (tok(" " + t, add_special_tokens=False)["input_ids"][0] for t in ("mat", "sat"))
    seen: list[torch.Tensor] = []

    def replace(x: torch.Tensor) -> torch.Tensor:
        if not seen:  # the clean run: keep it
            seen.append(x.clone())
            return x
        y = x.clone()
        y[..., cols] = seen[0][..., cols]
        return y

    if is_input:
        handle = module.register_forward_pre_hook(lambda _m, args: (replace(args[0]), *args[1:]))
    else:
        handle = module.register_forward_hook(lambda _m, _a, out: replace(out))
    try:
        with torch.inference_mode(), decoder.lock:
            decoder.head_model(**clean)
            logits = decoder.head_model(**corrupted).logits[0, -1]
    finally:
        handle.remove()
    ours = table.set_index(["layer", "head"])["patched"][(layer, head)]
    assert ours == pytest.approx(float(logits[a] - logits[w]), abs=1e-4)
    assert abs(ours - table.attrs["corrupted"]) > 1e-6  # the patch moved the metric


def test_verify_catches_a_feature_left_out(folder) -> None:
    """Our module without Gemma 2's soft-cap, or with Gemma 3's ``1 + w`` q norm read as
    ``w``, disagrees with the model, and ``verify`` says so."""
    for name, change in (
        ("gemma2", lambda ours: setattr(ours, "softcap", None)),
        ("gemma3", lambda ours: setattr(ours.q_norm, "unit_offset", False)),
    ):
        lm = mhsa.load_model(_model(name, folder).name, device="cpu")  # a copy to break
        assert mhsa.attend(TEXT, model=lm, engine="mhsa", verify=True).max_abs_diff <= TOL
        with lm.lock:
            for block in our_blocks(lm):
                change(block.ours)
        wrong = mhsa.attend(TEXT, model=lm, engine="mhsa", verify=True)
        assert wrong.max_abs_diff > 1e-3, name


@pytest.mark.slow
def test_attribution_patching_equals_hand_autograd(decoder) -> None:
    table = mhsa.causal.attribution_patching(
        CLEAN, CORRUPTED, model=decoder, answer="mat", wrong="sat"
    )
    own = _own_blocks(decoder)
    tok = decoder.tokenizer
    a, w = (tok(" " + t, add_special_tokens=False)["input_ids"][0] for t in ("mat", "sat"))
    caches: list[torch.Tensor] = []
    hooks = [
        _out_proj(b).register_forward_pre_hook(lambda _m, args: caches.append(args[0])) for b in own
    ]
    try:
        with decoder.lock:
            with torch.no_grad():
                decoder.head_model(**tok(CLEAN, return_tensors="pt"))
            clean = [c.detach() for c in caches]
            caches.clear()
            for c in own:  # gradients flow to the heads' outputs, not to the weights
                c.requires_grad_(False)
            embeds = (
                decoder.head_model.get_input_embeddings()(
                    tok(CORRUPTED, return_tensors="pt")["input_ids"]
                )
                .detach()
                .requires_grad_(True)
            )
            logits = decoder.head_model(inputs_embeds=embeds).logits[0, -1]
            for c in caches:
                c.retain_grad()
            (logits[a] - logits[w]).backward()
    finally:
        for h in hooks:
            h.remove()
    d_head = own[0].head_dim
    hand = np.stack(
        [
            ((c.grad * (cl - c.detach()))[0].view(c.shape[1], -1, d_head).sum((0, 2))).numpy()
            for c, cl in zip(caches, clean, strict=True)
        ]
    )
    got = table["attribution"].to_numpy().reshape(hand.shape)
    np.testing.assert_allclose(got, hand, atol=1e-4)
    assert np.abs(hand).max() > 1e-5


def test_head_roles_agree_across_engines(lm) -> None:
    text = "one two three four one two three four"
    ours = mhsa.detect_heads([text], "previous token", model=lm, engine="mhsa")
    theirs = mhsa.detect_heads([text], "previous token", model=lm, engine="transformers")
    np.testing.assert_allclose(ours.to_numpy(dtype=float), theirs.to_numpy(dtype=float), atol=1e-4)


def test_direct_logit_attribution_sums_to_the_pre_cap_logit_difference(decoder) -> None:
    a = mhsa.causal.head_attribution(TEXT, model=decoder, answer="cat", wrong="dog")
    tok = decoder.tokenizer
    ids = tok(TEXT, return_tensors="pt")
    seen: list[torch.Tensor] = []
    head = decoder.head_model.get_output_embeddings()
    handle = head.register_forward_hook(lambda _m, _a, out: seen.append(out.detach()))
    try:
        with torch.inference_mode(), decoder.lock:
            decoder.head_model(**ids)  # the unembedding's output: before any final cap
    finally:
        handle.remove()
    c, d = (tok(" " + t, add_special_tokens=False)["input_ids"][0] for t in ("cat", "dog"))
    pre_cap = float(seen[0][0, -1, c] - seen[0][0, -1, d])
    assert a.logit_diff == pytest.approx(pre_cap, abs=1e-5)
    assert a.total == pytest.approx(pre_cap, abs=1e-4)
    assert np.abs(a.heads).max() > 1e-4
    cap = getattr(decoder.config, "final_logit_softcapping", None)
    assert a.logit_softcap == cap


def test_logit_lens_last_stage_is_the_models_logits(decoder) -> None:
    lens = mhsa.causal.logit_lens(TEXT, model=decoder, top_k=3)
    tok = decoder.tokenizer
    with torch.inference_mode(), decoder.lock:
        logits = decoder.head_model(**tok(TEXT, return_tensors="pt")).logits[0]
    np.testing.assert_allclose(lens.top_logits[-1], logits.topk(3).values.numpy(), atol=1e-4)


def test_information_flow_parts_sum_to_each_blocks_output(decoder) -> None:
    from mhsa.causal.attribution import residual_pass
    from mhsa.causal.flow import flow_contributions

    run = residual_pass(TEXT, model=decoder)
    tok = decoder.tokenizer
    with torch.inference_mode(), decoder.lock:
        hidden = decoder.model(**tok(TEXT, return_tensors="pt"), output_hidden_states=True)
    for layer in range(run.layers):
        added = run.resid_pre[layer] + run.attn_out[layer] + run.mlp_out[layer]
        torch.testing.assert_close(added, run.resid_post[layer], atol=1e-5, rtol=0)
        for position in (0, len(run.tokens) - 1):
            parts = run.head_outputs(layer, position).sum(0) + run.attn_bias(layer, position)
            torch.testing.assert_close(parts, run.attn_out[layer][position], atol=1e-5, rtol=0)
    # the residual entering layers 0 and 1 is the model's own hidden state there: Gemma's
    # embeddings scaled by sqrt(d_model) included
    for layer in (0, 1):
        torch.testing.assert_close(
            run.resid_pre[layer], hidden.hidden_states[layer][0], atol=1e-5, rtol=0
        )
    if decoder.config.model_type.startswith("gemma"):
        ids = tok(TEXT, return_tensors="pt")["input_ids"][0]
        raw = decoder.model.get_input_embeddings().weight[ids].detach()
        d = decoder.config.hidden_size
        torch.testing.assert_close(run.resid_pre[0], raw * d**0.5, atol=1e-5, rtol=1e-5)
    flow = flow_contributions(TEXT, model=decoder)
    sums = flow.attention.sum(axis=(2, 3)) + flow.attention_residual
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)


def test_flow_terms_through_a_norm_after_attention_sum_to_its_output(folder) -> None:
    """Gemma 2: the (key, head) terms each through the post-attention norm frozen at their
    query add up to the norm's output (the value biases are none)."""
    lm = _model("gemma2", folder)
    from mhsa.causal.attribution import residual_pass

    run = residual_pass(TEXT, model=lm)
    norm = run.post_attention_norm(0)
    assert norm is not None
    terms = torch.einsum("hqk,hkd,hdm->qm", run.probabilities[0], run.values[0], run.w_o[0])
    frozen = (
        norm(terms)
        if isinstance(norm.inverse_scale, float)
        else terms * norm.inverse_scale * norm.weight
    )
    torch.testing.assert_close(frozen, run.attn_out[0], atol=1e-5, rtol=0)
    raw = F.rms_norm(terms, (terms.shape[-1],), eps=None)  # a different scale: no longer equal
    assert float((raw - run.attn_out[0]).abs().max()) > 1e-3


def test_untrained_heads_keep_the_options_with_norms_at_identity(folder) -> None:
    """``fresh_copy`` (the ``mhsa-random`` engine): fresh projections, the same soft-cap,
    window and scale, q/k norms that scale nothing (Gemma's ``1 + w``: w = 0)."""
    for name in ("gemma2", "gemma3"):
        lm = _model(name, folder)
        with lm.lock:
            ours = our_blocks(lm)[0].ours
        fresh = ours.fresh_copy()
        options = ("softcap", "sliding_window", "scale")
        assert [getattr(fresh, o) for o in options] == [getattr(ours, o) for o in options]
        assert not torch.equal(fresh.qkv.weight, ours.qkv.weight)
        if ours.q_norm is not None:
            assert ours.q_norm.unit_offset and fresh.q_norm.unit_offset
            assert float(ours.q_norm.weight.abs().max()) > 0
            x = torch.randn(1, 3, 5, ours.d_head)
            want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ours.q_norm.eps)
            torch.testing.assert_close(fresh.q_norm.per_head_layout(x), want)
    r = mhsa.attend(TEXT, model=_model("gemma3", folder), engine="mhsa-random", seed=1)
    np.testing.assert_allclose(r.attention.sum(-1), 1.0, atol=1e-5)


def test_window_of_reads_the_block_then_its_config() -> None:
    from types import SimpleNamespace as NS

    from mhsa.engine.families.parts import window_of

    assert window_of(NS(sliding_window=None, config=NS(sliding_window=8))) is None  # full layer
    assert window_of(NS(sliding_window=5, config=NS(sliding_window=8))) == 5  # the block's own
    assert window_of(NS(config=NS(sliding_window=8))) == 8  # Mistral, Phi-3: every layer
    unused = NS(config=NS(sliding_window=8, use_sliding_window=False))  # Qwen2-MoE
    assert window_of(unused) is None


@pytest.mark.slow
def test_weights_trained_through_our_module_write_back_into_the_model(lm) -> None:
    """Training's write-back: our modules' weights (q/k norms included) changed, stored into
    the model's blocks (``store_our_weights``); the model's own forward then equals ours."""
    from mhsa.engine.runs.swap import store_our_weights, trainable_our_blocks

    copy = mhsa.load_model(lm.name, device="cpu")  # a copy whose weights may change
    before = mhsa.attend(TEXT, model=copy, engine="transformers").attention
    with copy.lock:
        blocks = trainable_our_blocks(copy)
        with torch.no_grad():
            for block in blocks:
                for p in block.ours.parameters():
                    p.add_(0.05 * torch.randn_like(p))
        store_our_weights(blocks)
        copy.cache.clear()  # our modules are rebuilt from the stored weights
    after = mhsa.attend(TEXT, model=copy, engine="mhsa", verify=True)
    assert after.max_abs_diff <= TOL and after.hidden_max_abs_diff <= TOL
    assert np.abs(after.attention - before).max() > 1e-3  # the model did change

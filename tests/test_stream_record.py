"""The stream recorder (``mhsa.engine.stream.record``) against computations of its own: the
attention ``mhsa.attend`` gives, the plain transformers model's hidden states and logits, the
model's weights applied by hand, a forward of the plain model whose eager attention function the
test patches itself, and the head gates ``mhsa.ablate`` switches heads off with."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import mhsa
import mhsa.engine.stream as stream
from mhsa.engine.families.registry import FAMILIES
from mhsa.engine.runs.swap import OurPass, our_blocks, run_with_our_blocks
from mhsa.engine.stream.recorder import NotRecordedError, StreamCache
from tests.tiny_families import loaded_tiny

TEXT = "the cat sat on the mat and the dog"
SEQ2SEQ = {"BART family", "T5 family"}
NAMES = [f.name for f in FAMILIES if f.name not in SEQ2SEQ]


def _tiny(name: str, tmp_path_factory) -> mhsa.LoadedModel:
    return loaded_tiny(name, tmp_path_factory.mktemp)


def _plain_inputs(lm: mhsa.LoadedModel, module) -> dict[str, torch.Tensor]:
    """The tokenizer's inputs of ``TEXT`` that ``module``'s forward names."""
    inputs = dict(lm.tokenizer(TEXT, return_tensors="pt"))
    named = inspect.signature(module.forward).parameters
    return {k: v for k, v in inputs.items() if k in named}


def _plain(lm: mhsa.LoadedModel):
    """The plain transformers model's outputs of ``TEXT`` (its head's where it has one), with
    every hidden state."""
    module = lm.head_model if lm.head_model is not None else lm.model
    with torch.inference_mode(), lm.lock:
        return module(**_plain_inputs(lm, module), output_hidden_states=True, return_dict=True)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> bool:
    a, b = a.float(), b.float()
    return a.shape == b.shape and float((a - b).abs().max()) <= tol * (1 + float(b.abs().max()))


@pytest.mark.parametrize("name", NAMES)
def test_every_family_matches_attend_and_the_plain_model(name: str, tmp_path_factory) -> None:
    lm = _tiny(name, tmp_path_factory)
    cache = stream.record(TEXT, model=lm)
    ids = lm.tokenizer(TEXT)["input_ids"]
    assert cache.tokens == tuple(lm.tokenizer.convert_ids_to_tokens(ids))
    assert cache.model == lm.display_name and list(cache.keys()) == list(cache.points)
    attention = mhsa.attend(TEXT, model=lm).attention
    layers = attention.shape[0]
    for layer in range(layers):
        pattern = cache[f"L{layer}.pattern"]
        assert pattern.dtype == torch.float32 and pattern.device.type == "cpu"
        np.testing.assert_allclose(pattern.numpy(), attention[layer], atol=1e-5, rtol=0)
    plain = _plain(lm)
    hidden = plain.hidden_states
    assert len(hidden) == layers + 1
    for layer in range(layers):
        assert _close(cache[f"L{layer}.resid_pre"], hidden[layer][0]), (name, layer)
    for layer in range(layers - 1):
        assert _close(cache[f"L{layer}.resid_post"], hidden[layer + 1][0]), (name, layer)
    last = cache[f"L{layers - 1}.resid_post"]
    if "final_norm_in" in cache:
        assert _close(cache["final_norm_in"], last)
        norm = mhsa.engine.families.layout.final_norm_of(lm)
        with torch.inference_mode():
            normed = norm(last[None])[0]
        # the last hidden state is the final norm's output, or its input where the model says so
        assert _close(hidden[-1][0], normed) or _close(hidden[-1][0], last), name
    else:
        assert _close(last, hidden[-1][0]), name
    if lm.head_model is not None:
        assert _close(cache["logits"], plain.logits[0]), name
    else:
        assert "logits" not in cache


@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_encoder_decoders_match_attend_and_the_plain_model(name: str, tmp_path_factory) -> None:
    """The encoder's (E), the decoder's (D) and the cross attention's (C) patterns are
    ``mhsa.attend``'s; the layers' inputs and outputs the plain model's hidden states of each
    stack; the logits its logits, over the decoder tokens ``attend`` shows."""
    lm = _tiny(name, tmp_path_factory)
    cache = stream.record(TEXT, model=lm)
    result = mhsa.attend(TEXT, model=lm)
    assert cache.decoder_tokens == tuple(result.decoder_tokens)
    pairs = (
        ("E", result.attention),
        ("D", result.decoder_attention),
        ("C", result.cross_attention),
    )
    for prefix, attention in pairs:
        for layer in range(attention.shape[0]):
            mine = cache[f"{prefix}{layer}.pattern"].numpy()
            np.testing.assert_allclose(mine, attention[layer], atol=1e-5, rtol=0)
    t_enc, t_dec = len(cache.tokens), len(cache.decoder_tokens)
    assert cache["C0.pattern"].shape == (4, t_dec, t_enc)
    assert cache["C0.k"].shape == (4, t_enc, 8) and cache["C0.q"].shape == (4, t_dec, 8)
    assert "C0.resid_pre" not in stream.stream_points(lm)
    encoded = mhsa.engine.encoding.encode(lm, TEXT, None, None)
    with torch.inference_mode(), lm.lock:
        plain = lm.head_model(**encoded.inputs, output_hidden_states=True, return_dict=True)
    for prefix, hidden in (("E", plain.encoder_hidden_states), ("D", plain.decoder_hidden_states)):
        layers = len(hidden) - 1
        for layer in range(layers):
            assert _close(cache[f"{prefix}{layer}.resid_pre"], hidden[layer][0]), (prefix, layer)
        for layer in range(layers - 1):
            assert _close(cache[f"{prefix}{layer}.resid_post"], hidden[layer + 1][0])
    assert _close(cache["logits"], plain.logits[0])
    if "final_norm_in" in cache:  # T5: the decoder's last hidden state is its final norm's
        assert _close(cache["final_norm_in"], cache[f"D{layers - 1}.resid_post"])
    else:
        assert _close(cache[f"D{layers - 1}.resid_post"], plain.decoder_hidden_states[-1][0])


def test_a_replaced_cross_pattern_reaches_the_logits(tmp_path_factory) -> None:
    lm = _tiny("BART family", tmp_path_factory)
    intact = stream.record(TEXT, model=lm, points=["C0.pattern", "logits"])
    t_dec, t_enc = intact["C0.pattern"].shape[1:]
    uniform = torch.full((4, t_dec, t_enc), 1.0 / t_enc)
    cache = stream.record(TEXT, model=lm, replace={"C0.pattern": uniform})
    assert _close(cache["C0.z"], uniform @ cache["C0.v"], 1e-5)
    assert float((cache["logits"] - intact["logits"]).abs().max()) > 1e-5


def test_minilm_and_the_toy_model_match_attend(minilm) -> None:
    for model in (minilm, "toy:induction"):
        lm = mhsa.engine.models.loading.resolve_model(model)
        text = TEXT if model is minilm else "a b c d a b c"
        attention = mhsa.attend(text, model=lm).attention
        cache = stream.record(text, model=lm, points=["*.pattern", "*.resid_post"])
        for layer in range(attention.shape[0]):
            np.testing.assert_allclose(
                cache[f"L{layer}.pattern"].numpy(), attention[layer], atol=1e-5
            )
        assert len(cache) == 2 * attention.shape[0]


@pytest.mark.parametrize("name", ["GPT-2 family", "Llama-style"])
def test_the_parts_add_up_and_z_through_w_o_is_attn_out(name: str, tmp_path_factory) -> None:
    lm = _tiny(name, tmp_path_factory)
    cache = stream.record(TEXT, model=lm)
    base = lm.model
    for layer in range(2):
        parts = cache[f"L{layer}.resid_pre"] + cache[f"L{layer}.attn_out"]
        assert _close(parts + cache[f"L{layer}.mlp_out"], cache[f"L{layer}.resid_post"])
        z = cache[f"L{layer}.z"]  # [H, T, d_head]
        merged = z.transpose(0, 1).reshape(z.shape[1], -1)  # [T, H d_head]
        if name == "GPT-2 family":
            proj = base.h[layer].attn.c_proj  # Conv1D: [in, out]
            by_hand = merged @ proj.weight + proj.bias
        else:
            proj = base.layers[layer].self_attn.o_proj
            by_hand = merged @ proj.weight.T + (0 if proj.bias is None else proj.bias)
        assert _close(by_hand, cache[f"L{layer}.attn_out"], 1e-5)
        if name == "Llama-style":  # grouped-query attention: 2 key/value heads for 4 queries
            assert cache[f"L{layer}.k"].shape[0] == 2 and cache[f"L{layer}.q"].shape[0] == 4


def _uniform(t: int, heads: int, causal: bool) -> torch.Tensor:
    allowed = torch.ones(t, t).tril() if causal else torch.ones(t, t)
    return (allowed / allowed.sum(-1, keepdim=True)).expand(heads, t, t).clone()


def _patched_logits(lm: mhsa.LoadedModel, modeling, target, pattern, monkeypatch) -> torch.Tensor:
    """The plain model's logits (a model without a head: its last hidden state) with
    ``target``'s probabilities set to ``pattern``, through its eager attention function
    (``modeling.eager_attention_forward``) patched here."""
    own = modeling.eager_attention_forward

    def patched(module, query, key, value, attention_mask, *args, **kwargs):
        out, weights = own(module, query, key, value, attention_mask, *args, **kwargs)
        if module is not target:
            return out, weights
        weights = pattern[None].to(value.dtype)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    assert lm.config._attn_implementation == "eager"
    module = lm.head_model if lm.head_model is not None else lm.model
    with monkeypatch.context() as m:
        m.setattr(modeling, "eager_attention_forward", patched)
        with torch.inference_mode(), lm.lock:
            out = module(**_plain_inputs(lm, module))
    return out.logits[0] if lm.head_model is not None else out.last_hidden_state[0]


def test_a_replaced_pattern_is_what_the_plain_gpt2_would_give(tmp_path_factory, monkeypatch):
    from transformers.models.gpt2 import modeling_gpt2

    lm = _tiny("GPT-2 family", tmp_path_factory)
    t = len(lm.tokenizer(TEXT)["input_ids"])
    uniform = _uniform(t, 4, causal=True)
    cache = stream.record(TEXT, model=lm, replace={"L0.pattern": uniform})
    theirs = _patched_logits(lm, modeling_gpt2, lm.model.h[0].attn, uniform, monkeypatch)
    assert _close(cache["logits"], theirs)
    changed = (cache["logits"] - _plain(lm).logits[0]).abs().max()
    assert float(changed) > 1e-5, float(changed)  # the replacement changed them
    assert torch.equal(cache["L0.pattern"], uniform)  # the value after replacement


def test_a_replaced_pattern_is_what_the_plain_bert_would_give(tmp_path_factory, monkeypatch):
    from transformers.models.bert import modeling_bert

    lm = _tiny("BERT family", tmp_path_factory)
    t = len(lm.tokenizer(TEXT)["input_ids"])
    uniform = _uniform(t, 4, causal=False)
    target = lm.model.encoder.layer[0].attention.self
    cache = stream.record(TEXT, model=lm, replace={"L0.pattern": uniform}, points=["logits"])
    assert cache.points == ("logits",)
    theirs = _patched_logits(lm, modeling_bert, target, uniform, monkeypatch)
    assert _close(cache["logits"], theirs)
    assert float((cache["logits"] - _plain(lm).logits[0]).abs().max()) > 1e-5


@pytest.mark.parametrize("name", ["GPT-2 family", "Qwen3"])
def test_a_knocked_out_head_of_z_is_the_head_gate(name: str, tmp_path_factory) -> None:
    lm = _tiny(name, tmp_path_factory)

    def off(z: torch.Tensor) -> torch.Tensor:
        z = z.clone()
        z[1] = 0
        return z

    cache = stream.record(TEXT, model=lm, replace={"L0.z": off}, points=["L1.pattern", "logits"])
    ablation = mhsa.ablate(TEXT, [(0, 1)], model=lm)
    intact, ablated = ablation.intact.attention[1], ablation.ablated.attention[1]
    change = cache["L1.pattern"].numpy() - intact
    np.testing.assert_allclose(change, ablated - intact, atol=1e-6, rtol=0)
    assert np.abs(change).max() > 1e-5  # the knock-out shows in the layer above
    inputs = _plain_inputs(lm, lm.head_model)
    with torch.inference_mode(), lm.lock:
        gates = {0: torch.tensor([1.0, 0.0, 1.0, 1.0])}
        out = run_with_our_blocks(lm, our_blocks(lm), OurPass(gates=gates), inputs, with_head=True)
    assert _close(cache["logits"], out.logits[0])


def test_only_what_is_asked_is_recorded(tmp_path_factory) -> None:
    lm = _tiny("GPT-2 family", tmp_path_factory)
    cache = stream.record(TEXT, model=lm, points=["L1.pattern"])
    assert isinstance(cache, StreamCache) and cache.points == ("L1.pattern",) and len(cache) == 1
    with pytest.raises(NotRecordedError, match=r"L1\.pattern") as raised:
        cache["L0.pattern"]
    assert isinstance(raised.value, mhsa.InputError) and isinstance(raised.value, KeyError)
    assert "L0.pattern" not in cache and cache.get("L0.z") is None
    with pytest.raises(TypeError):
        cache["L1.pattern"] = torch.zeros(1)  # type: ignore[index]
    zs = stream.record(TEXT, model=lm, points=["*.z"])
    assert zs.points == ("L0.z", "L1.z") and zs["L0.z"].shape[0] == 4


def test_bad_names_and_shapes_are_input_errors(tmp_path_factory) -> None:
    lm = _tiny("GPT-2 family", tmp_path_factory)
    with pytest.raises(mhsa.InputError, match=r"L0\.resid_pre, L0\.q") as raised:
        stream.record(TEXT, model=lm, points=["L9.pattern"])
    assert "logits" in str(raised.value)
    with pytest.raises(mhsa.InputError, match="no point"):
        stream.record(TEXT, model=lm, replace={"L0.nonsense": torch.zeros(1)})
    t = len(lm.tokenizer(TEXT)["input_ids"])
    with pytest.raises(mhsa.InputError, match=rf"L0\.pattern.*\[4, 2, 2\].*\[4, {t}, {t}\]"):
        stream.record(TEXT, model=lm, replace={"L0.pattern": torch.zeros(4, 2, 2)})
    with pytest.raises(mhsa.InputError, match="list"):
        stream.record(TEXT, model=lm, points="L0.z")


def test_grad_reaches_a_replaced_pattern(tmp_path_factory) -> None:
    lm = _tiny("GPT-2 family", tmp_path_factory)
    t = len(lm.tokenizer(TEXT)["input_ids"])
    pattern = _uniform(t, 4, causal=True).requires_grad_(True)
    cache = stream.record(TEXT, model=lm, replace={"L0.pattern": pattern}, grad=True)
    assert cache["logits"].requires_grad
    cache["logits"][-1].sum().backward()
    assert pattern.grad is not None and float(pattern.grad.abs().sum()) > 0
    assert all(p.grad is None for p in lm.model.parameters())  # the model's weights untouched


def test_the_package_exports_record_lazily() -> None:
    import importlib

    importlib.import_module("mhsa.engine.stream.recorder")
    assert stream.record is importlib.import_module("mhsa.engine.stream.recorder").record
    from mhsa.engine.stream import StreamCache as exported

    assert exported is StreamCache
    assert "record" in dir(stream)


def test_q_k_v_by_hand_on_gpt2(tmp_path_factory) -> None:
    """GPT-2's queries, keys and values from its own c_attn applied to ln_1 of the layer's
    input, and the pattern as their softmax."""
    lm = _tiny("GPT-2 family", tmp_path_factory)
    cache = stream.record(TEXT, model=lm)
    for layer in range(2):
        block = lm.model.h[layer]
        heads, d = block.attn.num_heads, block.attn.embed_dim
        with torch.inference_mode():
            qkv = block.ln_1(cache[f"L{layer}.resid_pre"]) @ block.attn.c_attn.weight
            qkv = qkv + block.attn.c_attn.bias
        t = qkv.shape[0]
        q, k, v = (part.view(t, heads, d // heads).transpose(0, 1) for part in qkv.split(d, -1))
        for point, mine in (("q", q), ("k", k), ("v", v)):
            assert _close(cache[f"L{layer}.{point}"], mine, 1e-5), (layer, point)
        scores = q @ k.transpose(-1, -2) * block.attn.scaling
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        assert _close(cache[f"L{layer}.pattern"], scores.softmax(-1), 1e-5)
        assert _close(cache[f"L{layer}.z"], cache[f"L{layer}.pattern"] @ v, 1e-5)


def test_rotated_q_and_k_give_the_pattern_on_llama(tmp_path_factory) -> None:
    """Llama's q and k are the rotated ones the scores read: softmax(q k^T * scaling + causal
    mask) with each key/value head serving its group of query heads is the pattern."""
    lm = _tiny("Llama-style", tmp_path_factory)
    cache = stream.record(TEXT, model=lm, points=["*.q", "*.k", "*.v", "*.pattern", "*.z"])
    for layer in range(2):
        q, k, v = (cache[f"L{layer}.{p}"] for p in "qkv")
        groups = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
        t = q.shape[1]
        scores = q @ k.transpose(-1, -2) * lm.model.layers[layer].self_attn.scaling
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        assert _close(cache[f"L{layer}.pattern"], scores.softmax(-1), 1e-5)
        assert _close(cache[f"L{layer}.z"], cache[f"L{layer}.pattern"] @ v, 1e-5)


def test_the_pass_stops_once_what_is_asked_is_in(tmp_path_factory) -> None:
    lm = _tiny("GPT-2 family", tmp_path_factory)
    ran: list[str] = []
    watched = {"h1": lm.model.h[1], "ln_f": lm.model.ln_f, "lm_head": lm.head_model.lm_head}
    handles = [m.register_forward_hook(lambda *_a, n=n: ran.append(n)) for n, m in watched.items()]
    try:
        stream.record(TEXT, model=lm, points=["L0.resid_post"])
        assert ran == []
        stream.record(TEXT, model=lm, points=["final_norm_in"])
        assert ran == ["h1"]  # no final norm, no vocabulary-wide logits
        stream.record(TEXT, model=lm, points=["logits"])
        assert ran == ["h1", "h1", "ln_f", "lm_head"]
    finally:
        for handle in handles:
            handle.remove()
    assert len(stream.record(TEXT, model=lm, points=[])) == 0


def test_layer_points_replace_in_the_real_pass(tmp_path_factory) -> None:
    lm = _tiny("GPT-2 family", tmp_path_factory)
    t, d = len(lm.tokenizer(TEXT)["input_ids"]), 32
    x = torch.randn(t, d, generator=torch.Generator().manual_seed(0))
    cache = stream.record(TEXT, model=lm, replace={"L0.resid_post": x}, points=["L1.resid_pre"])
    assert torch.equal(cache["L1.resid_pre"], x)
    cache = stream.record(
        TEXT, model=lm, replace={"L0.mlp_out": torch.zeros(t, d)}, points=["L0.*"]
    )
    parts = cache["L0.resid_pre"] + cache["L0.attn_out"]
    assert _close(cache["L0.resid_post"], parts, 1e-5)
    cache = stream.record(
        TEXT, model=lm, replace={"L0.attn_out": torch.zeros(t, d)}, points=["L0.*"]
    )
    with torch.inference_mode():
        assert _close(cache["L0.mlp_in"], lm.model.h[0].ln_2(cache["L0.resid_pre"]), 1e-5)
    plain = stream.record(TEXT, model=lm, points=["L1.resid_pre"])["L1.resid_pre"]
    shifted = stream.record(
        TEXT, model=lm, replace={"L1.resid_pre": lambda r: r + 1}, points=["L1.resid_pre"]
    )
    assert _close(shifted["L1.resid_pre"], plain + 1, 1e-6)


def test_a_replaced_pattern_is_what_the_plain_minilm_would_give(minilm, monkeypatch) -> None:
    """The embedded MiniLM has no head: its last layer's output against the plain model's
    last hidden state with layer 0's eager attention patched."""
    from transformers.models.bert import modeling_bert

    t = len(minilm.tokenizer(TEXT)["input_ids"])
    uniform = _uniform(t, minilm.config.num_attention_heads, causal=False)
    last = f"L{minilm.config.num_hidden_layers - 1}.resid_post"
    cache = stream.record(TEXT, model=minilm, replace={"L0.pattern": uniform}, points=[last])
    target = minilm.model.encoder.layer[0].attention.self
    theirs = _patched_logits(minilm, modeling_bert, target, uniform, monkeypatch)
    assert _close(cache[last], theirs)
    intact = stream.record(TEXT, model=minilm, points=[last])[last]
    assert float((cache[last] - intact).abs().max()) > 1e-3


@pytest.mark.parametrize("name", ["GPT-2 family", "Llama-style"])
def test_the_residual_pass_reads_the_recorder(name: str, tmp_path_factory) -> None:
    """``residual_pass``'s parts are the recorder's points: the pass is one source of the
    stream, not a second recording of it."""
    from mhsa.engine.stream.residual import residual_pass

    lm = _tiny(name, tmp_path_factory)
    run = residual_pass(TEXT, model=lm)
    cache = stream.record(TEXT, model=lm)
    assert run.layers == 2 and run.resid_pre[0].device == lm.device
    pairs = (
        ("resid_pre", run.resid_pre),
        ("pattern", run.probabilities),
        ("z", run.context),
        ("attn_out", run.attn_out),
        ("mlp_out", run.mlp_out),
        ("resid_post", run.resid_post),
    )
    for point, parts in pairs:
        for layer in range(run.layers):
            mine = parts[layer].cpu()
            assert torch.equal(mine, cache[f"L{layer}.{point}"]), (point, layer)
    groups = run.heads // cache["L0.v"].shape[0]
    assert torch.equal(run.values[1].cpu(), cache["L1.v"].repeat_interleave(groups, 0))
    assert torch.equal(run.logits.cpu(), cache["logits"])
    last = residual_pass(TEXT, model=lm, all_logits=False)
    assert _close(last.logits.cpu(), cache["logits"][-1:], 1e-5)

"""The model runs through our module: every attention block swapped for ours, end to end.

Each model is saved to a folder and loaded by path, as a user would. With engine ``mhsa`` the
model's own attention blocks are never called (counted), and every layer's attention and the final
hidden state equal the model's own forward.
"""

from __future__ import annotations

from copy import deepcopy

import numpy as np
import pytest
import torch

import mhsa
from mhsa.engine.runs.swap import OurPass, forward_through_ours, our_blocks
from tests.tiny import DECODER_SIZES, ENGINE_MODELS, save_tiny

TEXT = "The quick brown fox jumps over the lazy dog, then sleeps."
TOL = 1e-4
MODELS = list(ENGINE_MODELS)


@pytest.fixture(params=MODELS)
def model(request) -> mhsa.engine.LoadedModel:
    value = request.getfixturevalue(request.param)
    if isinstance(value, mhsa.engine.LoadedModel):
        return value
    return _loaded(value)


_LOADED: dict[str, mhsa.engine.LoadedModel] = {}


def _loaded(path: str) -> mhsa.engine.LoadedModel:
    if path not in _LOADED:
        _LOADED[path] = mhsa.load_model(path, device="cpu")
    return _LOADED[path]


def _attention_classes(lm: mhsa.engine.LoadedModel) -> set[type]:
    """The classes of the model's own attention blocks and of what they call inside."""
    classes = set()
    with lm.lock:
        for block in our_blocks(lm):
            classes.add(type(block.original))
            for child in block.original.children():
                if hasattr(child, "query"):  # BERT: the inner self-attention
                    classes.add(type(child))
    return classes


@pytest.fixture
def count_eager_attention_calls(monkeypatch):
    """Patch the forward of the model's attention classes to count their calls."""

    def patch(lm: mhsa.engine.LoadedModel) -> dict[str, int]:
        calls: dict[str, int] = {}
        for cls in _attention_classes(lm):
            original = cls.forward
            calls[cls.__name__] = 0

            def counting(self, *args, __original=original, __name=cls.__name__, **kwargs):
                calls[__name] += 1
                return __original(self, *args, **kwargs)

            monkeypatch.setattr(cls, "forward", counting)
        return calls

    return patch


def _inputs(lm: mhsa.engine.LoadedModel, texts: list[str]) -> dict[str, torch.Tensor]:
    tok = lm.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return dict(tok(texts, return_tensors="pt", padding=True))


@pytest.mark.slow
def test_engine_runs_through_our_module_and_equals_the_model(
    model: mhsa.engine.LoadedModel, count_eager_attention_calls
) -> None:
    calls = count_eager_attention_calls(model)
    ours = mhsa.attend(TEXT, model=model, engine="mhsa")
    assert sum(calls.values()) == 0, "the model's own attention ran with verify=False"
    assert ours.max_abs_diff is None and ours.layer_max_abs_diff is None
    theirs = mhsa.attend(TEXT, model=model, engine="transformers")
    # the counter works: the transformers engine calls each class once a layer
    assert calls == dict.fromkeys(calls, ours.num_layers)
    assert ours.tokens == theirs.tokens and ours.causal == theirs.causal
    per_layer = np.abs(ours.attention - theirs.attention).max(axis=(1, 2, 3))
    assert per_layer.max() < TOL, per_layer
    np.testing.assert_allclose(ours.attention.sum(-1), 1.0, atol=1e-5)

    verified = mhsa.attend(TEXT, model=model, engine="mhsa", verify=True)
    np.testing.assert_array_equal(verified.attention, ours.attention)
    assert len(verified.layer_max_abs_diff) == ours.num_layers
    np.testing.assert_allclose(verified.layer_max_abs_diff, per_layer, atol=1e-7)
    assert verified.max_abs_diff == max(verified.layer_max_abs_diff)
    assert set(verified.timings) == {"load", "forward", "verify"} and "verify" not in ours.timings

    # the final hidden state, with a padded batch of two sentences
    inputs = _inputs(model, [TEXT, "A short one."])
    with torch.inference_mode():
        mine = forward_through_ours(model, inputs, OurPass(need_weights=False)).last_hidden_state
        with model.lock:
            own = model.model(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    hidden_diff = float((mine - own)[real].abs().max())
    assert hidden_diff < TOL
    assert float(own.abs().max()) > 0.1  # a hidden state worth comparing
    assert verified.hidden_max_abs_diff < TOL


def test_changing_our_module_changes_the_model_output(minilm) -> None:
    """The swap is real: a change to our layer-2 module moves layers 3 to 5 and the output."""
    inputs = _inputs(minilm, [TEXT])
    our_pass = OurPass(gates={2: torch.tensor([0.0] + [1.0] * 11)})
    with torch.inference_mode():
        gated = forward_through_ours(minilm, inputs, our_pass)
        intact = forward_through_ours(minilm, inputs, OurPass())
    assert float((gated.last_hidden_state - intact.last_hidden_state).abs().max()) > 1e-3
    r = mhsa.attend(TEXT, model=minilm, engine="mhsa")
    np.testing.assert_array_equal(our_pass.weights[2][0].numpy(), r.attention[2])  # before the gate
    assert np.abs(our_pass.weights[3][0].numpy() - r.attention[3]).max() > 1e-4  # after it


def test_originals_are_restored_when_the_forward_raises(minilm) -> None:
    blocks_before = [layer.attention for layer in minilm.model.encoder.layer]

    def explode(name: str, _tensor: torch.Tensor) -> None:
        if name == "probabilities":
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        forward_through_ours(minilm, _inputs(minilm, [TEXT]), OurPass(observers={3: explode}))
    assert [layer.attention for layer in minilm.model.encoder.layer] == blocks_before
    assert all(b.our_pass is None for b in our_blocks(minilm))
    r = mhsa.attend(TEXT, model=minilm, engine="transformers")
    assert np.isfinite(r.attention).all()


def test_our_block_outside_a_pass_says_so(minilm) -> None:
    block = our_blocks(minilm)[0]
    with pytest.raises(RuntimeError, match="through_our_module"):
        block(torch.zeros(1, 3, 384))


@pytest.mark.slow
def test_random_engine_runs_fresh_modules_through_the_whole_model(minilm) -> None:
    trained = mhsa.attend(TEXT, model=minilm, engine="mhsa")
    a = mhsa.attend(TEXT, model=minilm, engine="mhsa-random", seed=3)
    b = mhsa.attend(TEXT, model=minilm, engine="mhsa-random", seed=3)
    np.testing.assert_array_equal(a.attention, b.attention)
    fresh = our_blocks(minilm, 3)
    # every layer has its own fresh weights (not one draw repeated), of the pretrained shapes
    assert not torch.equal(fresh[0].ours.qkv.weight, fresh[1].ours.qkv.weight)
    assert fresh[0].ours.qkv.weight.shape == our_blocks(minilm)[0].ours.qkv.weight.shape
    assert np.abs(a.attention - trained.attention).max() > 1e-2
    # layer 1's input is the output of the fresh layer 0: rerun layer 1 alone on the model's
    # own hidden state and the weights differ, on the fresh layer-0 output they match
    inputs = _inputs(minilm, [TEXT])
    seen: list[torch.Tensor] = []
    our_pass = OurPass(
        observers={1: lambda name, t: seen.append(t.clone()) if name == "X" else None}
    )
    with torch.inference_mode():
        forward_through_ours(minilm, inputs, our_pass, seed=3)
        own_h1 = minilm.model(**inputs, output_hidden_states=True).hidden_states[1]
        w_on_own = fresh[1].ours.attention_weights(own_h1)[0].numpy()
        w_on_fresh = fresh[1].ours.attention_weights(seen[0])[0].numpy()
    np.testing.assert_allclose(w_on_fresh, a.attention[1], atol=1e-6)
    assert np.abs(w_on_own - a.attention[1]).max() > 1e-3
    assert "fresh" in mhsa.engine.ENGINE_DESCRIPTIONS["mhsa-random"]


def test_verify_is_for_the_mhsa_engine_only(minilm) -> None:
    with pytest.raises(mhsa.InputError, match=r"verify.*engine='mhsa'"):
        mhsa.attend(TEXT, model=minilm, engine="transformers", verify=True)


def test_alibi_model_is_refused_with_the_supported_families(tmp_path) -> None:
    from transformers import BloomConfig, BloomModel

    torch.manual_seed(0)
    path = save_tiny(tmp_path, BloomModel(BloomConfig(vocab_size=30522, hidden_size=16, n_layer=1)))
    lm = mhsa.load_model(path, device="cpu")
    with pytest.raises(mhsa.UnsupportedModelError) as info:
        mhsa.attend("hello there", model=lm, engine="mhsa")
    message = str(info.value)
    for family in ("BERT family", "DistilBERT", "GPT-2", "Llama-style"):
        assert family in message
    assert "transformers engine" in message
    assert mhsa.attend("hello there", model=lm).num_layers == 1  # the other engine still works


def test_a_config_flag_our_module_does_not_reproduce_is_refused_by_name(tmp_path) -> None:
    """Gemma 3 with bidirectional attention (EmbeddingGemma): refused, naming the flag."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        **DECODER_SIZES, num_key_value_heads=2, head_dim=8, use_bidirectional_attention=True
    )
    lm = mhsa.load_model(save_tiny(tmp_path, Gemma3TextModel(config)), device="cpu")
    with pytest.raises(mhsa.UnsupportedModelError, match="use_bidirectional_attention=True"):
        mhsa.attend("hello there", model=lm, engine="mhsa")
    assert mhsa.attend("hello there", model=lm).num_layers == 2  # the other engine still works


def test_classroom_reads_the_layer_input_of_the_run_and_shows_gqa_and_rope(
    tiny_llama_path,
) -> None:
    from mhsa.analysis.classroom import walkthrough

    lm = _loaded(tiny_llama_path)
    walk = walkthrough(TEXT, model=lm, layer=1, causal=True)
    names = [s.name for s in walk.steps]
    assert names.index("per-head K") < names.index("rotated Q") < names.index("raw scores")
    assert walk.num_heads == 4 and walk.num_kv_heads == 2 and walk.groups == 2 and walk.rotary
    assert walk.step("per-head K").shape[1] == 2 and walk.step("per-head Q").shape[1] == 4
    assert walk.kv_head(3) == 1 and walk.kv_head(1) == 0
    r = mhsa.attend(TEXT, model=lm, engine="mhsa", max_tokens=64)
    n = len(walk.tokens)
    np.testing.assert_allclose(
        walk.step("probabilities").value[0], r.attention[1, :, :n, :n], atol=1e-6
    )


def test_each_family_writes_our_weights_back_into_a_block_of_its_layout(
    model: mhsa.engine.LoadedModel,
) -> None:
    """Round trip: the block's weights -> our module -> written into a copy of the block whose
    projections were changed -> every projection equals the block's again, bit for bit."""
    with model.lock:
        blocks = our_blocks(model)
    for block in blocks:
        copy = deepcopy(block.original)
        projections = {name: p for name, p in copy.named_parameters() if "norm" not in name.lower()}
        assert len(projections) >= 4  # W_Q, W_K, W_V, W_O at least
        with torch.no_grad():
            for p in projections.values():
                p.add_(1.0)
        assert block.family.store is not None, block.family.name
        block.family.store(block.ours, copy)
        theirs = dict(block.original.named_parameters())
        for name, p in projections.items():
            assert torch.equal(p, theirs[name]), (block.family.name, name)

"""``mhsa.from_attention``: attention computed elsewhere gives the same analyses as ``attend``.

The attention on the other side comes from the plain transformers model run by hand
(``output_attentions=True``, eager attention), not through this library's engine; a
TransformerLens ``ActivationCache`` is stood in for by an object that has only what one has
(``keys()`` and ``__getitem__`` of hook names). The real one is tested where it installs
(``test_transformer_lens_cache``: skipped unless transformer_lens imports).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

import mhsa
from mhsa.engine import interop
from mhsa.engine.interop import read_attention_file
from mhsa.engine.models.loading import default_model_path

TEXT = "The cat sat on the mat, and the cat slept."
TOY_TEXT = "ba be bi bo du ba be bi bo du"


def _by_hand(model_class: type, path: str, text: str) -> tuple[tuple[torch.Tensor, ...], list]:
    """transformers' ``outputs.attentions`` and the token strings, as a user would get them."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = model_class.from_pretrained(path, attn_implementation="eager").eval()
    inputs = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        outputs = model(**inputs, output_attentions=True)
    return outputs.attentions, tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])


@pytest.fixture(scope="module")
def minilm_outputs() -> tuple[tuple[torch.Tensor, ...], list]:
    return _by_hand(AutoModel, default_model_path(), TEXT)


@pytest.fixture(scope="module")
def toy_outputs() -> tuple[tuple[torch.Tensor, ...], list]:
    return _by_hand(AutoModelForCausalLM, str(mhsa.training.toy_model_path("induction")), TOY_TEXT)


class StandInCache:
    """What ``from_attention`` may read of TransformerLens's ``ActivationCache``: hook names
    and ``cache[name]`` (``[batch, heads, q, k]`` per layer), among other hooks."""

    def __init__(self, attentions: tuple[torch.Tensor, ...]) -> None:
        self._hooks = {"hook_embed": torch.zeros(1, 3, 8)}
        for layer, a in enumerate(attentions):
            self._hooks[f"blocks.{layer}.attn.hook_attn_scores"] = torch.log(a)
            self._hooks[f"blocks.{layer}.attn.hook_pattern"] = a

    def keys(self):
        return self._hooks.keys()

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._hooks[name]


class SavedProxy:
    """What nnsight before 0.4 hands back from ``.save()``: the tensor is its ``value``."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


def _inputs(attentions: tuple[torch.Tensor, ...]) -> dict[str, object]:
    """The same attention in every shape ``from_attention`` reads."""
    stacked = torch.stack(attentions)[:, 0]  # (L, H, n, n)
    return {
        "transformers": attentions,
        "stacked tensor": stacked,
        "stacked array": stacked.numpy(),
        "ActivationCache": StandInCache(attentions),
        "nnsight list": [a[0] for a in attentions],  # saved per layer, batch dropped
        "nnsight proxies": [SavedProxy(a) for a in attentions],  # nnsight < 0.4: .value
    }


@pytest.mark.parametrize(
    "kind",
    ["stacked tensor", "stacked array", "ActivationCache", "nnsight list", "nnsight proxies"],
)
def test_every_input_reads_the_same_attention(minilm_outputs, kind: str) -> None:
    attentions, tokens = minilm_outputs
    theirs = mhsa.from_attention(_inputs(attentions)[kind], tokens)
    by_hand = np.stack([a[0].numpy() for a in attentions])  # (L, H, n, n)
    np.testing.assert_array_equal(theirs.attention, by_hand)
    assert theirs.attention.dtype == np.float32 and theirs.causal is False


def test_16_bit_tensors_are_read_as_their_values(minilm_outputs) -> None:
    attentions, tokens = minilm_outputs
    half = tuple(a.to(torch.bfloat16) for a in attentions)  # rows sum to 1 within bf16's step
    theirs = mhsa.from_attention(half, tokens)
    assert theirs.attention.dtype == np.float32
    np.testing.assert_array_equal(theirs.attention, torch.stack(half)[:, 0].float().numpy())


def test_encoder_analyses_equal_attend(minilm, minilm_outputs) -> None:
    attentions, tokens = minilm_outputs
    ours = mhsa.attend(TEXT, model=minilm)
    theirs = mhsa.from_attention(attentions, tokens)
    assert theirs.tokens == ours.tokens
    assert theirs.special == ours.special and theirs.punctuation == ours.punctuation
    assert theirs.word_ids == ours.word_ids  # from the pieces' markers, no tokenizer
    assert theirs.causal is False and theirs.engine == "imported"
    np.testing.assert_allclose(theirs.attention, ours.attention, atol=1e-6)
    stats_cols = [c for c in mhsa.head_stats(ours).columns if c != "role"]
    pd.testing.assert_frame_equal(
        mhsa.head_stats(theirs)[stats_cols], mhsa.head_stats(ours)[stats_cols], atol=1e-5
    )
    assert list(mhsa.head_stats(theirs)["role"]) == list(mhsa.head_stats(ours)["role"])
    for metric in ("js", "cosine"):
        pd.testing.assert_frame_equal(
            mhsa.head_similarity(theirs, metric=metric),
            mhsa.head_similarity(ours, metric=metric),
            atol=1e-5,
        )
    np.testing.assert_allclose(
        mhsa.analysis.attention_rollout(theirs), mhsa.analysis.attention_rollout(ours), atol=1e-5
    )
    np.testing.assert_allclose(theirs.to_words().attention, ours.to_words().attention, atol=1e-6)
    pd.testing.assert_frame_equal(
        mhsa.analysis.attention_sinks(theirs).table,
        mhsa.analysis.attention_sinks(ours).table,
        atol=1e-5,
    )


@pytest.mark.parametrize("kind", ["transformers", "stacked tensor", "ActivationCache"])
def test_decoder_detection_equals_attend(toy_outputs, kind: str) -> None:
    attentions, tokens = toy_outputs
    toy = mhsa.load_model("toy:induction", device="cpu")
    ours = mhsa.attend(TOY_TEXT, model=toy)
    theirs = mhsa.from_attention(_inputs(attentions)[kind], tokens)
    assert theirs.causal is True  # read from the attention: nothing above the diagonal
    assert theirs.special == ours.special  # [BOS] is a known special token
    for pattern in ("previous token", "duplicate token", "induction"):
        pd.testing.assert_frame_equal(
            mhsa.detect_heads(None, pattern, result=theirs),  # no text, no model
            mhsa.detect_heads(TOY_TEXT, pattern, model=toy, result=ours),
            atol=1e-5,
        )
    pd.testing.assert_frame_equal(mhsa.head_stats(theirs), mhsa.head_stats(ours), atol=1e-5)


def test_induction_head_found_by_hand(toy_outputs) -> None:
    """The induction score of one head, recomputed with a loop over the token strings."""
    attentions, tokens = toy_outputs
    theirs = mhsa.from_attention(attentions, tokens)
    scores = mhsa.detect_heads(None, "induction", result=theirs)["score"]
    a = attentions[1][0, 0].double().numpy()
    on, total = 0.0, a.sum()
    for i in range(len(tokens)):
        for j in range(1, i + 1):
            if tokens[j - 1] == tokens[i] and j - 1 != i:
                on += a[i, j]
    assert scores["L1H0"] == pytest.approx(on / total, abs=1e-6)


def test_model_and_text_give_the_tokenizers_alignment(minilm, minilm_outputs) -> None:
    attentions, tokens = minilm_outputs
    ours = mhsa.attend(TEXT, model=minilm)
    theirs = mhsa.from_attention(attentions, tokens, model=minilm, text=TEXT)
    assert theirs.offsets == ours.offsets and theirs.word_ids == ours.word_ids
    assert theirs.model == ours.model and theirs.facts["layers"] == 6
    assert theirs.text == TEXT
    pd.testing.assert_frame_equal(
        mhsa.detect_heads(TEXT, "duplicate token", model=minilm, result=theirs),
        mhsa.detect_heads(TEXT, "duplicate token", model=minilm, result=ours),
        atol=1e-5,
    )


def test_options_override_what_is_read(minilm_outputs) -> None:
    attentions, tokens = minilm_outputs
    flags = [i == 3 for i in range(len(tokens))]
    r = mhsa.from_attention(attentions, tokens, special=flags, causal=True)
    assert r.special == flags and r.causal is True
    second = tuple(torch.cat([a, a.flip(-1)]) for a in attentions)  # a batch of two
    picked = mhsa.from_attention(second, tokens, batch_index=1)
    np.testing.assert_array_equal(picked.attention[0, 0], attentions[0][0, 0].flip(-1).numpy())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda a, t: (a, t[:-1]), "tokens were given"),
        (lambda a, t: (tuple(x * 2 for x in a), t), "sum to 1"),
        (lambda a, t: (tuple(torch.log(x) for x in a), t), "NaN, infinite or negative"),
        (lambda a, t: ((None,) * len(a), t), "attn_implementation='eager'"),
        (lambda a, t: ((), t), "empty"),
        (lambda a, t: (torch.stack(a)[:, 0, 0], t), "shape"),
        (lambda a, t: ({"blocks.0.attn.hook_z": a[0]}, t), "no attention pattern"),
        (lambda a, t: ({"blocks.1.attn.hook_pattern": a[1]}, t), "every layer from 0"),
        (lambda a, t: ("not attention", t), "not a tensor"),
        (lambda a, t: ((a[0], a[1][..., :-1, :-1]), t), "differ in shape"),
    ],
)
def test_bad_input_says_what_is_wrong(minilm_outputs, make, message: str) -> None:
    attention, tokens = make(*minilm_outputs)
    with pytest.raises(mhsa.InputError, match=message):
        mhsa.from_attention(attention, tokens)


def test_batch_index_outside_the_batch(minilm_outputs) -> None:
    attentions, tokens = minilm_outputs
    with pytest.raises(mhsa.InputError, match="outside"):
        mhsa.from_attention(attentions, tokens, batch_index=2)


def test_transformer_lens_cache() -> None:
    """A TransformerLens cache of toy:induction through ``from_attention``: the attention equals
    ``attend``'s, and head detection equals TransformerLens's own ``detect_head`` on that cache
    and ours on ``attend``'s result. Runs where transformer_lens imports (4.x: the
    ``TransformerBridge``); the project's pins do not include it."""
    pytest.importorskip("transformer_lens")
    from transformer_lens.head_detector import detect_head
    from transformer_lens.model_bridge import TransformerBridge

    path = str(mhsa.training.toy_model_path("induction"))
    bridge = TransformerBridge.boot_transformers(path, device="cpu")
    ids = torch.tensor([bridge.tokenizer(TOY_TEXT)["input_ids"]])
    _, cache = bridge.run_with_cache(ids, remove_batch_dim=True)  # as detect_head reads it
    theirs = mhsa.from_attention(cache, bridge.tokenizer.convert_ids_to_tokens(ids[0]))
    toy = mhsa.load_model("toy:induction", device="cpu")
    ours = mhsa.attend(TOY_TEXT, model=toy)
    np.testing.assert_allclose(theirs.attention, ours.attention, atol=1e-5)
    for name, tl_name in [
        ("previous token", "previous_token_head"),
        ("duplicate token", "duplicate_token_head"),
        ("induction", "induction_head"),
    ]:
        scores = mhsa.detect_heads(None, name, result=theirs)["score"].to_numpy()
        tl_scores = detect_head(bridge, TOY_TEXT, tl_name, cache=cache).numpy().reshape(-1)
        np.testing.assert_allclose(scores, tl_scores, atol=1e-5)
        np.testing.assert_allclose(
            scores, mhsa.detect_heads(TOY_TEXT, name, model=toy, result=ours)["score"], atol=1e-5
        )


# --- files: the Overview's upload ---------------------------------------------------------------


class Exploit:
    """An object whose unpickling would run code: a .pt must never unpickle it."""

    def __reduce__(self):
        return (Path.touch, (Path(os.environ["MHSA_TEST_MARK"]),))


def _npz(**arrays) -> bytes:
    out = io.BytesIO()
    np.savez_compressed(out, **arrays)
    return out.getvalue()


def _pt(value) -> bytes:
    out = io.BytesIO()
    torch.save(value, out)
    return out.getvalue()


def test_files_read_the_same_attention(minilm_outputs, tmp_path) -> None:
    attentions, tokens = minilm_outputs
    by_hand = np.stack([a[0].numpy() for a in attentions])
    stacked = torch.stack(attentions)  # [layers, batch, heads, n, n]
    saved = tmp_path / "result.npz"
    mhsa.from_attention(attentions, tokens).save(saved)
    files = {
        "a.npz": _npz(attention=by_hand, tokens=np.array(tokens)),
        "b.NPZ": _npz(attention=stacked.numpy(), tokens=np.array(tokens)),
        "c.pt": _pt({"attention": stacked[:, 0], "tokens": tokens}),
        "d.pt": _pt({"attention": attentions, "tokens": tokens}),  # outputs.attentions as is
        "e.npz": saved.read_bytes(),  # a result downloaded from the Overview
    }
    for name, data in files.items():
        result = read_attention_file(data, name)
        np.testing.assert_array_equal(result.attention, by_hand, err_msg=name)
        assert result.tokens == tokens, name


def test_a_pt_file_is_never_unpickled(tmp_path, monkeypatch, minilm_outputs) -> None:
    attentions, tokens = minilm_outputs
    mark = tmp_path / "ran"
    monkeypatch.setenv("MHSA_TEST_MARK", str(mark))
    data = _pt({"attention": attentions, "tokens": tokens, "payload": Exploit()})
    with pytest.raises(mhsa.InputError, match="could not be read as a tensor file"):
        read_attention_file(data, "evil.pt")
    assert not mark.exists()
    torch.load(io.BytesIO(data), weights_only=False)  # the payload is live: unpickled, it runs
    assert mark.exists()


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("a.txt", b"", "give a .npz or .pt"),
        ("a.npz", b"not a zip", "not a zip archive"),
        ("a.npz", _npz(attention=np.ones((1, 1, 2, 2)) / 2), "needs two arrays"),
        ("a.npz", _npz(attention=np.ones((1, 1, 2, 2)) / 2, tokens=np.arange(2)), "strings"),
        ("a.npz", _npz(attention=np.ones((1, 1, 2, 2)) / 2, tokens=np.array(["a", None])), "read"),
        ("a.pt", _pt([1, 2]), "must hold a dict"),
        ("a.pt", _pt({"attention": torch.ones(1, 1, 2, 2) / 2, "tokens": [1, 2]}), "strings"),
        ("a.pt", _pt({"attention": torch.ones(1, 1, 2, 2), "tokens": ["a", "b"]}), "sum to 1"),
    ],
)
def test_bad_files_say_what_is_wrong(name: str, data: bytes, message: str) -> None:
    with pytest.raises(mhsa.InputError, match=message):
        read_attention_file(data, name)


def test_a_file_that_unpacks_too_large_is_refused_before_unpacking(monkeypatch) -> None:
    monkeypatch.setattr(interop, "MAX_FILE_BYTES", 10_000)
    data = _npz(attention=np.zeros((4, 4, 30, 30)), tokens=np.array(["a"] * 30))
    assert len(data) < 10_000  # zeros compress: the archive's own size says nothing
    with pytest.raises(mhsa.InputError, match="unpacks to"):
        read_attention_file(data, "zeros.npz")

"""Hostile input through the library, and many threads sharing one model."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import mhsa
from mhsa.limits import Limits
from tests.hostile import CASES


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hostile_input_through_attend(minilm, name: str, text: str, expected: object) -> None:
    if expected == "error":
        with pytest.raises(mhsa.InputError, match="empty"):
            mhsa.attend(text, model=minilm)
        return
    r = mhsa.attend(text, model=minilm, max_tokens=512, engine="mhsa", verify=True)
    assert r.max_abs_diff < 1e-4 and r.hidden_max_abs_diff < 1e-4
    assert np.isfinite(r.attention).all()
    np.testing.assert_allclose(r.attention.sum(-1), 1.0, atol=1e-5)
    for i, (start, end) in enumerate(r.offsets):  # tokens map back into the text
        assert 0 <= start <= end <= len(text), (i, start, end)
    if "tokens" in expected:
        assert r.tokens == expected["tokens"]
    if "contains" in expected:
        for token in expected["contains"]:
            assert token in r.tokens, (token, r.tokens)
    if expected.get("truncated"):
        assert len(r.tokens) == 512 and r.truncated_tokens > 10_000
        with pytest.raises(mhsa.InputError, match="at most 512"):
            mhsa.attend(text, model=minilm)
    if "min_tokens" in expected:
        assert len(r.tokens) >= expected["min_tokens"]
    if "special_count" in expected:  # typed "[CLS]" is text: only the real two are special
        assert sum(r.special) == expected["special_count"]
        assert r.tokens[0] == "[CLS]" and r.tokens[-1] == "[SEP]"
        assert r.tokens.count("[CLS]") == 1
    if expected.get("all_punct"):
        assert all(p for p, s in zip(r.punctuation, r.special, strict=True) if not s)
    words = r.to_words()
    np.testing.assert_allclose(words.attention.sum(-1), 1.0, atol=1e-5)
    assert len(mhsa.head_stats(r)) == 72


def test_eight_threads_share_one_model_and_match_sequential_results(minilm) -> None:
    sentences = [
        f"Sentence number {i} talks about {w} and attention."
        for i, w in enumerate(
            "cats dogs heads tokens layers keys values queries words maps "
            "trees birds fish stars rivers roads songs books hands clouds".split()
        )
    ]
    engines = ["transformers", "mhsa"]
    sequential = {
        (s, e): mhsa.attend(s, model=minilm, engine=e) for s in sentences for e in engines
    }
    barrier = threading.Barrier(8)

    def worker(k: int) -> list[tuple[str, str, mhsa.AttentionResult]]:
        barrier.wait()  # start together
        order = sentences[k:] + sentences[:k]
        return [
            (s, e, mhsa.attend(s, model=minilm, engine=e))
            for s in order
            for e in engines[k % 2 :] + engines[: k % 2]
        ]

    with ThreadPoolExecutor(8) as pool:
        outputs = [r for batch in pool.map(worker, range(8)) for r in batch]
    assert len(outputs) == 8 * 20 * 2
    for s, e, r in outputs:
        want = sequential[(s, e)]
        assert r.tokens == want.tokens and r.text == s
        np.testing.assert_array_equal(r.attention, want.attention)


def test_operator_limits_from_environment(monkeypatch) -> None:
    monkeypatch.setenv("MHSA_MAX_TOKENS", "64")
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", "/models/a, org/b")
    monkeypatch.setenv("MHSA_RESULT_CACHE", "not-a-number")
    limits = Limits.from_env()
    assert limits.max_tokens == 64 and limits.result_cache == 32
    assert limits.allowed_models == ("/models/a", "org/b")
    limits.check_model("default")
    limits.check_model("org/b")
    with pytest.raises(mhsa.ModelLoadError, match="only loads these models: default, /models/a"):
        limits.check_model("/etc")
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", "")
    with pytest.raises(mhsa.ModelLoadError, match="only loads these models: default\\."):
        Limits.from_env().check_model("gpt2")

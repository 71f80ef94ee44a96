"""Hostile input through the library, and many threads sharing one model."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import mhsa
from mhsa.engine.models.limits import Limits
from tests.hostile import CASES


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.slow
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


@pytest.mark.slow
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
    with pytest.raises(mhsa.ModelLoadError, match="these: /models/a, org/b") as refused:
        limits.check_model("/etc")
    # what the server does allow, all of it: the toy and trained models load too
    said = str(refused.value)
    assert said.startswith("This server does not load '/etc'. It loads the default model")
    assert "toy:induction" in said and "toy:reverse-seq2seq" in said and "trained:<id>" in said
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", "")
    with pytest.raises(mhsa.ModelLoadError, match=r"trained:<id>\)\.$") as refused:
        Limits.from_env().check_model("gpt2")
    assert "these:" not in str(refused.value)  # no list of its own: none is claimed


class _LockCheckingTokenizer:
    """A tokenizer that records whether each call happened under the model's lock."""

    def __init__(self, tokenizer, lock: threading.Lock) -> None:
        self._tokenizer, self._lock, self.calls = tokenizer, lock, []

    def __call__(self, *args, **kwargs):
        self.calls.append(self._lock.locked())
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)


@pytest.mark.slow
def test_classroom_and_attend_tokenize_only_under_the_model_lock(minilm) -> None:
    """Fast tokenizers keep truncation settings as shared state: the classroom's truncating call
    and attend's full-length call must never overlap. Every call holds the model's lock."""
    import dataclasses

    from mhsa.analysis.classroom import walkthrough

    lock = threading.Lock()
    guard = _LockCheckingTokenizer(minilm.tokenizer, lock)
    lm = dataclasses.replace(minilm, tokenizer=guard, lock=lock, cache={})
    walkthrough("The cat sat on the mat, then slept.", model=lm, layer=2, max_tokens=5)
    mhsa.attend("The cat sat on the mat, then slept.", model=lm, max_tokens=64)
    assert len(guard.calls) >= 3 and all(guard.calls), guard.calls


@pytest.mark.slow
def test_classroom_truncation_and_attend_run_concurrently(minilm) -> None:
    from mhsa.analysis.classroom import walkthrough

    text = "Attention heads look at the previous token, the separator and commas, often."
    full = mhsa.attend(text, model=minilm).tokens
    barrier = threading.Barrier(4)

    def worker(k: int) -> list[tuple[str, int]]:
        barrier.wait()
        seen = []
        for _ in range(10):
            if k % 2:
                seen.append(("walk", len(walkthrough(text, model=minilm, max_tokens=6).tokens)))
            else:
                seen.append(("attend", len(mhsa.attend(text, model=minilm).tokens)))
        return seen

    with ThreadPoolExecutor(4) as pool:
        results = [r for batch in pool.map(worker, range(4)) for r in batch]
    assert {n for kind, n in results if kind == "walk"} == {6}
    assert {n for kind, n in results if kind == "attend"} == {len(full)}

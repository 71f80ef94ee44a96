"""``toy:induction-long`` (issue 46, item 4): a shipped toy model that reads 2,048 positions, so
that the long-input views can be seen offline, and whose induction head still finds the
earlier copy of a repeat 750 tokens back."""

from __future__ import annotations

import numpy as np

import mhsa
from mhsa.training.tasks import BOS, SYMBOLS, task_spec
from mhsa.training.toy import toy_model_path

MODEL = "toy:induction-long"


def _repeat(half: int, seed: int = 3) -> tuple[str, list[str]]:
    """A random repeated sequence of syllables (drawn with replacement) and its tokens."""
    words = [SYMBOLS[i] for i in np.random.default_rng(seed).integers(0, len(SYMBOLS), half)]
    return " ".join(words + words), [BOS, *words, *words]


def test_the_long_model_ships_small_with_its_card_and_reads_2048_positions() -> None:
    folder = toy_model_path("induction-long")
    assert sum(f.stat().st_size for f in folder.iterdir()) < 1_000_000
    card = (folder / "README.md").read_text()
    assert "python scripts/train_toy_long.py --out data/toy/induction-long --seed 0" in card
    assert mhsa.load_model(MODEL, device="cpu").max_positions == 2048
    assert task_spec("induction-long").max_tokens <= 2048


def test_its_induction_head_finds_the_earlier_copy_1500_tokens_long() -> None:
    text, tokens = _repeat(750)
    result = mhsa.attend(text, model=MODEL, max_tokens=2048, device="cpu")
    assert result.tokens == tokens and not result.truncated_tokens
    a = result.attention.astype(np.float64)  # (L, H, n, n)
    n, half = len(tokens), 750
    # TransformerLens's induction pattern, by hand: 1 at (i, j) where token j - 1 is token i
    pattern = np.zeros((n, n))
    for i in range(n):
        for j in range(1, i + 1):
            pattern[i, j] = tokens[j - 1] == tokens[i] and j - 1 != i
    by_hand = (a * pattern).sum(axis=(-2, -1)) / a.sum(axis=(-2, -1))  # (L, H)
    scores = mhsa.detect_heads(text, "induction", model=MODEL, result=result)["score"]
    np.testing.assert_allclose(scores.to_numpy(), by_hand.reshape(-1), atol=1e-5)
    assert by_hand[1].max() >= 0.5 and by_hand[0].max() < 0.1  # layer 1 does induction
    # the strict test: from each repeated token to the token after its own earlier copy
    queries = np.arange(1 + half + 1, n)  # the repeat, its first token aside
    copy = a[1][:, queries, queries - half + 1].mean(axis=-1)  # (H,)
    assert copy.max() >= 0.5

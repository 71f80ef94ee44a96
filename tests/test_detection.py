"""Head detection on a computed result (mhsa.analysis.detection, ``detect_heads(..., result=...)``)
and
the tables of a result (mhsa.analysis.tables), against hand computations: patterns written out cell
by
cell, TransformerLens's "mul" score as a loop, the tokenizer called directly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mhsa
from mhsa.analysis import detection, roles, tables

TOY = Path(__file__).resolve().parent.parent / "data" / "toy" / "induction"
REPEAT = "ba ke mo di lu ba ke mo di"  # a repeat: induction heads look one past the first copy


def _cells(n: int, *cells: tuple[int, int]) -> np.ndarray:
    pattern = np.zeros((n, n))
    for i, j in cells:
        pattern[i, j] = 1.0
    return pattern


def _mul_score(a: np.ndarray, p: np.ndarray) -> float:
    """TransformerLens's ``compute_head_attention_similarity_score`` with ``error_measure="mul"``
    (``transformer_lens/head_detector.py``), as a loop: the share of attention on the pattern."""
    n = len(a)
    hit = sum(float(a[i][j]) * p[i][j] for i in range(n) for j in range(n))
    return hit / sum(float(a[i][j]) for i in range(n) for j in range(n))


def _result(attention: np.ndarray, tokens: list[str], **extra) -> mhsa.AttentionResult:
    n = len(tokens)
    return mhsa.AttentionResult(
        text=" ".join(tokens),
        tokens=tokens,
        attention=attention.astype(np.float32),
        offsets=[(2 * i, 2 * i + 1) for i in range(n)],
        special=[i == 0 for i in range(n)],
        punctuation=[t == "." for t in tokens],
        word_ids=list(range(n)),
        model="hand",
        engine="transformers",
        device="cpu",
        **extra,
    )


# --- rule patterns ----------------------------------------------------------------------------


def test_rules_build_their_patterns_from_the_ids() -> None:
    ids = [7, 3, 7, 3, 9]
    assert np.array_equal(
        detection.rule_pattern("k back", ids, k=2), _cells(5, (2, 0), (3, 1), (4, 2))
    )
    assert np.array_equal(
        detection.rule_pattern("k forward", ids, k=1), _cells(5, (0, 1), (1, 2), (2, 3), (3, 4))
    )
    # same token: the earlier copies of the query's token; after it: the token after them
    assert np.array_equal(detection.rule_pattern("same token", ids), _cells(5, (2, 0), (3, 1)))
    assert np.array_equal(
        detection.rule_pattern("token after its earlier occurrence", ids), _cells(5, (2, 1), (3, 2))
    )


def test_typed_rows_are_read_as_numbers() -> None:
    rows = "1 0 0\n0.5, 0.5 0\n\n0 0.25 0.75\n"
    expected = np.array([[1, 0, 0], [0.5, 0.5, 0], [0, 0.25, 0.75]])
    assert np.array_equal(
        detection.rule_pattern(detection.TYPED_RULE, [1, 2, 3], rows=rows), expected
    )


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("", "Type the pattern"),
        ("1 0\n1", "Row 2 has 1 numbers and row 1 has 2"),
        ("1 x", "Row 1: 'x' is not a number"),
    ],
)
def test_badly_typed_rows_say_which_row(rows: str, message: str) -> None:
    with pytest.raises(mhsa.InputError, match=message):
        detection.typed_pattern(rows)


def test_an_unknown_rule_lists_the_rules() -> None:
    with pytest.raises(mhsa.InputError, match="choose one of k back, k forward"):
        detection.rule_pattern("k sideways", [1, 2])


# --- tables of heads --------------------------------------------------------------------------


def test_detection_table_scores_every_head_as_the_loop() -> None:
    rng = np.random.default_rng(3)
    raw = rng.random((2, 3, 4, 4)) * np.tril(np.ones((4, 4)))
    attention = raw / raw.sum(-1, keepdims=True)
    result = _result(attention, ["[CLS]", "a", "b", "a"])
    patterns = {"prev": _cells(4, (1, 0), (2, 1), (3, 2)), "dup": _cells(4, (3, 1))}
    table = detection.detection_table(result, patterns)
    assert list(table.columns) == ["layer", "head", "prev", "dup"]
    assert list(table.index) == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]
    assert table.index.name == "name"
    assert list(table["layer"]) == [0, 0, 0, 1, 1, 1] and list(table["head"]) == [0, 1, 2] * 2
    for label, row in table.iterrows():
        layer, head = mhsa.parse_head_label(label)
        a = result.attention[layer, head]
        assert row["prev"] == pytest.approx(_mul_score(a, patterns["prev"]), abs=1e-6)
        assert row["dup"] == pytest.approx(_mul_score(a, patterns["dup"]), abs=1e-6)


# --- detect_heads on a result already computed ----------------------------------------------


@pytest.fixture(scope="module")
def toy() -> mhsa.engine.LoadedModel:
    return mhsa.load_model(str(TOY), device="cpu")


def test_sequence_ids_are_the_tokenizers(toy) -> None:
    assert detection.sequence_ids(toy, REPEAT) == toy.tokenizer(REPEAT)["input_ids"]


def test_detect_heads_scores_the_given_result_not_a_new_run(toy) -> None:
    """Untrained attention (``mhsa-random``) given as ``result`` is what gets scored: the loop
    over its own weights, far from the trained model's induction scores."""
    untrained = mhsa.attend(REPEAT, model=toy, engine="mhsa-random", seed=3)
    scores = roles.detect_heads(REPEAT, "induction", model=toy, result=untrained)["score"]
    ids = toy.tokenizer(REPEAT)["input_ids"]
    n = len(ids)
    by_hand = np.zeros((n, n))  # 1 one key after each earlier copy of the query's token
    for i in range(n):
        for j in range(1, i + 1):
            by_hand[i, j] = float(ids[j - 1] == ids[i] and j - 1 != i)
    for label, score in scores.items():
        layer, head = mhsa.parse_head_label(label)
        expected = _mul_score(untrained.attention[layer, head], by_hand)
        assert score == pytest.approx(expected, abs=1e-6)
    trained = roles.detect_heads(REPEAT, "induction", model=toy)["score"]
    assert trained.max() > scores.max() + 0.2  # the trained induction head is not in it


def test_detect_heads_on_the_models_own_result_equals_running_it(toy) -> None:
    own = mhsa.attend(REPEAT, model=toy)
    for pattern in roles.DETECTION_PATTERNS:
        given = roles.detect_heads(REPEAT, pattern, model=toy, result=own, exclude_bos=True)
        ran = roles.detect_heads(REPEAT, pattern, model=toy, exclude_bos=True)
        assert given["score"].to_numpy() == pytest.approx(ran["score"].to_numpy(), abs=1e-5)


def test_detect_heads_refuses_a_result_of_other_tokens(toy) -> None:
    other = mhsa.attend("ba ke", model=toy)
    with pytest.raises(mhsa.InputError, match="other tokens than this text's"):
        roles.detect_heads(REPEAT, "induction", model=toy, result=other)
    with pytest.raises(mhsa.InputError, match="token-level result"):
        roles.detect_heads(REPEAT, model=toy, result=mhsa.attend(REPEAT, model=toy).to_words())
    with pytest.raises(mhsa.InputError, match="one text's attention"):
        roles.detect_heads([REPEAT, REPEAT], model=toy, result=other)


# --- tables of a result ------------------------------------------------------------------------


def test_token_table_lists_each_token_with_its_flags_and_span() -> None:
    result = _result(np.full((1, 1, 3, 3), 1 / 3), ["[CLS]", "hi", "."])
    table = tables.token_table(result)
    assert list(table.index) == ["token", "special", "punctuation", "generated", "start", "end"]
    assert table.loc["token"].tolist() == ["[CLS]", "hi", "."]
    assert table.loc["special"].tolist() == ["True", "False", "False"]
    assert table.loc["punctuation"].tolist() == ["False", "False", "True"]
    assert table.loc["start"].tolist() == ["0", "2", "4"] and table.loc["end"].tolist() == [
        "1",
        "3",
        "5",
    ]


def test_agreement_table_has_a_row_per_layer_and_the_output() -> None:
    result = _result(
        np.full((2, 1, 2, 2), 0.5),
        ["[CLS]", "hi"],
        layer_max_abs_diff=[1e-7, 3e-7],
        hidden_max_abs_diff=2e-6,
    )
    table = tables.agreement_table(result)
    assert table["compared"].tolist() == [
        "layer 0 attention weights",
        "layer 1 attention weights",
        "final hidden state (the model's output)",
    ]
    assert table["max |ours - model|"].tolist() == [1e-7, 3e-7, 2e-6]


def test_detect_heads_on_a_result_cut_to_max_tokens_scores_its_tokens(toy) -> None:
    cut = mhsa.attend(REPEAT, model=toy, max_tokens=6)
    assert cut.truncated_tokens > 0 and cut.num_tokens == 6
    scores = roles.detect_heads(REPEAT, "previous token", model=toy, result=cut)["score"]
    previous = np.eye(6, k=-1)  # each token's key just before it
    for label, score in scores.items():
        layer, head = mhsa.parse_head_label(label)
        assert score == pytest.approx(_mul_score(cut.attention[layer, head], previous), abs=1e-6)

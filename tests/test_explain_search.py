"""Heads explained over an atlas (``explain_heads``, ``score_program``): the toy model's
previous-token and induction heads found, a planted linguistic head recovered exactly, the
search never below the fixed baselines, explanations saved and read back, and bad input refused
with one message before anything is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mhsa
from mhsa.atlas.corpora import TaggedText, task_corpus
from mhsa.errors import InputError
from mhsa.explain import ProgramError, explain_heads, parse_program, saved, score_program, soft_iou
from mhsa.explain import attention as explain_attention
from mhsa.explain.attention import TextAttention, attention_of
from mhsa.explain.explanations import split_texts
from mhsa.explain.search import BASELINES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def toy_atlas(tmp_path_factory) -> mhsa.atlas.Atlas:
    """toy:induction over 60 of its task's sequences and a blank text (a decoder, no tags)."""
    out = tmp_path_factory.mktemp("explain-toy") / "atlas"
    texts = [*task_corpus("induction", count=60, seed=11), ""]
    return mhsa.atlas.build_atlas(texts, out, model="toy:induction", top_k=4, progress=False)


@pytest.fixture(scope="module")
def toy_explained(toy_atlas) -> mhsa.explain.HeadExplanations:
    return explain_heads(toy_atlas, faithfulness=False, progress=False, top=4)


def test_toy_previous_token_and_induction_heads(toy_explained) -> None:
    """L0H3 follows the previous token (mostly: it keeps some weight on itself, which a mix
    says), and a head of layer 1 is explained by induction."""
    table = toy_explained.table.set_index("head")
    l0h3 = parse_program(table.loc["L0H3", "program"])
    singles = [
        p
        for p in toy_explained.candidates("L0H3")["program"]
        if parse_program(p).kind != "combination"
    ]
    assert singles[0] == "offset(-1)"
    assert str(l0h3) == "offset(-1)" or (
        isinstance(l0h3, mhsa.explain.Mix) and str(l0h3.a) == "offset(-1)" and l0h3.w >= 0.5
    )
    assert table.loc["L0H3", "baseline"] == "offset(-1)"
    layer1 = table[table.index.str.startswith("L1")]
    assert (layer1["program"] == "induction").any()
    best = layer1[layer1["program"] == "induction"]
    assert (best["accuracy"] > best["baseline_accuracy"] + 0.2).all()
    assert toy_explained.notices and "no part-of-speech tags" in toy_explained.notices[0]


def test_scores_are_the_public_definitions_on_the_held_out_texts(toy_atlas, toy_explained) -> None:
    row = toy_explained.table.set_index("head").loc["L1H2"]
    again = score_program(toy_atlas, "L1H2", row["program"])
    for column in ("iou", "accuracy", "baseline_accuracy", "auc"):
        assert again[column] == pytest.approx(row[column], abs=1e-12), column
    assert again["baseline"] == row["baseline"]
    # by hand from the attention: the held-out texts only, none of the search's
    search, held = split_texts(toy_atlas)
    assert set(search).isdisjoint(held) and len(held) == round(0.25 * (len(search) + len(held)))
    assert toy_explained.settings["held_out_texts"] == held
    items = attention_of(toy_atlas, held)
    i = toy_atlas.head("L1H2")
    program = parse_program(row["program"])
    by_hand = np.mean(
        [
            np.minimum(it.weights[i][1:], program.pattern(it.features)[1:]).sum()
            / np.maximum(it.weights[i][1:], program.pattern(it.features)[1:]).sum()
            for it in items
        ]
    )
    assert row["iou"] == pytest.approx(by_hand)


def test_the_attention_is_the_models(toy_atlas) -> None:
    """The cached attention equals ``mhsa.attend`` on the same text (the model's own)."""
    item = attention_of(toy_atlas, [5])[0]
    result = mhsa.attend(toy_atlas.text(5), model="toy:induction", engine="transformers")
    assert np.allclose(item.weights.reshape(result.attention.shape), result.attention, atol=1e-5)
    assert list(item.features.tokens) == toy_atlas.text_tokens(5)


def test_a_pattern_example_is_the_head_beside_the_program(toy_atlas) -> None:
    example = mhsa.explain.pattern_example(toy_atlas, "L0H3", "offset(-1)", text_id=5)
    result = mhsa.attend(toy_atlas.text(5), model="toy:induction", engine="transformers")
    assert np.allclose(example.attention, result.attention[0, 3], atol=1e-5)
    n = len(example.tokens)
    assert np.array_equal(example.pattern, np.eye(n, k=-1))  # row q: key q - 1
    first = mhsa.explain.pattern_example(toy_atlas, "L0H3", "first")
    assert first.text_id in split_texts(toy_atlas)[1]
    with pytest.raises(InputError, match="two tokens or more"):
        mhsa.explain.pattern_example(toy_atlas, "L0H3", "first", text_id=_one_token(toy_atlas))


def _one_token(atlas) -> int:
    lengths = np.diff(np.asarray(atlas.offsets))
    return int(np.flatnonzero(lengths < 2)[0])


def test_the_search_is_never_below_the_baselines(toy_atlas, toy_explained) -> None:
    search, _ = split_texts(toy_atlas)
    items = attention_of(toy_atlas, search)
    for head in ("L0H0", "L0H3", "L1H1"):
        i = toy_atlas.head(head)
        a = [it.weights[i] for it in items]
        chosen = toy_explained.candidates(head)["search_iou"][0]
        program = parse_program(toy_explained.candidates(head)["program"][0])
        assert chosen == pytest.approx(soft_iou(a, [program.pattern(it.features) for it in items]))
        for baseline in BASELINES:
            baseline_iou = soft_iou(a, [baseline.pattern(it.features) for it in items])
            assert chosen >= baseline_iou - 1e-9, (head, str(baseline))


def test_explanations_are_saved_and_read_back(toy_atlas, toy_explained) -> None:
    back = saved(toy_atlas)
    assert back is not None
    assert back.table.equals(toy_explained.table)
    assert back.candidates("L1H0").equals(toy_explained.candidates("L1H0"))
    assert back.notices == toy_explained.notices
    assert back.settings["held_out_texts"] == toy_explained.settings["held_out_texts"]
    # the atlas built again in its folder: the explanations of the old one are not its own
    rebuilt = mhsa.atlas.open_atlas(toy_atlas.folder)
    rebuilt.manifest["built"] = "2099-01-01T00:00:00Z"
    assert saved(rebuilt) is None


def _listing(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda a: score_program(a, "L0H3", "offset(-1"), ProgramError, "expected '\\)'"),
        (lambda a: score_program(a, "L0H3", "pos(NOPE, left, all)"), ProgramError, "NOPE"),
        (lambda a: score_program(a, "L9H9", "offset(-1)"), InputError, "no head 'L9H9'"),
        (
            lambda a: score_program(a, "L0H3", "when(NOUN, pos(DET, left, nearest))"),
            ProgramError,
            "reads part-of-speech tags .* this atlas's corpus has none",
        ),
        (lambda a: explain_heads(a, heads=["L0H3", "L9H9"]), InputError, "no head 'L9H9'"),
        (lambda a: explain_heads(a, held_out=1.5), InputError, "held_out must be"),
        (lambda a: explain_heads(a, top=0), InputError, "top must be"),
        (lambda a: score_program(a, "L0H3", "first", texts=[10_000]), InputError, "text ids of"),
    ],
)
def test_bad_input_gets_one_message_and_writes_nothing(toy_atlas, call, error, message) -> None:
    before = _listing(toy_atlas.folder)
    with pytest.raises(error, match=message) as caught:
        call(toy_atlas)
    assert "\n" not in str(caught.value)
    assert _listing(toy_atlas.folder) == before


# --- a planted head -----------------------------------------------------------------------------

#: a word -> tag lexicon; every word is one WordPiece of the embedded model's vocabulary
LEXICON = {
    "the": "DET",
    "a": "DET",
    "this": "DET",
    "dog": "NOUN",
    "cat": "NOUN",
    "man": "NOUN",
    "park": "NOUN",
    "house": "NOUN",
    "big": "ADJ",
    "red": "ADJ",
    "old": "ADJ",
    "saw": "VERB",
    "likes": "VERB",
    "ran": "VERB",
    "in": "ADP",
    "near": "ADP",
    "she": "PRON",
    "he": "PRON",
}
TEMPLATES = [
    "DET ADJ NOUN VERB DET NOUN",
    "DET NOUN VERB ADP DET ADJ NOUN",
    "NOUN VERB DET NOUN",  # a noun with no determiner before it
    "PRON VERB DET NOUN ADP NOUN",
    "DET ADJ ADJ NOUN VERB",
    "DET NOUN DET NOUN VERB",  # the second noun: two determiners on its left
    "ADJ NOUN VERB ADP DET NOUN",
]


def _planted_corpus(count: int, seed: int) -> list[TaggedText]:
    rng = np.random.default_rng(seed)
    by_tag: dict[str, list[str]] = {}
    for word, tag in LEXICON.items():
        by_tag.setdefault(tag, []).append(word)
    out = []
    for i in range(count):
        tags = TEMPLATES[i % len(TEMPLATES)].split()
        words = [str(rng.choice(by_tag[t])) for t in tags]
        out.append(TaggedText(" ".join(words), tuple(words), tuple(tags)))
    return out


def _planted_head(tokens: list[str]) -> np.ndarray:
    """By construction, from the lexicon (not the atlas's tags): a noun attends to the nearest
    determiner on its left, every other token (and a noun without one) to [CLS]."""
    n = len(tokens)
    a = np.zeros((n, n), np.float32)
    for q in range(n):
        target = 0
        if LEXICON.get(tokens[q]) == "NOUN":
            dets = [k for k in range(q) if LEXICON.get(tokens[k]) == "DET"]
            target = dets[-1] if dets else 0
        a[q, target] = 1
    return a


def test_a_planted_head_is_recovered_exactly(tmp_path, tiny_bert_path, monkeypatch) -> None:
    """A fake attention source: head L0H0's pattern is planted (``_planted_head``), the others
    uniform; everything else (tags, texts, split, search, scores) is the atlas's and the
    library's own path."""
    atlas = mhsa.atlas.build_atlas(
        _planted_corpus(48, seed=2), tmp_path / "planted", model=tiny_bert_path, progress=False
    )
    assert atlas.has_tags
    heads = len(atlas.labels)

    def planted(atlas_, text_ids):
        out = []
        for t in text_ids:
            features = explain_attention.atlas_features(atlas_, t)
            tokens = list(features.tokens)
            assert len(tokens) == len(atlas_.text(t).split()) + 2  # one piece a word
            n = len(tokens)
            weights = np.full((heads, n, n), 1 / n, np.float32)
            weights[0] = _planted_head(tokens)
            out.append(TextAttention(t, features, weights, np.ones((heads, n), np.float32)))
        return out

    explain_attention.clear_cache()
    monkeypatch.setattr(explain_attention, "_compute", planted)
    try:
        explained = explain_heads(atlas, heads=["L0H0"], faithfulness=False, progress=False)
    finally:
        explain_attention.clear_cache()
    row = explained.table.iloc[0]
    assert row["program"] == "when(NOUN, pos(DET, left, nearest)) | first"
    assert row["iou"] == pytest.approx(1.0) and row["accuracy"] == 1.0
    assert explained.candidates("L0H0")["search_iou"][0] == pytest.approx(1.0)
    assert row["accuracy"] > row["baseline_accuracy"]
    assert row["description"] == (
        "Attends from a noun to the nearest determiner on its left; otherwise to the first token."
    )
    assert not explained.notices


def test_an_encoder_with_tags_explained_with_faithfulness(tmp_path, tiny_bert_path) -> None:
    """The tiny BERT's own attention over the tagged corpus: every head gets a program and a
    faithfulness or the reason for none; each layer and the best quarter replaced at once."""
    atlas = mhsa.atlas.build_atlas(
        _planted_corpus(40, seed=5), tmp_path / "bert", model=tiny_bert_path, progress=False
    )
    explained = explain_heads(atlas, progress=False)
    table = explained.table
    assert list(table["head"]) == atlas.labels
    assert set(table["kind"]) <= set(mhsa.explain.programs.KINDS)
    for _, row in table.iterrows():
        assert np.isfinite(row["faithfulness"]) or row["faithfulness_note"], row["head"]
        assert 0 <= row["iou"] <= 1 and 0 <= row["accuracy"] <= 1
    assert list(explained.together["what"]) == ["L0", "L1", "best quarter"]
    assert explained.together["heads"].iloc[-1].count(",") == 1  # a quarter of 8 heads: 2
    assert saved(atlas).together.equals(explained.together)
    assert not explained.notices  # tagged: linguistic programs were tried

"""Corpus scale on one machine: batched == one by one, mergeable accumulators, bad input
reported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import mhsa
from mhsa.__main__ import main
from mhsa.analysis.similarity import HeadSimilarityAccumulator
from mhsa.analysis.stats import HeadStatsAccumulator
from mhsa.causal.importance import ImportanceAccumulator, corpus_importance
from mhsa.corpus.stats import corpus_stats
from mhsa.engine.runs.batches import (
    Corpus,
    attend_batched,
    attend_batches,
    length_batches,
    read_corpus,
)
from mhsa.errors import InputError

SENTENCES = Path(__file__).resolve().parents[1] / "data" / "sentences.txt"
_LINES = SENTENCES.read_text(encoding="utf-8").splitlines()
#: 1 to 30 words (the longest line third: the first six mix lengths too), a one-word line (no
#: previous token for most heads) and a quotation
MIXED = [*_LINES[:46:23], max(_LINES, key=len), *_LINES[46::23], "Hello", '"Stop!" he said.']
BATCH_TOKENS = 200  # small: several batches of different padding


def _assert_stats_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    numeric = a.select_dtypes("number").columns
    assert list(a.index) == list(b.index)
    np.testing.assert_allclose(a[numeric], b[numeric], rtol=0, atol=1e-6)
    assert (a["role"] == b["role"]).all() and (a["positional"] == b["positional"]).all()


def test_the_corpus_is_mixed_and_batches_group_by_length(minilm) -> None:
    lengths = [len(minilm.tokenizer(s)["input_ids"]) for s in MIXED]
    assert min(lengths) <= 4 and max(lengths) >= 30  # really mixed lengths
    batches = length_batches(lengths, BATCH_TOKENS)
    assert 1 < len(batches) < len(MIXED)  # batched, and not one by one
    assert sorted(i for b in batches for i in b) == list(range(len(MIXED)))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= BATCH_TOKENS or len(batch) == 1
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest == sorted(longest)  # grouped by length


@pytest.mark.parametrize(
    ("model_name", "engine"),
    [
        ("minilm", "transformers"),
        ("bert_sharp", "mhsa"),
        ("gpt2", "transformers"),
        ("gpt2", "mhsa"),
        ("llama", "mhsa"),
    ],
)
@pytest.mark.slow
def test_batched_equals_one_by_one_for_statistics_and_similarity(
    model_name, engine, request
) -> None:
    if model_name == "minilm":
        lm = request.getfixturevalue("minilm")
    else:
        lm = mhsa.load_model(request.getfixturevalue(f"tiny_{model_name}_path"), device="cpu")
    corpus = Corpus.of(MIXED)
    kwargs = {"model": lm, "engine": engine, "similarity": "js", "batch_tokens": BATCH_TOKENS}
    batched = corpus_stats(corpus.entries, **kwargs)
    one = corpus_stats(corpus.entries, batched=False, **kwargs)
    assert batched.used == one.used == len(MIXED) and not batched.problems
    _assert_stats_equal(batched.stats.frame(), one.stats.frame())
    js_b, js_o = batched.similarity.frame(), one.similarity.frame()
    np.testing.assert_allclose(js_b, js_o, rtol=1e-6, atol=1e-6)
    # divergences of real size against the tolerance (random tiny models have near-uniform heads)
    assert js_o.to_numpy().max() > (1.0 if model_name == "minilm" else 1e-4)
    # each sentence's attention is cut to its own tokens: rows sum to 1, nothing on padding
    for index, result in attend_batched(corpus.entries, lm, engine=engine, batch_tokens=200):
        n = len(mhsa.attend(MIXED[index], model=lm).tokens)
        assert result.attention.shape[-1] == n
        np.testing.assert_allclose(result.attention.sum(-1), 1.0, atol=1e-5)


def test_one_tokenizer_call_encodes_each_entry_as_one_by_one(minilm) -> None:
    from mhsa.engine.encoding import encode
    from mhsa.engine.runs.batches import encode_entries

    texts = [*MIXED, "[CLS] typed, and émigré naïveté", " ".join(["word"] * 600)]
    entries = Corpus.of(texts).entries
    encoded, problems = encode_entries(minilm, entries, None)
    assert [i for i, _ in encoded] == list(range(len(texts) - 1))  # the last is too long
    assert [p.reason for p in problems] == [
        "The text is 602 tokens long; sentence-transformers/all-MiniLM-L6-v2 accepts at most "
        "512. Shorten it, or set max_tokens to truncate."
    ]
    for i, got in encoded:
        want = encode(minilm, texts[i], None, None)
        assert got.tokens == want.tokens
        assert sorted(got.inputs) == sorted(want.inputs)
        for key, value in want.inputs.items():
            assert torch.equal(got.inputs[key], value), key


@pytest.mark.slow
def test_the_batched_pass_stops_after_the_last_attention(minilm, monkeypatch) -> None:
    """The last layer's feed-forward block changes no attention weight: it does not run, and
    the weights equal the whole model's; a model that does not name its attention modules runs
    whole (the same weights)."""
    entries = Corpus.of(MIXED[:6]).entries
    ran: list[int] = []
    layers = minilm.model.encoder.layer
    hooks = [
        layer.intermediate.register_forward_hook(lambda *_, i=i: ran.append(i))
        for i, layer in enumerate(layers)
    ]
    try:
        stopped = [r for b in attend_batches(entries, minilm, batch_tokens=BATCH_TOKENS) for r in b]
        assert ran and set(ran) == set(range(len(layers) - 1))  # never the last layer's
        ran.clear()
        monkeypatch.setattr(type(minilm.model), "_can_record_outputs", {}, raising=False)
        whole = [r for b in attend_batches(entries, minilm, batch_tokens=BATCH_TOKENS) for r in b]
        assert set(ran) == set(range(len(layers)))  # the fallback runs all of it
    finally:
        for h in hooks:
            h.remove()
    assert [i for i, _ in stopped] == [i for i, _ in whole]
    for (i, a), (_, b) in zip(stopped, whole, strict=True):
        np.testing.assert_array_equal(a.attention, b.attention)
        expected = mhsa.attend(entries[i].text, model=minilm).attention
        np.testing.assert_allclose(a.attention, expected, atol=1e-5)  # padded: BLAS rounding


@pytest.mark.slow
def test_our_engine_stops_after_its_last_block_and_puts_the_model_back(minilm) -> None:
    """Through our module too, the last layer's feed-forward block does not run; the weights
    equal our module's whole pass one by one, and the model's own blocks are back afterwards."""
    entries = Corpus.of(MIXED[:6]).entries
    layers = minilm.model.encoder.layer
    original = [type(layer.attention.self) for layer in layers]
    ran: list[int] = []
    hooks = [
        layer.intermediate.register_forward_hook(lambda *_, i=i: ran.append(i))
        for i, layer in enumerate(layers)
    ]
    try:
        got = [
            r
            for b in attend_batches(entries, minilm, engine="mhsa", batch_tokens=BATCH_TOKENS)
            for r in b
        ]
    finally:
        for h in hooks:
            h.remove()
    assert ran and set(ran) == set(range(len(layers) - 1))  # never the last layer's
    assert [type(layer.attention.self) for layer in layers] == original
    assert sorted(i for i, _ in got) == list(range(len(entries)))
    for i, result in got:
        expected = mhsa.attend(entries[i].text, model=minilm, engine="mhsa").attention
        np.testing.assert_allclose(result.attention, expected, atol=1e-5)


@pytest.mark.slow
def test_word_level_statistics_batched_equal_one_by_one(minilm) -> None:
    corpus = Corpus.of(MIXED[:8])
    kwargs = {"model": minilm, "word_level": True, "batch_tokens": BATCH_TOKENS}
    batched = corpus_stats(corpus.entries, **kwargs)
    one = corpus_stats(corpus.entries, batched=False, **kwargs)
    _assert_stats_equal(batched.stats.frame(), one.stats.frame())


@pytest.mark.parametrize(
    ("model_name", "method", "target", "pairs"),
    [
        ("bert_sharp", "ablation", "embedding", False),
        ("bert_sharp", "ablation", "similarity", True),
        ("minilm", "gradient", "similarity", True),
        ("gpt2", "ablation", "lm-loss", False),
        ("gpt2", "gradient", "lm-loss", False),
        ("bert_mlm", "ablation", "lm-loss", False),
    ],
)
@pytest.mark.slow
def test_batched_importance_equals_one_by_one(model_name, method, target, pairs, request) -> None:
    if model_name == "minilm":
        lm = request.getfixturevalue("minilm")
    else:
        lm = mhsa.load_model(request.getfixturevalue(f"tiny_{model_name}_path"), device="cpu")
    texts = MIXED[:6]
    items = list(zip(texts, texts[::-1], strict=True)) if pairs else texts
    expected = mhsa.causal.head_importance(items, model=lm, method=method, target=target)
    acc = corpus_importance(
        Corpus.of(items).entries, model=lm, method=method, target=target, batch_tokens=300
    )
    got = acc.frame()
    assert got.attrs["texts"] == expected.attrs["texts"] == 6
    assert got.attrs["target"] == expected.attrs["target"] == target
    for column in expected.columns.drop(["layer", "head"]):
        np.testing.assert_allclose(got[column], expected[column], rtol=1e-5, atol=1e-6)
    assert expected["importance"].abs().max() > 1e-4  # the tolerance is small against the values


@pytest.mark.slow
def test_merge_is_associative_and_order_independent(minilm) -> None:
    results = [mhsa.attend(s, model=minilm) for s in MIXED[:9]]
    shards = [results[:2], results[2:7], results[7:]]

    def shard(kind, items):
        acc = HeadStatsAccumulator() if kind == "stats" else HeadSimilarityAccumulator("cosine")
        for r in items:
            acc.add(r)
        return acc

    for kind in ("stats", "sim"):
        whole = shard(kind, results).frame()
        orders = [(0, 1, 2), (2, 1, 0), (1, 2, 0)]
        for order in orders:
            merged = shard(kind, shards[order[0]])
            merged.merge(shard(kind, shards[order[1]]).merge(shard(kind, shards[order[2]])))
            got = merged.frame()
            assert merged.count == 9
            numeric = whole.select_dtypes("number").columns
            np.testing.assert_allclose(got[numeric], whole[numeric], rtol=1e-12, atol=1e-12)
        empty = HeadStatsAccumulator() if kind == "stats" else HeadSimilarityAccumulator("cosine")
        alone = shard(kind, results)
        alone.merge(empty)  # merging nothing changes nothing
        np.testing.assert_allclose(alone.frame()[numeric], whole[numeric], rtol=0, atol=0)


def test_importance_accumulator_merge_equals_the_moments_of_all_values() -> None:
    rng = np.random.default_rng(0)
    values = rng.gamma(2.0, 0.01, size=(11, 3, 4)) * rng.choice([-1, 1], size=(11, 3, 4))
    for method in ("ablation", "gradient"):
        parts = [values[:1], values[1:6], values[6:]]
        accs = []
        for part in parts:
            acc = ImportanceAccumulator(method, "lm-loss")
            acc.add(part)
            accs.append(acc)
        for order in [(0, 1, 2), (2, 0, 1), (1, 2, 0)]:
            merged = ImportanceAccumulator(method, "lm-loss")
            for i in order:
                copy = ImportanceAccumulator(method, "lm-loss")
                merged.merge(copy.merge(accs[i]))
            frame = merged.frame()
            if method == "ablation":
                np.testing.assert_allclose(frame["importance"], values.mean(0).ravel(), atol=1e-15)
                np.testing.assert_allclose(frame["std"], values.std(0).ravel(), atol=1e-15)
            else:
                want = np.abs(values).mean(0).ravel()
                np.testing.assert_allclose(frame["importance"], want, atol=1e-15)
                np.testing.assert_allclose(frame["gradient"], values.mean(0).ravel(), atol=1e-15)
    with pytest.raises(ValueError, match="Cannot merge gradient/lm-loss"):
        ImportanceAccumulator("ablation", "lm-loss").merge(
            ImportanceAccumulator("gradient", "lm-loss")
        )


def test_merging_different_kinds_is_refused(minilm) -> None:
    a, b = HeadStatsAccumulator(), HeadStatsAccumulator(word_level=True)
    a.add(mhsa.attend("The cat sat.", model=minilm))
    b.add(mhsa.attend("The cat sat.", model=minilm))
    with pytest.raises(ValueError, match="word-level"):
        a.merge(b)
    with pytest.raises(ValueError, match="cosine similarity into js"):
        HeadSimilarityAccumulator("js").merge(HeadSimilarityAccumulator("cosine"))


def test_read_corpus_reports_every_bad_line_by_place(tmp_path) -> None:
    text = tmp_path / "a.txt"
    text.write_bytes(b"The cat sat.\n\n\xff\xfe broken bytes\nNUL \x00 inside\n  Dogs bark.  \n")
    corpus = read_corpus(text)
    assert [(e.where, e.text) for e in corpus.entries] == [
        ("a.txt:1", "The cat sat."),
        ("a.txt:5", "Dogs bark."),
    ]
    assert [(p.where, p.reason) for p in corpus.problems] == [
        ("a.txt:3", "not UTF-8 text"),
        ("a.txt:4", "contains NUL characters (binary data?)"),
    ]
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("A cat.\tA dog.\nno tab here\n\tonly second\n", encoding="utf-8")
    read = read_corpus(pairs, pairs=True)
    assert [(e.text, e.pair) for e in read.entries] == [("A cat.", "A dog.")]
    assert [p.where for p in read.problems] == ["pairs.txt:2", "pairs.txt:3"]
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "b.txt").write_text("Second file.\n", encoding="utf-8")
    (folder / "a.txt").write_text("First file.\n", encoding="utf-8")
    (folder / "notes.md").write_text("not read\n", encoding="utf-8")
    assert [e.where for e in read_corpus(folder).entries] == ["a.txt:1", "b.txt:1"]
    with pytest.raises(InputError, match="no usable sentences \\(1 bad\\)"):
        (tmp_path / "bad.txt").write_bytes(b"\xff\n\n")
        read_corpus(tmp_path / "bad.txt")
    with pytest.raises(InputError, match="Cannot read"):
        read_corpus(tmp_path / "missing.txt")


def test_read_corpus_takes_a_parquet_column(tmp_path) -> None:
    path = tmp_path / "corpus.parquet"
    frame = pd.DataFrame({"id": [1, 2, 3, 4], "sentence": ["The cat sat.", None, "  ", "Dogs."]})
    frame.to_parquet(path)
    corpus = read_corpus(path, column="sentence")
    assert [(e.where, e.text) for e in corpus.entries] == [
        ("corpus.parquet:row 1", "The cat sat."),
        ("corpus.parquet:row 4", "Dogs."),
    ]
    assert [(p.where, p.reason) for p in corpus.problems] == [
        ("corpus.parquet:row 2", "not a string (missing or another type)"),
        ("corpus.parquet:row 3", "empty text"),
    ]
    with pytest.raises(InputError, match="no column 'text'"):
        read_corpus(path)


@pytest.mark.slow
def test_a_sentence_over_the_token_limit_is_reported_not_dropped(minilm) -> None:
    long = "word " * 600
    corpus = Corpus.of(["The cat sat.", long, "Dogs bark."], source="c.txt")
    result = corpus_stats(corpus.entries, model=minilm)
    assert result.used == 2
    assert [p.where for p in result.problems] == ["c.txt:2"]
    assert "accepts at most 512" in result.problems[0].reason
    truncated = corpus_stats(corpus.entries, model=minilm, max_tokens=64)
    assert truncated.used == 3 and not truncated.problems
    problems: list = []
    acc = corpus_importance(corpus.entries, model=minilm, problems=problems)
    assert acc.count == 2 and [p.where for p in problems] == ["c.txt:2"]


@pytest.mark.slow
def test_cli_stats_reports_bad_lines_and_writes_them(tmp_path, capsys, minilm) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "one.txt").write_bytes(b"The cat sat on the mat.\n\xff bad\n")
    (folder / "two.txt").write_text("Dogs bark.\n" + "word " * 600 + "\n", encoding="utf-8")
    out, bad = tmp_path / "stats.csv", tmp_path / "bad.csv"
    assert main(["stats", str(folder), "--out", str(out), "--problems", str(bad)]) == 0
    printed = capsys.readouterr()
    assert "2 entries not used" in printed.err and "one.txt:2: not UTF-8 text" in printed.err
    assert "sent/s" in printed.err  # the progress bar's rate
    assert "(2 sentences, 72 heads)" in printed.out
    problems = pd.read_csv(bad)
    assert list(problems["where"]) == ["one.txt:2", "two.txt:2"]
    table = pd.read_csv(out, index_col="name")
    want = mhsa.head_stats(
        [mhsa.attend(s, model=minilm) for s in ["The cat sat on the mat.", "Dogs bark."]]
    )
    np.testing.assert_allclose(table["entropy"], want["entropy"], atol=1e-6)


def test_cli_refuses_a_corpus_with_nothing_usable(tmp_path, capsys) -> None:
    path = tmp_path / "long.txt"
    path.write_text("word " * 600 + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["stats", str(path), "--out", str(tmp_path / "x.csv")])
    assert exc.value.code == 2
    assert "No sentence of the corpus could be used" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batched_on_the_gpu_equals_one_by_one_on_the_cpu(minilm) -> None:
    gpu = mhsa.load_model("default", device="cuda")
    entries = Corpus.of(MIXED).entries
    for engine in ("transformers", "mhsa"):
        got = corpus_stats(entries, model=gpu, engine=engine, similarity="js")
        want = corpus_stats(entries, model=minilm, engine=engine, batched=False, similarity="js")
        a, b = got.stats.frame(), want.stats.frame()
        numeric = a.select_dtypes("number").columns
        np.testing.assert_allclose(a[numeric], b[numeric], rtol=0, atol=1e-5)  # GPU kernels
        np.testing.assert_allclose(got.similarity.frame(), want.similarity.frame(), atol=1e-4)
    acc = corpus_importance(entries[:4], model=gpu)
    want = mhsa.causal.head_importance(MIXED[:4], model=minilm)
    np.testing.assert_allclose(acc.frame()["importance"], want["importance"], atol=1e-5)

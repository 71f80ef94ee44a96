"""``python -m mhsa weights`` and ``python -m mhsa qk`` on toy:induction: their CSVs against the
library's values computed here, their errors in one line with exit code 2."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import mhsa
from mhsa.__main__ import main
from tests.test_cli_analyses import exits_2_with_one_line

TOY = ["--model", "toy:induction", "--device", "cpu"]
TEXT = "ro te mi bu gu ka be pa ku ro te mi bu gu ka"


@pytest.fixture(scope="module")
def toy() -> mhsa.engine.LoadedModel:
    return mhsa.load_model("toy:induction", device="cpu")


def test_weights_copying_writes_every_heads_score(tmp_path, toy, capsys) -> None:
    assert main(["weights", "--copying", *TOY]) == 0
    printed = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out), index_col="head")
    want = mhsa.analysis.ov_copying_scores(toy)
    assert list(printed.index) == list(want.index)
    np.testing.assert_allclose(printed["copying score"], want.to_numpy(), rtol=1e-12)
    out = tmp_path / "top.csv"
    assert (
        main(
            [
                "weights",
                "--top-tokens",
                "L1H0",
                "--k",
                "3",
                "--tokens",
                "ba",
                "ko",
                *TOY,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    top = pd.read_csv(out)
    want = mhsa.analysis.ov_top_tokens("L1H0", toy, tokens=["ba", "ko"], k=3)
    assert list(top["output"]) == list(want["output"]) and len(top) == 6
    assert "wrote" in capsys.readouterr().out


def test_qk_writes_terms_that_sum_to_each_keys_score(tmp_path, toy) -> None:
    out = tmp_path / "qk.csv"
    assert main(["qk", TEXT, "--head", "L1H3", "--query", "12", *TOY, "--out", str(out)]) == 0
    written = pd.read_csv(out)
    want = mhsa.analysis.qk_attribution.qk_attribution(TEXT, "L1H3", model=toy, query=12)
    assert list(written.columns) == ["query_source", "key_source", "key", "score", "key_token"]
    np.testing.assert_allclose(written["score"], want["score"], rtol=1e-12)
    assert sorted(written["key"].unique()) == list(range(13))
    tokens = want.attrs["tokens"]
    assert list(written["key_token"]) == [tokens[k] for k in want["key"]]


def test_qk_on_the_default_model_splits_every_key(minilm, capsys) -> None:
    """MiniLM (a post-norm encoder): the largest terms of a query's row, as the library gives
    them."""
    text = "the cat sat on the mat"
    assert main(["qk", text, "--head", "L3H2", "--query", "2", "--top", "5"]) == 0
    written = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    want = mhsa.analysis.qk_attribution.qk_attribution(
        text, "L3H2", model=minilm, query=2
    ).nlargest(5, "score")
    np.testing.assert_allclose(written["score"], want["score"], rtol=1e-12)
    assert list(written["key_source"]) == list(want["key_source"].astype(str))


SEQ2SEQ = ["--model", "toy:reverse-seq2seq", "--device", "cpu"]


def test_qk_on_an_encoder_decoders_decoder_head(tmp_path) -> None:
    """The shipped BART: a decoder head teacher-forced on --target, as the library splits it."""
    out = tmp_path / "qk.csv"
    text, target = "da de di do", "do di de da"
    argv = ["qk", text, "--head", "D1H2", "--target", target, *SEQ2SEQ, "--out", str(out)]
    assert main(argv) == 0
    written = pd.read_csv(out)
    want = mhsa.analysis.qk_attribution.qk_attribution(
        text, "D1H2", model="toy:reverse-seq2seq", text_pair=target
    )
    np.testing.assert_allclose(written["score"], want["score"], rtol=1e-12)
    assert list(written["key_token"]) == [want.attrs["tokens"][k] for k in want["key"]]
    assert "C0H1" in set(written["key_source"])  # the cross heads write the decoder's stream


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["qk", TEXT, "--head", "L5H0", *TOY], "There is no head L5H0"),
        (["qk", "da de", "--head", "C0H1", *SEQ2SEQ], "C0H1 is a cross-attention head"),
        (["qk", TEXT, "--head", "L1H0", "--query", "40", *TOY], "no query position 40"),
        (["qk", TEXT, "--head", "L1H0", "--top", "0", *TOY], "--top must be at least 1"),
        (["weights", "--positional", *TOY], "rotary positions"),
        (["weights", "--top-tokens", "L1H9", *TOY], "There is no head L1H9"),
        (["weights", "--top-tokens", "L1H0", "--tokens", "zz<b>", *TOY], "'zz<b>' is not a token"),
        (["weights", *TOY], "one of the arguments --copying --top-tokens --positional"),
        (["weights", "--top-tokens", "L0H0", "--model", "default"], "no next-token head"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    exits_2_with_one_line(argv, message, capsys)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_examples_run(tmp_path, monkeypatch, capsys) -> None:
    """Every example of ``--help``, as printed, runs (CSV to stdout or its --out)."""
    import shlex

    from mhsa.cli import qk, weights

    monkeypatch.chdir(tmp_path)
    for example in (*weights.EXAMPLES, *qk.EXAMPLES):
        assert main([*shlex.split(example)[3:], "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("head,copying score\nL0H0,") and "query_source,key_source" in out
    assert [p.name for p in tmp_path.iterdir()] == ["top.csv"]

"""python -m mhsa: attend, info, stats, and its answers to bad arguments."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pandas as pd
import pytest

import mhsa
from mhsa.__main__ import main


def test_attend_prints_summary_and_writes_result(tmp_path, capsys) -> None:
    out = tmp_path / "cat.npz"
    args = ["attend", "The cat sat on the mat.", "--engine", "mhsa", "--verify", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "[CLS] the cat sat on the mat . [SEP]" in text
    assert "[6, 12, 9, 9]" in text and "max |ours - model| attention per layer" in text
    per_layer = text.split("attention per layer: ")[1].splitlines()[0].split(", ")
    assert len(per_layer) == 6 and all(float(d) < 1e-4 for d in per_layer)
    assert float(text.split("final hidden state: ")[1].split()[0]) < 1e-4
    r = mhsa.AttentionResult.load(out)
    assert r.engine == "mhsa" and r.attention.shape == (6, 12, 9, 9)


def _softmax(scores: np.ndarray, causal: bool) -> np.ndarray:
    if causal:
        scores = np.where(np.triu(np.ones(scores.shape, bool), 1), -np.inf, scores)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _embedded(page: str) -> dict:
    """The data a written page embeds for its view."""
    found = re.search(r'<script type="application/json" class="mhsa-data">(.*?)</script>', page)
    assert found is not None
    return json.loads(found.group(1))


def _embedded_vectors(page: str) -> tuple[dict, np.ndarray, np.ndarray]:
    """The neuron view's data in a written page: its header, q ``[L, H, m, d]``, k."""
    data = _embedded(page)
    shape = (data["L"], data["H"])
    q = np.frombuffer(base64.b64decode(data["q"]), "<f4").reshape(*shape, data["m"], data["d"])
    k = np.frombuffer(base64.b64decode(data["kv"]), "<f4").reshape(*shape, data["n"], data["d"])
    return data, q, k


@pytest.mark.parametrize("flags", [["--qk"], []])
def test_attend_keeps_query_and_key_vectors_for_the_neuron_view(tmp_path, capsys, flags) -> None:
    """``--qk`` (or ``--view neuron``, which needs them): the saved q and k give back the
    attention the transformers engine computed (softmax of q k^T * scale, later keys masked:
    toy:induction is a decoder), and the page written holds the same vectors."""
    out, page = tmp_path / "toy.npz", tmp_path / "toy.html"
    text = "ba be bi bo du ba be bi bo du"
    argv = ["attend", text, "--model", "toy:induction", "--out", str(out), "--html", str(page)]
    assert main([*argv, "--view", "neuron", *flags]) == 0
    printed = capsys.readouterr().out
    r = mhsa.AttentionResult.load(out)
    assert r.q is not None and r.k is not None and r.causal
    assert f"q, k     {list(r.q.shape)}" in printed and "(neuron view)" in printed
    scores = np.einsum("lhqd,lhkd->lhqk", r.q.astype(np.float64), r.k.astype(np.float64))
    np.testing.assert_allclose(_softmax(scores * r.qk_scale, True), r.attention, atol=1e-5)
    data, q, k = _embedded_vectors(page.read_text(encoding="utf-8"))
    assert data["scale"] == pytest.approx(r.qk_scale)
    np.testing.assert_array_equal(q, r.q)
    np.testing.assert_array_equal(k, r.k)
    assert "http" not in page.read_text(encoding="utf-8").replace("http://www.w3.org/2000/svg", "")


def test_attend_without_qk_keeps_no_vectors_and_draws_the_heads(tmp_path, capsys) -> None:
    out, page = tmp_path / "cat.npz", tmp_path / "cat.html"
    argv = ["attend", "The <b>cat</b> sat.", "--out", str(out), "--html", str(page)]
    assert main(argv) == 0
    assert "(heads view)" in capsys.readouterr().out
    r = mhsa.AttentionResult.load(out)
    assert r.q is None and r.k is None
    written = page.read_text(encoding="utf-8")
    assert written.startswith("<!doctype html>")
    assert _embedded(written)["keys"] == r.tokens and "<" in r.tokens
    assert re.search(r"<b\b", written) is None  # the tokens "<", "b", ">" stay text


def test_attend_views_are_the_notebooks() -> None:
    from mhsa.cli.attend import VIEWS as CLI_VIEWS
    from mhsa.plots.notebook import VIEWS

    assert CLI_VIEWS == VIEWS


def test_info_prints_model_facts(capsys) -> None:
    assert main(["info", "--model", "default", "--device", "cpu"]) == 0
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert lines["layers"] == "6" and lines["heads"] == "12"
    assert lines["d_model"] == "384" and lines["d_head"] == "32"
    assert lines["max_positions"] == "512"


@pytest.mark.slow
def test_stats_matches_head_stats_on_the_same_sentences(tmp_path, capsys, minilm) -> None:
    sentences = ["The cat sat on the mat.", "", "Dogs bark, cats meow."]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences), encoding="utf-8")
    out, sim = tmp_path / "stats.csv", tmp_path / "sim.csv"
    assert (
        main(["stats", str(corpus), "--out", str(out), "--similarity", str(sim), "--device", "cpu"])
        == 0
    )
    table = pd.read_csv(out, index_col="name")
    want = mhsa.head_stats([mhsa.attend(s, model=minilm) for s in sentences if s])
    assert len(table) == 72
    np.testing.assert_allclose(table["entropy"], want["entropy"], rtol=1e-6)
    assert (table["role"] == want["role"]).all()
    assert pd.read_csv(sim, index_col=0).shape == (72, 72)
    assert "2 sentences" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["attend", "   "], "The text is empty"),
        (["attend", "x", "--engine", "bogus"], "invalid choice: 'bogus'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["attend", "x", "--model", "no/such-model-here"], "not found locally"),
        (["stats", "/no/such/file.txt", "--out", "x.csv"], "Cannot read /no/such/file.txt"),
        # files to write are checked before any work, not after the corpus ran
        (["stats", "c.txt", "--out", "/no/dir/s.csv"], "--out /no/dir/s.csv: the folder /no/dir "),
        (["stats", "c.txt", "--out", "s.csv", "--similarity", "/no/d/j.csv"], "folder /no/d does"),
        (["stats", "c.txt", "--out", "s.csv", "--problems", "/no/p/b.csv"], "folder /no/p does"),
        (["importance", "c.txt", "--out", "i.csv", "--pruning", "/no/q/c.csv"], "folder /no/q"),
        (["attend", "x", "--out", "/no/r/x.npz"], "--out /no/r/x.npz: the folder /no/r does"),
        (["attend", "x", "--html", "/no/h/x.html"], "--html /no/h/x.html: the folder /no/h"),
        (["attend", "x", "--html", "x.html", "--view", "grid"], "invalid choice: 'grid'"),
        (["stats", "c.txt", "--out", "/"], "--out / is a folder: give a file name."),
        (["stats", "c.txt", "--out", "s.csv", "--max-tokens", "0"], "--max-tokens must be at"),
        (["stats", "c.txt", "--out", "s.csv", "--ray", "--workers", "0"], "--workers must be at"),
        (["importance", "c.txt", "--out", "s.csv", "--shard-size", "-2"], "least 1, got -2."),
        (["train", "parity", "--out", "t"], "invalid choice: 'parity'"),
        (
            ["train", "copy", "--out", "t", "--layers", "9"],
            "layers must be a whole number between 1 and 4, got",
        ),
        (
            ["train", "copy", "--out", "t", "--steps", "0"],
            "steps must be a whole number between 1 and",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("python -m mhsa")


@pytest.mark.slow
def test_importance_matches_the_library_and_writes_the_pruning_curve(
    tmp_path, capsys, minilm
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat.\n\nDogs bark at night.\n", encoding="utf-8")
    out, curve = tmp_path / "importance.csv", tmp_path / "pruning.csv"
    argv = ["importance", str(corpus), "--method", "ablation", "--out", str(out)]
    assert main([*argv, "--pruning", str(curve), "--seed", "3"]) == 0
    printed = capsys.readouterr()
    assert "2 texts, 72 heads, ablation, embedding" in printed.out
    assert "importance" in printed.err  # the progress bar
    table = pd.read_csv(out, index_col="name")
    expected = mhsa.causal.head_importance(
        ["The cat sat on the mat.", "Dogs bark at night."], model=minilm
    )
    assert list(table.index) == list(expected.index)
    # the command batches sentences (padded): equal to one by one within float rounding
    np.testing.assert_allclose(table["importance"], expected["importance"], rtol=0, atol=1e-6)
    assert table["importance"].max() > 100 * 1e-6  # the tolerance is small against the values
    pruning = pd.read_csv(curve)
    assert set(pruning["order"]) == {"importance", "random"}
    assert pruning["heads_pruned"].max() == 72


def test_train_writes_a_toy_model_that_attend_opens(tmp_path, capsys) -> None:
    out = tmp_path / "copy"
    args = ["train", "copy", "--out", str(out), "--steps", "4", "--width", "16", "--seed", "2"]
    assert main(args) == 0
    text = capsys.readouterr()
    assert f"wrote    {out}" in text.out and "step     4  loss" in text.err
    card = (out / "README.md").read_text()
    assert f"python -m mhsa train copy --out {out} --seed 2 --width 16 --steps 4" in card
    r = mhsa.attend("ba be bi", model=str(out), engine="mhsa", verify=True, device="cpu")
    assert r.tokens == ["[BOS]", "ba", "be", "bi"] and r.max_abs_diff < 1e-5


def test_train_an_encoder_decoder_task_picks_bart_unless_told(tmp_path, capsys) -> None:
    out = tmp_path / "rs"
    args = ["train", "reverse-seq2seq", "--out", str(out), "--steps", "3", "--width", "16"]
    assert main([*args, "--layers", "1"]) == 0
    text = capsys.readouterr()
    assert "anti-diagonal" in text.err and "induction" not in text.err
    card = (out / "README.md").read_text()
    assert (
        f"python -m mhsa train reverse-seq2seq --out {out} --seed 0 --layers 1 --width 16 " in card
    )
    assert "--family" not in card and "BartForConditionalGeneration" in card
    r = mhsa.attend("ba be bi", text_pair="bi be ba", model=str(out), engine="mhsa", verify=True)
    # decoder rows: its teacher-forced input [BOS] bi be (the last target symbol is only a label)
    assert r.cross_attention.shape == (1, 4, 3, 4) and r.max_abs_diff < 1e-5
    with pytest.raises(SystemExit) as exc:
        main([*args, "--family", "llama"])
    assert exc.value.code == 2
    assert "needs an encoder-decoder family (bart), not 'llama'" in capsys.readouterr().err

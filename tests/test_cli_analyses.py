"""The commands that do what the analysis pages do (issue 37.5): ``roles``, ``patch`` and
``flow`` on toy:induction, their files against the library's values computed here; their errors
in one line; and every command's ``--help`` with its example."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import mhsa
from mhsa.__main__ import main

TEXT = "ba ke mo di ba ke mo di"
CLEAN, CORRUPTED = "ba ke mo di fu lo ba ke mo di", "ba ke mo ra fu lo ba ke mo di"
FLOW_TEXT = "ba ke mo di lu ba ke mo"
TOY = ["--model", "toy:induction", "--device", "cpu"]


@pytest.fixture(scope="module")
def toy() -> mhsa.engine.LoadedModel:
    return mhsa.load_model("toy:induction", device="cpu")


def _close(got, want) -> None:
    """The CSV's values equal the library's (float32 values are written in their own shortest
    form, which read back as float64 differ from them below float32's precision)."""
    np.testing.assert_allclose(np.asarray(got, float), np.asarray(want, float), rtol=1e-6, atol=0)


@pytest.mark.slow
def test_roles_writes_detection_sinks_and_composition(tmp_path, toy) -> None:
    out, sinks, comp = tmp_path / "r.csv", tmp_path / "s.csv", tmp_path / "c.csv"
    argv = ["roles", TEXT, "ba ke mo di lu ba ke mo", *TOY, "--out", str(out)]
    assert main([*argv, "--sinks", str(sinks), "--composition", str(comp), "--kind", "K"]) == 0
    table = pd.read_csv(out, index_col="head")
    assert list(table.columns) == ["previous token", "duplicate token", "induction"]
    texts = [TEXT, "ba ke mo di lu ba ke mo"]
    for pattern in table.columns:
        _close(table[pattern], mhsa.detect_heads(texts, pattern, model=toy)["score"])
    # the shipped induction model: its best induction head is in layer 1, previous-token in 0
    assert table["induction"].idxmax().startswith("L1")
    assert table["previous token"].idxmax().startswith("L0")
    written = pd.read_csv(sinks, keep_default_na=False)
    for number, text in enumerate(texts):
        want = mhsa.analysis.attention_sinks(mhsa.attend(text, model=toy)).table
        mine = written[written["text"] == number].reset_index(drop=True)
        assert list(mine["head"]) == list(want["head"]) and list(mine["token"]) == list(
            want["token"]
        )
        # a causal model's last keys are not measured (too few queries): empty cells, NaN
        _close(mine["received"].replace("", "nan"), want["received"])
        assert list(mine["sink"]) == list(want["sink"])
    composition = pd.read_csv(comp)
    want = mhsa.analysis.head_composition(toy, "K")
    assert set(composition["kind"]) == {"K"} and len(composition) == want.size
    for row in composition.itertuples():
        assert row.score == pytest.approx(want.loc[row.writer, row.reader], abs=1e-7)
    assert composition["score"].max() > 0.05  # not all zeros: a later layer reads an earlier one


@pytest.mark.slow
def test_roles_without_texts_runs_the_random_token_induction_test(tmp_path, toy) -> None:
    out = tmp_path / "r.csv"
    assert main(["roles", *TOY, "--out", str(out), "--seed", "3"]) == 0
    table = pd.read_csv(out, index_col="head")
    assert list(table.columns) == ["induction"]
    _close(table["induction"], mhsa.detect_heads(None, "induction", model=toy, seed=3)["score"])


@pytest.mark.slow
def test_patch_writes_heads_positions_and_attribution(tmp_path, toy, capsys) -> None:
    heads, positions, attribution = (tmp_path / f"{n}.csv" for n in ("h", "p", "a"))
    argv = ["patch", CLEAN, CORRUPTED, *TOY, "--answer", "fu", "--wrong", "lo"]
    files = ["--out", str(heads), "--attribution", str(attribution)]
    assert main([*argv, *files, "--layer", "1", "--positions", str(positions)]) == 0
    options = {"model": toy, "answer": "fu", "wrong": "lo"}
    want = mhsa.causal.patch_heads(CLEAN, CORRUPTED, **options)
    summary = f"clean {want.attrs['clean']:.4g}, corrupted {want.attrs['corrupted']:.4g}"
    assert summary in capsys.readouterr().out  # the metric's values
    got = pd.read_csv(heads, index_col="name")
    assert list(got.index) == list(want.index)
    _close(got["effect"], want["effect"])
    _close(got["patched"], want["patched"])
    want = mhsa.causal.patch_positions(CLEAN, CORRUPTED, 1, **options)
    got = pd.read_csv(positions)
    assert list(got["token"]) == list(want["token"]) and set(got["layer"]) == {1}
    _close(got["effect"], want["effect"])
    want = mhsa.causal.attribution_patching(CLEAN, CORRUPTED, **options)
    _close(pd.read_csv(attribution, index_col="name")["attribution"], want["attribution"])


@pytest.mark.slow
def test_patch_of_one_kind_of_activation(tmp_path, toy) -> None:
    out = tmp_path / "v.csv"
    argv = ["patch", CLEAN, CORRUPTED, *TOY, "--answer", "fu", "--wrong", "lo", "--what", "v"]
    assert main([*argv, "--out", str(out), "--batch-size", "3"]) == 0
    want = mhsa.causal.patch_heads(CLEAN, CORRUPTED, model=toy, answer="fu", wrong="lo", what="v")
    _close(pd.read_csv(out, index_col="name")["effect"], want["effect"])
    z = mhsa.causal.patch_heads(CLEAN, CORRUPTED, model=toy, answer="fu", wrong="lo")
    assert not np.allclose(want["effect"], z["effect"])  # --what reached the library


@pytest.mark.slow
def test_flow_writes_attribution_csv_and_routes_json(tmp_path, toy) -> None:
    dla, routes = tmp_path / "dla.csv", tmp_path / "routes.json"
    argv = ["flow", FLOW_TEXT, *TOY, "--answer", "di", "--wrong", "lu", "--out", str(dla)]
    assert main([*argv, "--routes", str(routes), "--threshold", "0.1"]) == 0
    want = mhsa.causal.head_attribution(FLOW_TEXT, model=toy, answer="di", wrong="lu")
    got = pd.read_csv(dla)
    assert list(got["component"]) == list(want.frame()["component"])
    _close(got["contribution"], want.frame()["contribution"])
    assert got["contribution"].sum() == pytest.approx(want.logit_diff, abs=1e-3)
    graph = mhsa.causal.information_flow(FLOW_TEXT, model=toy, threshold=0.1)
    written = json.loads(routes.read_text())
    assert written["tokens"] == list(graph.tokens) and written["threshold"] == 0.1
    assert [n["name"] for n in written["nodes"]] == [n.name for n in graph.nodes]
    edges = {(e["source"], e["target"]): e["weight"] for e in written["edges"]}
    assert edges == {
        (e.source.name, e.target.name): pytest.approx(e.weight, abs=1e-12) for e in graph.edges
    }
    assert f"I1_{len(graph.tokens) - 1}" in {n["name"] for n in written["nodes"]}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["patch", CLEAN, CORRUPTED, *TOY], "Nothing to write: give --out"),
        (["patch", CLEAN, CORRUPTED, *TOY, "--positions", "p.csv"], "give --layer."),
        (["patch", CLEAN, CORRUPTED, *TOY, "--out", "h.csv", "--what", "x"], "invalid choice"),
        (
            ["patch", CLEAN, "ba ke", *TOY, "--answer", "fu", "--wrong", "lo", "--out", "h.csv"],
            "the same number of tokens",
        ),
        (["patch", CLEAN, CORRUPTED, *TOY, "--answer", "fu", "--out", "/no/d/h.csv"], "/no/d"),
        (["patch", CLEAN, CORRUPTED, *TOY, "--out", "h.csv"], "give both answer= and wrong="),
        (["flow", FLOW_TEXT, *TOY, "--out", "d.csv"], "give --answer and --wrong."),
        (["flow", FLOW_TEXT, *TOY], "Nothing to write"),
        (["flow", FLOW_TEXT, *TOY, "--routes", "r.json", "--threshold", "2"], "below 1, got 2"),
        (
            ["flow", FLOW_TEXT, *TOY, "--answer", "di", "--wrong", "zzzzqq", "--out", "d.csv"],
            "zzzzqq",
        ),
        (["roles", *TOY, "--out", "r.csv", "--sinks", "s.csv"], "--sinks needs texts"),
        (["roles", TEXT, *TOY, "--out", "r.csv", "--kind", "W"], "invalid choice: 'W'"),
        (["roles", TEXT, *TOY, "--out", "r.csv", "--sink-threshold", "x"], "invalid float"),
        (
            ["roles", TEXT, *TOY, "--out", "r.csv", "--sinks", "s.csv", "--sink-threshold", "1"],
            "below 1, got 1.0",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    exits_2_with_one_line(argv, message, capsys)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def exits_2_with_one_line(argv: list[str], message: str, capsys) -> None:
    """``python -m mhsa ARGV`` ends with exit code 2 and one line on stderr naming ``message``."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("python -m mhsa")


@pytest.mark.parametrize(
    ("command", "example"),
    [
        ("attend", 'python -m mhsa attend "The cat sat on the mat."'),
        ("info", "python -m mhsa info --model default"),
        ("stats", "python -m mhsa stats data/sentences.txt --out stats.csv"),
        ("importance", "python -m mhsa importance data/sentences.txt --method ablation"),
        ("train", "python -m mhsa train induction --out data/toy/induction --seed 0"),
        ("roles", 'python -m mhsa roles "ba ke mo di ba ke mo di" --model toy:induction'),
        ("patch", "--model toy:induction --answer fu --wrong lo --out heads.csv"),
        ("flow", "--answer di --wrong lu --out dla.csv --routes routes.json"),
        ("store", "python -m mhsa store remove trained:0123456789ab"),
        ("weights", "python -m mhsa weights --copying --model toy:induction"),
        ("qk", "--head L1H3 --query 15 --model toy:induction --top 5"),
        ("atlas", "python -m mhsa atlas similar atlases/minilm 12 3 --head L3H4"),
    ],
)
def test_every_commands_help_shows_an_example(command: str, example: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m mhsa {command}")
    assert "example" in out.split("options:")[-1] and example in " ".join(out.split())


@pytest.mark.slow
def test_the_examples_run(tmp_path, monkeypatch, capsys) -> None:
    """The patch and flow examples of ``--help``, as printed, run and write their files."""
    import shlex

    from mhsa.cli import flow, patch

    monkeypatch.chdir(tmp_path)
    for command in (patch, flow):
        argv = shlex.split(command.EXAMPLES[0])[3:]  # after "python -m mhsa"
        assert main([*argv, "--device", "cpu"]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {
        "heads.csv",
        "attribution.csv",
        "positions.csv",
        "dla.csv",
        "routes.json",
    }

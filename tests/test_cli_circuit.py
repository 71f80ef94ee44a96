"""``python -m mhsa circuit``: the edges CSV equals the library's scores, the top circuit's
faithfulness and MIB's curve are written, and bad input ends in one line."""

from __future__ import annotations

import pandas as pd
import pytest

import mhsa
from mhsa.cli import main

CLEAN = "ba ke mo di fu lo ni pa su te ba ke mo di fu"
CORRUPTED = "ba ke mo di ra lo ni pa su te ba ke mo di fu"
KW = {"model": "toy:induction", "answer": "lo", "wrong": "ba"}
ARGS = ["circuit", CLEAN, CORRUPTED, "--model", "toy:induction", "--answer", "lo", "--wrong", "ba"]


def test_circuit_writes_the_libraries_edges_and_the_top_circuits_faithfulness(tmp_path, capsys):
    out, curve = tmp_path / "edges.csv", tmp_path / "curve.csv"
    argv = [*ARGS, "--method", "eap", "--out", str(out), "--top", "12", "--curve", str(curve)]
    assert main([*argv, "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(out, keep_default_na=False)
    scores = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, method="eap", **KW)
    expected = mhsa.circuits.top_edges(scores, len(scores))
    assert list(table.columns) == ["source", "target", "input", "score"]
    assert list(table["source"]) == list(expected["source"])
    assert list(table["input"]) == list(expected["input"])
    assert table["score"].to_numpy() == pytest.approx(expected["score"].to_numpy(), abs=1e-6)
    f = mhsa.circuits.circuit_faithfulness(
        CLEAN, CORRUPTED, mhsa.circuits.top_edges(scores, 12), **KW
    )
    assert f"faithfulness of the top 12 edges: {f:.4f}" in printed
    points = pd.read_csv(curve)
    assert list(points["edges"]) == [0, 0, 0, 1, 2, 5, 11, 22, 55, 110]
    assert f"wrote {out} (110 edges by eap" in printed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--top", "0"], "--top must be at least 1"),
        (["--method", "acdc"], "invalid choice: 'acdc'"),
    ],
)
def test_bad_circuit_arguments_exit_2_with_one_line(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as e:
        main([*ARGS, "--out", str(tmp_path / "e.csv"), *extra])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_texts_of_different_lengths_exit_2_naming_both(tmp_path, capsys):
    argv = ["circuit", CLEAN, CORRUPTED + " lo", "--model", "toy:induction"]
    with pytest.raises(SystemExit):
        main([*argv, "--answer", "lo", "--wrong", "ba", "--out", str(tmp_path / "e.csv")])
    err = capsys.readouterr().err
    assert "16 tokens" in err and "17" in err


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random BERT (2 layers of 4 heads) saved as a folder the command line loads."""
    import torch

    from tests.tiny import save_tiny, tiny_bert

    torch.manual_seed(0)
    return save_tiny(tmp_path_factory.mktemp("bert"), tiny_bert())


def test_circuit_on_an_encoder_takes_the_target_and_the_text_pair(bert_folder, tmp_path, capsys):
    texts = ("the cat sat on the mat", "the dog sat on the rug")
    out = tmp_path / "edges.csv"
    argv = ["circuit", *texts, "--model", bert_folder, "--device", "cpu", "--method", "eap"]
    pair = "a bird flew over the house"
    assert main([*argv, "--target", "similarity", "--text-pair", pair, "--out", str(out)]) == 0
    table = pd.read_csv(out, keep_default_na=False)
    scores = mhsa.circuits.edge_attribution(
        *texts, model=bert_folder, method="eap", target="similarity", text_pair=pair
    )
    expected = mhsa.circuits.top_edges(scores, len(scores))
    assert list(table["source"]) == list(expected["source"])
    assert list(table["target"]) == list(expected["target"])
    assert table["score"].to_numpy() == pytest.approx(expected["score"].to_numpy(), abs=1e-7)
    assert "of the second sentence" in capsys.readouterr().out
    # the embedding target has no gradient at the clean run: eap is refused in one line
    with pytest.raises(SystemExit) as e:
        main([*argv, "--target", "embedding", "--out", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "eap-ig" in err and len(err.splitlines()) == 1

"""``python -m mhsa atlas``: build over a corpus file, then ``top``, ``search`` and ``similar`` as
CSV and JSON lines, each equal to what the library reads from the same atlas; an
encoder-decoder's part alone; bad input in one line with exit code 2."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd

import mhsa
from mhsa.__main__ import main
from mhsa.atlas.corpora import task_corpus
from tests.test_cli_analyses import exits_2_with_one_line


def _build(tmp_path, task: str, count: int, *options: str) -> tuple[Path, mhsa.atlas.Atlas]:
    """``python -m mhsa atlas build`` over ``count`` texts of ``toy:<task>``'s task."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(task_corpus(task, count=count, seed=2)) + "\n")
    out = tmp_path / "atlas"
    argv = ["atlas", "build", str(corpus), "--out", str(out), "--model", f"toy:{task}"]
    assert main([*argv, *options]) == 0
    return out, mhsa.atlas.open_atlas(out)


def test_build_then_read_a_toy_atlas_from_the_command_line(tmp_path, capsys) -> None:
    out, atlas = _build(tmp_path, "induction", 40, "--top-k", "6")
    assert atlas.manifest["plan"]["top_k"] == 6 and atlas.manifest["plan"]["texts"] == 40
    capsys.readouterr()
    assert main(["atlas", "top", str(out), "L1H0", "--by", "norm", "-k", "4"]) == 0
    top = pd.read_csv(io.StringIO(capsys.readouterr().out))
    want = atlas.top("L1H0", k=4, by="norm")
    assert list(top["text_id"]) == list(want["text_id"]) and list(top["key"]) == list(want["key"])
    assert main(["atlas", "search", str(out), "L1H0", "--query-token", "ba", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = atlas.search("L1H0", query_token="ba", k=20)
    assert [(r["text_id"], r["query"], r["key"]) for r in rows] == list(
        zip(want.text_id, want["query"], want["key"], strict=True)
    )
    assert rows and all(r["query_token"] == "ba" for r in rows)
    similar = tmp_path / "similar.csv"
    argv = ["atlas", "similar", str(out), "3", "5", "--head", "L1H0", "-k", "5"]
    assert main([*argv, "--out", str(similar)]) == 0
    got = pd.read_csv(similar)
    want = atlas.similar(3, 5, head="L1H0", k=5)
    assert list(zip(got.text_id, got.position, strict=True)) == list(
        zip(want.text_id, want.position, strict=True)
    )


def test_an_encoder_decoders_decoder_alone(tmp_path, capsys) -> None:
    out, atlas = _build(tmp_path, "reverse-seq2seq", 12, "--part", "decoder")
    assert not isinstance(atlas, mhsa.atlas.AtlasParts)
    assert atlas.labels[0] == "D0H0" and all(h.startswith("D") for h in atlas.labels)
    capsys.readouterr()
    assert main(["atlas", "top", str(out), "D1H1", "-k", "3"]) == 0
    assert len(pd.read_csv(io.StringIO(capsys.readouterr().out))) == 3


def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys) -> None:
    exits_2_with_one_line(
        ["atlas", "top", str(tmp_path), "L0H0"], "is not an atlas: it has no manifest", capsys
    )
    corpus = tmp_path / "c.txt"
    corpus.write_text("ba be bi\n")
    exits_2_with_one_line(
        ["atlas", "build", str(corpus), "--out", str(tmp_path / "x"), "--part", "encoder"],
        "part applies to encoder-decoder models only",
        capsys,
    )

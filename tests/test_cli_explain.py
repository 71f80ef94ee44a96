"""``python -m mhsa explain``: a toy atlas's heads explained and one typed program scored, each
equal to what the library gives on the same atlas; bad input in one line with exit code 2 and
nothing written."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd
import pytest

import mhsa
from mhsa.__main__ import main
from mhsa.atlas.corpora import task_corpus
from tests.test_cli_analyses import exits_2_with_one_line


@pytest.fixture(scope="module")
def toy_atlas(tmp_path_factory) -> Path:
    """An atlas of toy:induction over 24 of its task's sequences."""
    out = tmp_path_factory.mktemp("explain") / "atlas"
    mhsa.atlas.build_atlas(
        task_corpus("induction", count=24, seed=4), out, model="toy:induction", progress=False
    )
    return out


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


def test_a_typed_program_is_scored_as_the_library_scores_it(toy_atlas, tmp_path, capsys) -> None:
    from mhsa.explain import score_program

    out = tmp_path / "one.csv"
    argv = ["explain", str(toy_atlas), "--head", "L0H3", "--program", "offset(-1)"]
    assert main([*argv, "--out", str(out)]) == 0
    got = pd.read_csv(out)
    assert list(got["head"]) == ["L0H3"] and list(got["program"]) == ["offset(-1)"]
    want = score_program(mhsa.atlas.open_atlas(toy_atlas), "L0H3", "offset(-1)")
    for column in ("iou", "accuracy", "baseline_accuracy", "auc"):
        assert got[column][0] == pytest.approx(want[column], abs=1e-9), column
    # toy:induction's previous-token head: its strongest key is the previous token (its IoU
    # with offset(-1) is about 0.4: it keeps a quarter of its weight on itself)
    assert got["accuracy"][0] > 0.9
    assert math.isfinite(got["faithfulness"][0])  # asked by default on the command line
    assert "L0H3:" in capsys.readouterr().err


def test_some_heads_are_explained_and_not_saved(toy_atlas, capsys) -> None:
    before = _files(toy_atlas)
    argv = ["explain", str(toy_atlas), "--heads", "L0H3,L1H0", "--no-faithfulness"]
    assert main(argv) == 0
    table = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(table["head"]) == ["L0H3", "L1H0"]
    assert {"program", "description", "iou", "accuracy", "baseline", "auc"} <= set(table.columns)
    assert table["faithfulness"].isna().all()
    assert _files(toy_atlas) == before  # a part of the heads is not saved over the whole


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--head", "L0H3", "--program", "offset(-1"], "offset(-1"),
        (["--head", "L0H3", "--program", "pos(NOPE, left, nearest)"], "NOPE"),
        (["--head", "L9H9", "--program", "offset(-1)"], "L9H9"),
        (["--program", "offset(-1)"], "--program needs --head"),
        (["--head", "L0H3"], "--head goes with --program"),
        (["--heads", "L0H3,nope"], "nope"),
        (["--heads", "L0H3", "--head", "L0H3", "--program", "first"], "not both"),
        (["--held-out", "1.5"], "--held-out"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    toy_atlas, tmp_path, capsys, options: list[str], message: str
) -> None:
    before = _files(toy_atlas)
    out = tmp_path / "table.csv"
    exits_2_with_one_line(["explain", str(toy_atlas), *options, "--out", str(out)], message, capsys)
    assert not out.exists() and _files(toy_atlas) == before


def test_an_atlas_that_is_not_there_lists_those_that_are(tmp_path, capsys) -> None:
    exits_2_with_one_line(["explain", str(tmp_path / "none")], "No atlas", capsys)


def test_the_help_ends_with_the_examples(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: python -m mhsa explain")
    assert 'explain default --head L3H4 --program "when(NOUN, pos(DET, left, nearest))"' in out


def test_an_atlas_is_named_by_folder_name_or_model(app_atlas, capsys) -> None:
    """The app's atlas (conftest's, in MHSA_ATLAS_DIR) by its folder's name and by its model."""
    from mhsa.cli.explain import open_atlas_named

    by_name, by_model = open_atlas_named("minilm-brown"), open_atlas_named("default")
    assert Path(by_name.folder) == Path(by_model.folder) == Path(app_atlas)
    argv = ["explain", "default", "--head", "L0H2", "--program", "offset(-1)", "--no-faithfulness"]
    assert main(argv) == 0
    row = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(row["program"]) == ["offset(-1)"] and math.isnan(row["faithfulness"][0])


def test_the_shipped_atlases_are_built_explained(tmp_path, monkeypatch, capsys) -> None:
    """``atlas build --default`` (what scripts/run-app.sh runs) leaves every head of the atlas
    explained, so the Head atlas page opens with them; ``--no-explain`` leaves none."""
    monkeypatch.setenv("MHSA_ATLAS_DIR", str(tmp_path / "plain"))
    argv = ["atlas", "build", "--default", "--only", "toy:induction", "--sentences", "40"]
    assert main([*argv, "--no-explain"]) == 0
    assert mhsa.explain.saved(mhsa.atlas.open_atlas(tmp_path / "plain" / "toy-induction")) is None
    monkeypatch.setenv("MHSA_ATLAS_DIR", str(tmp_path / "explained"))
    assert main(argv) == 0
    atlas = mhsa.atlas.open_atlas(tmp_path / "explained" / "toy-induction")
    found = mhsa.explain.saved(atlas)
    assert found is not None and list(found.table["head"]) == atlas.labels
    assert "offset(-1)" in found.table.set_index("head").loc["L0H3", "program"]
    assert "every head explained" in capsys.readouterr().err
    assert main(argv) == 0  # built and explained: both reused
    assert "every head explained" not in capsys.readouterr().err

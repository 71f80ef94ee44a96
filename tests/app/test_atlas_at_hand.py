"""The Head atlas page's own atlases at hand: the sidebar's model shows its atlas or a way to
build it, never another model's atlas alone."""

from __future__ import annotations

import mhsa
from mhsa.atlas.corpora import task_corpus
from tests.app.test_pages import run
from ui.views import atlas as views

PAGE = "pages/14_Head_atlas.py"


def test_another_models_atlas_does_not_hide_the_build_of_this_ones(tmp_path, monkeypatch) -> None:
    """With only toy:induction's atlas on the server, the default model's page offers the
    default model's build (the button), and still lets the toy's atlas be read, said to be
    another model's."""
    monkeypatch.setenv("MHSA_ATLAS_DIR", str(tmp_path))
    mhsa.atlas.build_atlas(
        task_corpus("induction", count=8),
        tmp_path / "toy-induction",
        model="toy:induction",
        progress=False,
    )
    views._listing.clear()
    try:
        at = run(PAGE, model="default")
        assert not at.exception, at.exception
        assert any("holds no atlas of 'default'" in str(i.value) for i in at.info)
        assert at.button(key="atlas-build").label == "Build an atlas of this model"
        captions = " ".join(str(c.value) for c in at.caption).replace("\\", "")
        assert "This atlas is of 'toy:induction'" in captions
        toy = run(PAGE, model="toy:induction")  # the toy's own page: its atlas, no offer
        assert not toy.exception
        assert not any("holds no atlas" in str(i.value) for i in toy.info)
        assert toy.selectbox(key="atlas").value == "toy-induction"
    finally:
        views._listing.clear()


def test_with_no_brown_copy_the_page_says_how_and_builds_on_the_projects_sentences(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("MHSA_ATLAS_DIR", str(tmp_path / "atlases"))
    monkeypatch.setenv("MHSA_CORPUS_CACHE", str(tmp_path / "cache"))  # no cached copy
    monkeypatch.delenv("MHSA_BROWN_TGZ", raising=False)
    views._listing.clear()
    try:
        at = run(PAGE, model="default")
        assert not at.exception, at.exception
        shown = " ".join(str(w.value) for w in at.warning).replace("\\", "")
        assert "set MHSA_BROWN_TGZ" in shown and "project's own 328 sentences" in shown
        at.button(key="atlas-build-sentences").click().run(timeout=600)
        assert not at.exception, at.exception
        built = mhsa.atlas.open_atlas(tmp_path / "atlases" / "sentences-default")
        assert built.manifest["plan"]["texts"] == 328 and built.model == "default"
        assert at.selectbox(key="atlas").value == "sentences-default"
        assert len(at.get("plotly_chart")) == 4
    finally:
        views._listing.clear()


def test_a_background_build_shows_its_progress_or_why_it_failed(tmp_path, monkeypatch) -> None:
    """The state a background build keeps in its folder (``mhsa.atlas.shipped.BUILDING``),
    written here by hand: running (this process stands for the builder), then failed."""
    import json
    import os

    from mhsa.atlas.shipped import BUILDING

    folder = tmp_path / "minilm-brown"
    folder.mkdir()
    monkeypatch.setenv("MHSA_ATLAS_DIR", str(tmp_path))
    state = {"state": "running", "pid": os.getpid(), "texts": 1200, "total": 4000}
    (folder / BUILDING).write_text(json.dumps({**state, "started": 0, "message": ""}))
    views._listing.clear()
    try:
        at = run(PAGE, model="default")
        assert not at.exception, at.exception
        shown = " ".join(str(i.value) for i in at.info)
        assert "in the background: 1,200 of 4000 texts done" in shown
        assert not at.button  # a build already running is not offered again
        failed = {**state, "state": "failed", "message": "Cannot fetch the Brown Corpus"}
        (folder / BUILDING).write_text(json.dumps({**failed, "started": 0}))
        at = run(PAGE, model="default")
        warned = " ".join(str(w.value) for w in at.warning).replace("\\", "")
        assert "The background build failed: Cannot fetch the Brown Corpus" in warned
        assert at.button(key="atlas-build").label == "Build an atlas of this model"
    finally:
        views._listing.clear()

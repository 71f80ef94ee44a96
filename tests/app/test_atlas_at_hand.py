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

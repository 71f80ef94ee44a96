"""The Head atlas page's parts of speech (exBERT's linguistic view) under AppTest: on a tagged
atlas the histograms of the top pairs' and of a search's tags are the library's counts, drawn
and tabled, and the tag boxes search by tag (a link carries them); on an untagged atlas, a
notice instead, and a link's tags are dropped with a notice."""

from __future__ import annotations

import json

import mhsa
from tests.app.test_importance_page import decode
from tests.app.test_pages import run
from tests.test_atlas_tags import CORPUS
from ui.views import atlas as views

PAGE = "pages/14_Head_atlas.py"


def _bars(at) -> list[dict]:
    """The tag histograms drawn: per chart, its title and each trace's bars by tag."""
    out = []
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        names = [t.get("name") for t in spec["data"]]
        if names == ["query", "key"]:
            out.append(
                {
                    "title": spec["layout"]["title"]["text"],
                    **{
                        t["name"]: dict(zip(t["x"], decode(t["y"]).tolist(), strict=True))
                        for t in spec["data"]
                    },
                }
            )
    return out


def _want(counts) -> dict[str, dict[str, float]]:
    return {c: {str(t): float(v) for t, v in counts[c].items()} for c in ("query", "key")}


def test_a_tagged_atlas_shows_the_tags_of_its_top_pairs_and_searches_by_tag(
    tmp_path, monkeypatch, tiny_bert
) -> None:
    monkeypatch.setenv("MHSA_ATLAS_DIR", str(tmp_path))
    atlas = mhsa.atlas.build_atlas(
        CORPUS, tmp_path / "tagged", model=tiny_bert, top_k=8, progress=False, sample_size=30
    )
    views._listing.clear()
    try:
        at = run(PAGE, model=tiny_bert, atlas="tagged", atlas_head="L1H2", atlas_qtag="NOUN")
        assert not at.exception, at.exception
        assert at.selectbox(key="atlas_qtag").value == "NOUN"
        assert at.selectbox(key="atlas_ktag").value == ""
        top = atlas.top("L1H2", k=20, by="norm")
        found = atlas.search("L1H2", query_tag="NOUN", k=50)
        assert len(found) >= 3
        drawn = _bars(at)
        assert len(drawn) == 2  # the top pairs' and the matches'
        assert {k: drawn[0][k] for k in ("query", "key")} == _want(atlas.tag_histogram(top))
        assert {k: drawn[1][k] for k in ("query", "key")} == _want(atlas.tag_histogram(found))
        assert drawn[1]["query"]["NOUN"] == len(found) and sum(drawn[1]["query"].values()) == len(
            found
        )
        tables = [d.value for d in at.dataframe]
        shown = next(t for t in tables if "key_token" in t.columns and "norm" not in t.columns)
        assert list(zip(shown["text_id"], shown["query"], shown["key"], strict=True)) == list(
            zip(found["text_id"], found["query"], found["key"], strict=True)
        )
        counts = [t for t in tables if "meaning" in t.columns]
        assert len(counts) == 2
        assert list(counts[1]["queries"]) == list(atlas.tag_histogram(found)["query"])
        assert counts[1].set_index("tag").loc["NOUN", "meaning"] == "noun (common and proper)"
        # a key tag chosen in its box narrows the search: the matches' commonest key tag
        keys = atlas.tag_histogram(found)["key"].drop("none")
        tag = str(keys.idxmax())
        at.selectbox(key="atlas_ktag").set_value(tag).run()
        assert not at.exception, at.exception
        both = atlas.search("L1H2", query_tag="NOUN", key_tag=tag, k=50)
        assert len(both) == keys.max() >= 1
        drawn = _bars(at)
        assert drawn[1]["key"][tag] == len(both) == sum(drawn[1]["key"].values())
    finally:
        views._listing.clear()


def test_an_untagged_atlas_says_it_has_no_tags(app_atlas) -> None:
    at = run(PAGE, atlas_head="L0H0", atlas_ktag="DET")
    assert not at.exception, at.exception
    infos = " ".join(str(i.value) for i in at.info)
    assert "no part-of-speech tags: its corpus had none" in infos
    warnings = " ".join(str(w.value) for w in at.warning).replace("\\", "")
    assert "the link's tags are not searched" in warnings
    assert not _bars(at)
    keys = [s.key for s in at.selectbox]
    assert "atlas_qtag" not in keys and "atlas_ktag" not in keys

"""The Head atlas page (``pages/14_Head_atlas.py``) under AppTest, on the session's atlas
(``tests/conftest.py``'s ``app_atlas``: MiniLM over 24 sentences): what it shows equals what
the library reads, links carry the head and the search, bad links fall back with a notice, and
a server without atlases offers a build that runs through the heavy queue."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mhsa
from tests.app.test_importance_page import decode
from tests.app.test_pages import run
from ui.views import atlas as views

PAGE = "pages/14_Head_atlas.py"
ROOT = Path(__file__).resolve().parents[2]


def _tables(at) -> list[pd.DataFrame]:
    return [d.value for d in at.dataframe]


def test_the_page_shows_the_libraries_top_pairs_and_the_example_around_them(app_atlas) -> None:
    atlas = mhsa.atlas.open_atlas(app_atlas)
    at = run(PAGE, atlas_head="L2H5")
    assert not at.exception, at.exception
    assert at.selectbox(key="atlas").value == "minilm-brown"
    assert at.selectbox(key="atlas_head").value == "L2H5"
    top = _tables(at)[0]
    want = atlas.top("L2H5", k=20, by="norm")
    assert list(top["text"]) == list(want["text"])
    np.testing.assert_allclose(top["norm"], want["norm"])
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(specs) == 4
    # the example's neighbourhood as drawn: the head's own attention on that text, from the
    # model's eager attention (the atlas ran our module)
    row = want.iloc[0]
    result = mhsa.attend(atlas.text(int(row.text_id)), model="default", engine="transformers")
    q, k = int(row["query"]), int(row["key"])
    rows = list(range(max(0, q - 5), min(len(result.tokens), q + 6)))
    cols = list(range(max(0, k - 5), min(len(result.tokens), k + 6)))
    drawn = decode(specs[0]["data"][0]["z"]).reshape(len(rows), len(cols))
    np.testing.assert_allclose(drawn, result.attention[2, 5][np.ix_(rows, cols)], atol=1e-5)
    # the corpus-wide scores table: this head's numbers are the library's
    scores = next(t for t in _tables(at) if "this head" in t.columns)
    assert scores["this head"].iloc[-1] == pytest.approx(
        atlas.heads().loc["L2H5", "induction score"]
    )
    # each score says what it is a mean over: the 24 texts' tokens, or the texts
    lines = (Path(__file__).parents[2] / "data" / "sentences.txt").read_text().splitlines()
    queries = sum(len(mhsa.attend(t).tokens) for t in lines[:24])
    over = dict(zip(scores["score"], scores["over"], strict=True))
    assert over["On the previous token"] == f"{queries:,} queries"
    assert over["Induction score"] == "24 texts"


def test_a_link_carries_the_search_and_the_ranking(app_atlas) -> None:
    atlas = mhsa.atlas.open_atlas(app_atlas)
    at = run(PAGE, atlas_head="L4H2", atlas_by="weight", atlas_query="the")
    assert not at.exception
    tables = _tables(at)
    assert list(tables[0]["weight"]) == list(atlas.top("L4H2", 20, by="weight")["weight"])
    found = tables[-1]
    want = atlas.search("L4H2", query_token="the", k=50)
    assert list(zip(found.text_id, found["query"], strict=True)) == list(
        zip(want.text_id, want["query"], strict=True)
    )


def test_bad_links_fall_back_with_a_notice() -> None:
    at = run(PAGE, atlas="no-such-atlas", atlas_head="L99H0", atlas_offset="x*")
    assert not at.exception
    shown = " ".join(str(m.value) for m in [*at.warning, *at.info, *at.caption]).replace("\\", "")
    assert "no atlas called 'no-such-atlas'" in shown
    assert "no head L99H0" in shown
    assert at.selectbox(key="atlas_head").value == "L0H0"
    assert "The offset must be a whole number" in shown


def test_without_atlases_the_page_offers_a_build_through_the_heavy_queue(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("MHSA_ATLAS_DIR", str(tmp_path / "none"))
    views._listing.clear()
    try:
        at = run(PAGE, model="toy:induction")
        assert not at.exception
        assert any("holds no atlas of 'toy:induction'" in str(i.value) for i in at.info)
        assert not at.get("plotly_chart")
        at.button(key="atlas-build").click().run(timeout=300)
        assert not at.exception, at.exception
        built = mhsa.atlas.open_atlas(tmp_path / "none" / "toy-induction")
        assert built.model == "toy:induction" and built.manifest["plan"]["texts"] == 2000
        assert at.selectbox(key="atlas").value == "toy-induction"
        assert len(at.get("plotly_chart")) == 4
    finally:
        views._listing.clear()


def test_an_example_opens_in_heads_and_heads_opens_its_head_in_the_atlas(app_atlas) -> None:
    """The buttons leave what the next page applies (``page.open_text_head``,
    ``page.open_in_atlas``; a page run alone has no navigation to switch with: the switch
    itself is the browser tests'), and the page opened applies it."""
    atlas = mhsa.atlas.open_atlas(app_atlas)
    at = run(PAGE, atlas_head="L3H7")
    first = atlas.top("L3H7", k=20, by="norm").iloc[0]
    at.button(key="atlas-open").click().run()
    opening = at.session_state["_mhsa_opening"]
    assert opening == {"text": atlas.text(int(first.text_id)), "layer": 3, "head": 7}
    heads = run("pages/1_Heads.py")
    heads.session_state["_mhsa_opening"] = opening
    heads.run()
    assert not heads.exception
    assert heads.session_state["text"] == atlas.text(int(first.text_id))
    assert (heads.session_state["layer"], heads.session_state["head"]) == (3, 7)
    heads.button(key="to-atlas").click().run()
    assert heads.session_state["_mhsa_opening"] == {"atlas_head": "L3H7"}


def test_an_encoder_decoder_atlas_shows_its_decoder_heads_on_their_own_tokens(
    tmp_path, monkeypatch, tiny_bart_path
) -> None:
    """A BART atlas (encoder and decoder parts): a decoder head's table is the library's, its
    example's neighbourhood is the model's decoder self-attention on that text, the token
    picker lists the decoder's tokens, and "Open this text in Heads" sets the decoder."""
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", tiny_bart_path)
    monkeypatch.setenv("MHSA_ATLAS_DIR", str(tmp_path))
    lines = (ROOT / "data" / "sentences.txt").read_text().splitlines()[:6]
    atlas = mhsa.atlas.build_atlas(lines, tmp_path / "bart", model=tiny_bart_path, progress=False)
    views._listing.clear()
    try:
        at = run(PAGE, model=tiny_bart_path, atlas="bart", atlas_head="D1H2", kind="decoder")
        assert not at.exception, at.exception
        captions = " ".join(str(c.value) for c in at.caption)
        assert "shows the encoder's attention" not in captions  # its heads say which they are
        assert at.selectbox(key="atlas_head").value == "D1H2"
        assert "E0H0" in at.selectbox(key="atlas_head").options
        top = _tables(at)[0]
        want = atlas.top("D1H2", k=20, by="norm")
        assert list(top["text"]) == list(want["text"])
        row = want.iloc[0]
        result = mhsa.attend(atlas.text(int(row.text_id)), model=tiny_bart_path)
        q, k = int(row["query"]), int(row["key"])
        n = len(result.decoder_tokens)
        rows = list(range(max(0, q - 5), min(n, q + 6)))
        cols = list(range(max(0, k - 5), min(n, k + 6)))
        spec = json.loads(at.get("plotly_chart")[0].proto.spec)
        drawn = decode(spec["data"][0]["z"]).reshape(len(rows), len(cols))
        np.testing.assert_allclose(
            drawn, result.decoder_attention[1, 2][np.ix_(rows, cols)], atol=1e-5
        )
        picker = at.selectbox(key="atlas_position")
        assert len(picker.options) == n + 1  # the example's query, then each decoder token
        at.button(key="atlas-open").click().run()
        opening = at.session_state["_mhsa_opening"]
        assert opening == {
            "text": atlas.text(int(row.text_id)),
            "layer": 1,
            "head": 2,
            "kind": "decoder",
            "target_text": "",  # the decoder reads the text itself, as the atlas's did
            "generate": 0,
        }
        heads = run("pages/1_Heads.py", model=tiny_bart_path)
        heads.session_state["_mhsa_opening"] = opening
        heads.run()
        assert not heads.exception, heads.exception
        drawn = json.loads(heads.get("plotly_chart")[1].proto.spec)  # the chosen head
        assert drawn["layout"]["xaxis"]["ticktext"] == atlas.text_tokens(int(row.text_id), "D1H2")
        heads.button(key="to-atlas").click().run()  # back: the head as the atlas names it
        assert heads.session_state["_mhsa_opening"] == {"atlas_head": "D1H2"}
    finally:
        views._listing.clear()


def test_head_links_take_every_kind_of_label_and_refuse_others() -> None:
    from ui.state import head_label_param

    assert head_label_param(" D01H002 ") == "D1H2"
    assert head_label_param("E0H3") == "E0H3" and head_label_param("L11H0") == "L11H0"
    for bad in ("X0H1", "L0", "L0H1H2", "<b>L0H1</b>", "L99999H0"):
        with pytest.raises(ValueError, match="L<layer>H<head>"):
            head_label_param(bad)


def test_a_running_build_says_how_long_it_has_left_at_its_pace() -> None:
    from mhsa.corpus.jobs import Job
    from ui.heavy import time_left

    job = Job("k", lambda progress: None, "Building")
    assert time_left(job, 100.0) is None  # not started
    job.started, job.total_steps = 100.0, 2000
    assert time_left(job, 110.0) is None  # no text done yet: no pace to go by
    job.done_steps = 500
    assert time_left(job, 110.0) == "30 s"  # 10 s for 500 texts: 1,500 left take 30 s
    assert time_left(job, 160.0) == "3 min"  # 60 s for 500: 180 s left
    job.done_steps = 2000
    assert time_left(job, 160.0) is None  # done

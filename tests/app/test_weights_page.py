"""Issue 49 in the app through AppTest: "Why here?" under a head's heatmap (Heads) against
``mhsa.analysis.qk_attribution.qk_attribution``, and the weights section of Head roles against the
library."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import mhsa
from tests.app.test_importance_page import charts, decode
from tests.hostile import rendered

ROOT = Path(__file__).resolve().parents[2]
TEXT = "ro te mi bu gu ka be pa ku pi ro te mi bu gu ka"


def run(page: str, state: dict | None = None, **query: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / page), default_timeout=180)
    for key, value in query.items():
        at.query_params[key] = value
    for key, value in (state or {}).items():
        at.session_state[key] = value
    return at.run()


@pytest.mark.slow
def test_why_here_shows_the_cells_largest_terms() -> None:
    """The induction head's cell at the token after the earlier "ka": the largest terms are the
    library's, and the sentence names K-composition with the previous-token head."""
    state = {"why-shown": True, "why-query": 15, "why-key": 6}
    at = run("pages/1_Heads.py", state, model="toy:induction", text=TEXT, layer="1", head="3")
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    terms = mhsa.analysis.qk_attribution.qk_attribution(
        TEXT, "L1H3", model="toy:induction", query=15
    )
    at_key = terms[terms["key"] == 6]
    best = at_key.loc[at_key["score"].abs().idxmax()]
    spec = next(s for t, s in charts(at).items() if t.startswith("L1H3: the largest terms"))
    clicked = spec["data"][0]
    assert "(clicked)" in clicked["name"]
    bars = decode(clicked["x"])
    assert bars[0] == pytest.approx(best["score"], rel=1e-6)
    assert clicked["y"][0] == f"{best['query_source']} · {best['key_source']}"
    assert len(spec["data"]) == 3  # the clicked key and the row's two other strongest
    sentence = next(m.value for m in at.markdown if "score" in m.value and "L1H3" in m.value)
    total = float(at_key["score"].sum())
    assert f"score {total:.3f}" in rendered(sentence)[0]
    assert f"K-composition with {best['key_source']}" in rendered(sentence)[0]
    table = at.dataframe[0].value
    assert list(table.columns) == ["query_source", "key_source", "score", "share"]
    assert table["score"].iloc[0] == pytest.approx(best["score"], rel=1e-6)


def _check_clicked_split(at, terms, head: str, key: int) -> None:
    """The page's "Why here?" figure of ``head`` shows the clicked key's largest term as the
    library's ``terms`` have it, and its sentence the key's whole score."""
    at_key = terms[terms["key"] == key]
    best = at_key.loc[at_key["score"].abs().idxmax()]
    spec = next(s for t, s in charts(at).items() if t.startswith(f"{head}: the largest terms"))
    clicked = spec["data"][0]
    assert "(clicked)" in clicked["name"] and clicked["name"].startswith(f"{key}:")
    assert decode(clicked["x"])[0] == pytest.approx(best["score"], rel=1e-6)
    assert clicked["y"][0] == f"{best['query_source']} · {best['key_source']}"
    sentence = next(m.value for m in at.markdown if "score" in m.value and head in m.value)
    assert f"score {float(at_key['score'].sum()):.3f}" in rendered(sentence)[0]


def test_why_here_on_the_default_model_splits_the_score() -> None:
    """MiniLM, a post-norm encoder: the cell (3, 8) (a key after the query: an encoder reads
    every key) split as the library splits it, the page's own figures beside it."""
    text = "The cat sat on the mat because it was warm."
    state = {"why-shown": True, "why-query": 3, "why-key": 8}
    at = run("pages/1_Heads.py", state, text=text, layer="5", head="7")
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    terms = mhsa.analysis.qk_attribution.qk_attribution(text, "L5H7", query=3)
    assert terms.attrs["causal"] is False
    _check_clicked_split(at, terms, "L5H7", 8)
    assert at.number_input(key="why-key").max == len(terms.attrs["tokens"]) - 1
    assert len(charts(at)) == 4  # the page's own three go on


def test_why_here_on_an_encoder_decoders_decoder_head() -> None:
    """The shipped BART ``toy:reverse-seq2seq``, its decoder self-attention (teacher-forced
    on the target): the cell split as the library splits head D1H2 (whose parts include the
    cross-attention heads C0Hx); its cross-attention says why it is not split."""
    text, target = "da de di do du", "du do di de da"
    state = {"why-shown": True, "why-query": 3, "why-key": 1}
    link = {"model": "toy:reverse-seq2seq", "text": text, "target_text": target}
    at = run("pages/1_Heads.py", state, **link, kind="decoder", layer="1", head="2")
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    terms = mhsa.analysis.qk_attribution.qk_attribution(
        text, "D1H2", model="toy:reverse-seq2seq", text_pair=target, query=3
    )
    assert terms.attrs["causal"] is True
    _check_clicked_split(at, terms, "D1H2", 1)
    assert at.number_input(key="why-key").max == 3  # a decoder's query reads keys up to it
    cross = run("pages/1_Heads.py", state, **link, kind="cross", layer="1", head="2")
    assert not cross.exception
    assert any("C1H2 is a cross-attention head" in rendered(e.value)[0] for e in cross.error)


@pytest.mark.slow
def test_head_roles_weights_section_is_the_librarys() -> None:
    state = {"weights-head": "L1H3", "why-shown": True, "why-query": 15, "why-key": 6}
    at = run("pages/10_Head_roles.py", state, model="toy:induction", text=TEXT)
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    spec = next(s for t, s in charts(at).items() if t.startswith("Copying score"))
    grid = decode(spec["data"][0]["z"]).astype(float)
    want = mhsa.analysis.ov_copying_scores("toy:induction").to_numpy().reshape(2, 4)
    np.testing.assert_allclose(grid, want, atol=1e-6)
    assert (spec["data"][0]["zmin"], spec["data"][0]["zmax"]) == (-1.0, 1.0)  # centred at 0
    captions = [rendered(c.value)[0] for c in at.caption]
    assert any("rotary positions" in c for c in captions)  # no positional pattern: why
    top = next(d.value for d in at.dataframe if "outputs" in d.value.columns)
    head = at.selectbox(key="weights-head").value
    library = mhsa.analysis.ov_top_tokens(head, "toy:induction", k=5)
    first = library[library["input"] == top["input"].iloc[0]]["output"]
    assert top["outputs"].iloc[0] == " ".join(first)
    why = next(s for t, s in charts(at).items() if t.startswith("L1H3: the largest terms"))
    terms = mhsa.analysis.qk_attribution.qk_attribution(
        TEXT, "L1H3", model="toy:induction", query=15
    )
    at_key = terms[terms["key"] == 6]
    assert abs(decode(why["data"][0]["x"])[0]) == pytest.approx(
        at_key["score"].abs().max(), rel=1e-6
    )
    at.button(key="weights-to-atlas").click().run()  # the picker's head opens in the atlas
    assert at.session_state["_mhsa_opening"] == {"atlas_head": "L1H3"}


@pytest.mark.slow
def test_head_roles_on_the_default_model_splits_and_draws_positions() -> None:
    """MiniLM (a post-norm encoder): "Why here?" split as the library splits it, and the
    positional pattern through the embedding LayerNorm drawn with its previous-token score."""
    text = "The cat sat on the mat because it was warm."
    state = {"weights-head": "L1H9", "why-shown": True, "why-query": 2, "why-key": 5}
    at = run("pages/10_Head_roles.py", state, text=text)
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    positions = mhsa.analysis.qk_positional_scores("default")
    title, spec = next(
        (t, s) for t, s in charts(at).items() if t.startswith("L1H9: attention from position")
    )
    assert "LN(W_pos)" in title
    grid = decode(spec["data"][0]["z"]).astype(float)
    np.testing.assert_allclose(grid, positions.pattern[1, 9], atol=1e-6)
    captions = [rendered(c.value)[0] for c in at.caption]
    score = positions.previous_token["L1H9"]
    assert any(f"previous-token score from positions alone: {score:.3f}" in c for c in captions)
    assert not any("Positional pattern:" in c for c in captions)  # not refused
    terms = mhsa.analysis.qk_attribution.qk_attribution(text, "L1H9", query=2)
    at_key = terms[terms["key"] == 5]
    why = next(s for t, s in charts(at).items() if t.startswith("L1H9: the largest terms"))
    assert abs(decode(why["data"][0]["x"])[0]) == pytest.approx(
        at_key["score"].abs().max(), rel=1e-6
    )


def test_a_click_on_a_heatmap_cell_opens_why_here_on_it(monkeypatch) -> None:
    """A click on the marker of cell (15, 6) (``plots.clickable_cells``, trace 1) opens the
    panel there; a click on the heatmap itself (trace 0) does nothing."""
    from types import SimpleNamespace

    from ui import head_weights

    def clicked(points: list[dict]) -> dict:
        state = {"chart": SimpleNamespace(selection={"points": points})}
        monkeypatch.setattr(head_weights.st, "session_state", state)
        head_weights.select_cell("chart")
        return state

    state = clicked([{"curve_number": 1, "customdata": [15, 6, 0.9], "x": "ka #6"}])
    assert (state["why-shown"], state["why-query"], state["why-key"]) == (True, 15, 6)
    assert "why-shown" not in clicked([{"curve_number": 0, "x": "ka #6", "y": "ka #15"}])


def test_clickable_cells_mark_every_cell_with_its_position_and_value() -> None:
    from mhsa import plots
    from tests.tiny import hand_result

    attention = np.random.default_rng(0).random((1, 1, 3, 3)).astype(np.float32)
    result = hand_result(attention, ["a", "b", "c"])
    fig = plots.clickable_cells(plots.head_heatmap(result, 0, 0))
    markers = fig.data[1]
    assert [tuple(d[:2]) for d in markers.customdata] == [
        (i, j) for i in range(3) for j in range(3)
    ]
    np.testing.assert_allclose([d[2] for d in markers.customdata], attention[0, 0].ravel())
    assert list(markers.x[:3]) == list(fig.data[0].x) and markers.y[3] == fig.data[0].y[1]
    assert len(plots.figure_data(fig)) == 9  # the export holds the cells once

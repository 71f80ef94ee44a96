"""Heads explained by programs in the app (``ui.explain_section``): the Head atlas page leads
with the head's saved explanation and draws its program's pattern beside the head's attention,
maps every head by the kind of its program, scores a typed or built hypothesis and says a
program that does not parse in one message; an atlas without explanations computes them
through the heavy queue; Heads and Head roles give the head's explanation in one line with a
link, only where the model's atlas has saved explanations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import mhsa
import mhsa.explain
from mhsa.explain.explanations import split_texts
from tests.app.test_importance_page import decode
from tests.app.test_pages import run
from ui.views import atlas as atlas_views
from ui.views import explain as explain_views

PAGE = "pages/14_Head_atlas.py"
TOY = {"model": "toy:induction", "atlas": "toy-induction"}


def _spec(at, key: str) -> dict:
    """The plotly spec of the chart drawn under ``key``."""
    charts = [c for c in at.get("plotly_chart") if c.proto.id.endswith(key) or key in c.proto.id]
    assert charts, [c.proto.id for c in at.get("plotly_chart")]
    return json.loads(charts[0].proto.spec)


def _shown(at) -> str:
    """Every markdown, caption, info and error of the run, its escapes removed."""
    parts = [*at.markdown, *at.caption, *at.info, *at.error, *at.warning]
    return " ".join(str(p.value) for p in parts).replace("\\", "")


def _metrics(at) -> list[tuple[str, str]]:
    return [(m.label, m.value) for m in at.metric]


def _table(folder: str):
    return mhsa.explain.saved(mhsa.atlas.open_atlas(Path(folder) / "toy-induction")).table


def test_the_page_leads_with_the_heads_saved_explanation(with_toy_atlas) -> None:
    at = run(PAGE, **TOY, atlas_head="L0H3")
    assert not at.exception, at.exception
    row = _table(with_toy_atlas).set_index("head").loc["L0H3"]
    shown = _shown(at)
    assert f"L0H3**: {row['description']}" in shown
    assert next(c.value for c in at.code) == row["program"]
    assert _metrics(at)[:3] == [
        ("IoU", f"{row['iou']:.2f}"),
        ("Accuracy", f"{row['accuracy']:.2f}"),
        ("AUC", f"{row['auc']:.2f}"),
    ]
    assert f"Baseline: {row['baseline']}" in shown
    assert f"accuracy {row['baseline_accuracy']:.2f}" in shown
    assert f"Scored on {int(row['texts']):,} held-out texts" in shown
    if math.isnan(row["faithfulness"]):  # no number: the reason instead
        assert _metrics(at)[3] == ("Faithfulness", "—")
        assert "Faithfulness: none: " in shown
    # the head's own attention on the first held-out text, from the model's eager attention
    # (not our module)
    atlas = mhsa.atlas.open_atlas(Path(with_toy_atlas) / "toy-induction")
    first = split_texts(atlas)[1][0]
    assert at.selectbox(key="explain_text").value == first
    result = mhsa.attend(atlas.text(first), model="toy:induction", engine="transformers")
    head = _spec(at, "explain-head")
    n = len(result.tokens)
    drawn = decode(head["data"][0]["z"]).reshape(n, n)
    np.testing.assert_allclose(drawn, result.attention[0, 3], atol=1e-5)
    assert head["data"][0]["x"] == [f"{t} #{i}" for i, t in enumerate(result.tokens)]
    # the program's pattern by hand: each query on the token before it (the mix the search
    # finds on 120 texts: w there, 1 - w on itself); the first query has no token before it
    program = decode(_spec(at, "explain-program")["data"][0]["z"]).reshape(n, n)
    found = mhsa.explain.parse_program(row["program"])
    if isinstance(found, mhsa.explain.Mix):
        assert (str(found.a), str(found.b)) == ("offset(-1)", "self")
        by_hand = found.w * np.eye(n, k=-1) + (1 - found.w) * np.eye(n)
    else:
        assert str(found) == "offset(-1)"
        by_hand = np.eye(n, k=-1)
    np.testing.assert_allclose(program[1:], by_hand[1:], atol=1e-6)


def _heaviest(program):
    """The part of a program with the most weight, walked by hand: a mix's heavier part, a
    fallback's first."""
    while isinstance(program, mhsa.explain.Mix | mhsa.explain.Fallback):
        if isinstance(program, mhsa.explain.Fallback):
            program = program.first
        else:
            program = program.a if program.w >= 0.5 else program.b
    return program


def test_the_map_colours_every_head_by_its_kind_and_writes_code_and_score(
    with_toy_atlas,
) -> None:
    from mhsa.plots import PROGRAM_KINDS

    at = run(PAGE, **TOY, atlas_head="L1H3")
    assert not at.exception
    table = _table(with_toy_atlas).set_index("head")
    spec = _spec(at, "explain-map")
    cells, text = spec["data"][0], spec["data"][1]
    z = decode(cells["z"]).reshape(2, 4) if isinstance(cells["z"], dict) else np.array(cells["z"])
    kinds = list(PROGRAM_KINDS)
    drawn, combined = set(), False
    for layer in range(2):
        for h in range(4):
            program = table.loc[f"L{layer}H{h}", "program"]
            parsed = mhsa.explain.parse_program(program)
            heaviest = _heaviest(parsed)
            assert kinds[int(z[layer][h])] == heaviest.kind
            i = layer * 4 + h
            assert (text["x"][i], text["y"][i]) == (h, layer)
            code = PROGRAM_KINDS[heaviest.kind][0] + ("+" if heaviest is not parsed else "")
            assert text["text"][i] == f"{code} {table.loc[f'L{layer}H{h}', 'iou']:.2f}"
            assert program in text["hovertext"][i]
            drawn.add(heaviest.kind)
            combined |= heaviest is not parsed
    legend = [t["name"] for t in spec["data"][2:]]
    want = [f"{code}: {kind}" for kind, (code, _) in PROGRAM_KINDS.items() if kind in drawn]
    assert legend == want + (["+: combined"] if combined else [])
    assert combined  # the toy's previous-token head mixes offset(-1) with self
    frame = next(d.value for d in at.dataframe if "kind" in d.value.columns)
    assert list(frame["head"]) == list(table.index)


def test_a_typed_hypothesis_gets_the_searchs_scores_and_a_bad_one_one_message(
    with_toy_atlas,
) -> None:
    row = _table(with_toy_atlas).set_index("head").loc["L0H3"]
    at = run(PAGE, **TOY, atlas_head="L0H3")
    at.text_input(key="explain_program").set_value(row["program"]).run()
    assert not at.exception and not at.error
    # the search's own program, scored again as a hypothesis: the same held-out scores
    assert _metrics(at)[4:6] == [
        ("IoU", f"{row['iou']:.2f}"),
        ("Accuracy", f"{row['accuracy']:.2f}"),
    ]
    at.text_input(key="explain_program").set_value("offset(-1").run()
    assert not at.exception
    with pytest.raises(mhsa.explain.ProgramError) as raised:
        mhsa.explain.parse_program("offset(-1")
    assert [e.value.replace("\\", "") for e in at.error] == [str(raised.value)]
    assert len(_metrics(at)) == 4  # the explanation's only: no scores for a broken program


def test_the_builder_writes_its_program_into_the_box(with_toy_atlas) -> None:
    at = run(PAGE, **TOY, atlas_head="L1H3")
    at.selectbox(key="explain_kind").set_value("token").run()
    at.selectbox(key="explain_name").set_value("induction").run()
    at.button(key="explain-use").click().run()
    assert not at.exception
    assert at.text_input(key="explain_program").value == "induction"
    assert len(_metrics(at)) == 8  # the explanation's scores, then the hypothesis's
    at.selectbox(key="explain_kind").set_value("positional").run()
    at.selectbox(key="explain_name").set_value("offset").run()
    at.number_input(key="explain_offset").set_value(-2).run()
    at.button(key="explain-use").click().run()
    assert at.text_input(key="explain_program").value == "offset(-2)"
    assert at.query_params["explain_program"] == "offset(-2)"  # the link carries it


def test_without_explanations_the_page_computes_them_through_the_heavy_queue(
    tmp_path, monkeypatch
) -> None:
    from mhsa.atlas.corpora import default_corpus

    texts = default_corpus("toy:induction", 60)[:60]
    mhsa.atlas.build_atlas(texts, tmp_path / "toy-induction", model="toy:induction", progress=False)
    monkeypatch.setenv("MHSA_ATLAS_DIR", str(tmp_path))
    atlas_views._listing.clear()
    explain_views._saved.clear()
    try:
        at = run(PAGE, **TOY, atlas_head="L0H3")
        assert not at.exception
        assert "has no explanations yet" in _shown(at)
        assert not at.metric
        at.button(key="explain-compute").click().run(timeout=300)
        assert not at.exception, at.exception
        saved = mhsa.explain.saved(mhsa.atlas.open_atlas(tmp_path / "toy-induction"))
        assert saved is not None and set(saved.table["head"]) == {
            f"L{layer}H{h}" for layer in range(2) for h in range(4)
        }
        assert at.code[0].value == saved.table.set_index("head").loc["L0H3", "program"]
    finally:
        atlas_views._listing.clear()
        explain_views._saved.clear()


def test_heads_and_head_roles_give_the_explanation_in_one_line_with_a_link(
    with_toy_atlas,
) -> None:
    row = _table(with_toy_atlas).set_index("head").loc["L0H3"]
    heads = run("pages/1_Heads.py", model="toy:induction", layer="0", head="3")
    assert not heads.exception
    lines = [m.value for m in heads.markdown if "Head_atlas?" in m.value]
    assert len(lines) == 1
    assert lines[0].replace("\\", "").startswith(f"**L0H3**: {row['description']}")
    assert lines[0].endswith(
        "(Head_atlas?model=toy%3Ainduction&atlas=toy-induction&atlas_head=L0H3)"
    )
    roles = run("pages/10_Head_roles.py", model="toy:induction", role_head="L1H2")
    assert not roles.exception
    assert next(m.value for m in roles.markdown if "Head_atlas?" in m.value).endswith(
        "atlas_head=L1H2)"
    )
    # the default model's atlas has no saved explanations: no line
    plain = run("pages/1_Heads.py", layer="0", head="3")
    assert not [m.value for m in plain.markdown if "Head_atlas?" in m.value]


def test_a_link_opens_the_head_atlas_on_its_head_and_hypothesis(with_toy_atlas) -> None:
    """What the one line links to opens the head and, with a program, scores it."""
    held = split_texts(mhsa.atlas.open_atlas(Path(with_toy_atlas) / "toy-induction"))[1]
    link = {"atlas_head": "L1H3", "explain_program": "<b>first</b>", "explain_text": held[1]}
    at = run(PAGE, **TOY, **{k: str(v) for k, v in link.items()})
    assert not at.exception
    assert at.selectbox(key="atlas_head").value == "L1H3"
    assert at.selectbox(key="explain_text").value == held[1]  # the example the link names
    shown = [e.value for e in at.error]
    assert len(shown) == 1 and "<b>first</b>" in shown[0].replace("\\", "")


def test_the_heads_replaced_together_are_listed_with_their_faithfulness(with_toy_atlas) -> None:
    """Under the map: each layer's heads replaced at once and the best-explained quarter (2 of
    the toy's 8 heads: the two of highest held-out IoU), each with its saved faithfulness."""
    at = run(PAGE, **TOY, atlas_head="L0H3")
    assert not at.exception, at.exception
    frame = next(d.value for d in at.dataframe if "heads replaced" in d.value.columns)
    assert list(frame["heads replaced"]) == ["L0", "L1", "best quarter"]
    assert list(frame["heads"]) == [4, 4, 2]
    found = mhsa.explain.saved(mhsa.atlas.open_atlas(Path(with_toy_atlas) / "toy-induction"))
    saved = found.together.set_index("what")
    for what, shown in zip(frame["heads replaced"], frame["faithfulness"], strict=True):
        value = float(saved.loc[what, "faithfulness"])
        assert shown == (f"{value:.2f}" if math.isfinite(value) else shown)
        assert math.isfinite(value) or shown.startswith("none: ")
    best = found.table.sort_values("iou", ascending=False)["head"][:2]
    assert set(saved.loc["best quarter", "heads"].split(",")) == set(best)

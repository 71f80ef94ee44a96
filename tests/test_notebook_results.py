"""Patching, circuit and atlas results in a notebook (``_repr_html_``, ``mhsa.show``): the
figure's SVG is parsed back and held against the numbers it was given, its colours against
their signs; nothing is fetched; text stays text."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

import mhsa
from mhsa.causal.patching import PatchingAgreement
from mhsa.circuits.discovery import PathPatch
from mhsa.circuits.graph import graph_of
from mhsa.plots.notebook_results import MAX_DRAWN_EDGES

HOSTILE = "<script>alert(1)</script>"


def _svg(html: str) -> ET.Element:
    found = re.search(r"<svg.*?</svg>", html, re.S)
    assert found is not None
    return ET.fromstring(found.group(0))


def _all(svg: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in svg.iter(f"{{http://www.w3.org/2000/svg}}{tag}") if e.get("class") == cls]


def _rgb(fill: str) -> tuple[int, ...]:
    return tuple(int(c) for c in re.findall(r"\d+", fill)[:3])


def _self_contained(html: str) -> None:
    assert "<script" not in html and not re.search(r"\b(src|href)\s*=", html)
    assert set(re.findall(r"https?://[^\s\"'<]+", html)) <= {"http://www.w3.org/2000/svg"}


def _patch_frame(effect: np.ndarray, metric: str = "logit diff") -> pd.DataFrame:
    layers, heads = effect.shape
    frame = pd.DataFrame(
        {
            "layer": np.repeat(np.arange(layers), heads),
            "head": np.tile(np.arange(heads), layers),
            "patched": effect.reshape(-1) * 3.0,
            "effect": effect.reshape(-1),
        },
        index=[f"L{li}H{h}" for li in range(layers) for h in range(heads)],
    )
    frame.attrs["metric"] = metric
    return frame


def test_patching_heatmap_holds_each_heads_effect_in_its_signed_colour() -> None:
    effect = np.random.default_rng(3).normal(size=(3, 4))
    effect[2, 1] = -4.0  # the largest |effect|, negative
    frame = _patch_frame(effect, metric=HOSTILE)
    html = mhsa.show(frame).html
    cells = _all(_svg(html), "rect", "mhsa-cell")
    assert len(cells) == 12
    shown = {c.get("data-name"): float(c.get("data-value")) for c in cells}
    assert shown == pytest.approx(frame["effect"].to_dict())
    darkest = min(cells, key=lambda c: sum(_rgb(c.get("fill"))))
    assert darkest.get("data-name") == "L2H1"
    for cell in cells:
        r, _, b = _rgb(cell.get("fill"))
        value = float(cell.get("data-value"))
        assert (b > r) if value > 0 else (r > b), (cell.get("data-name"), value, (r, b))
    assert "blue: effect &gt; 0" in html and "red: effect &lt; 0" in html
    assert HOSTILE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    _self_contained(html)


def test_a_real_patching_table_shows_itself() -> None:
    frame = mhsa.causal.patch_heads(
        "ba ke mo di fu lo ba ke mo di",
        "ba ke mo ra fu lo ba ke mo di",
        model="toy:induction",
        answer="fu",
        wrong="lo",
    )
    cells = _all(_svg(mhsa.show(frame).html), "rect", "mhsa-cell")
    assert {c.get("data-name"): float(c.get("data-value")) for c in cells} == pytest.approx(
        frame["effect"].to_dict()
    )


def test_positions_table_names_tokens_literally() -> None:
    tokens = ["a", "<b>", HOSTILE]
    frame = pd.DataFrame(
        {
            "layer": 1,
            "head": [0, 0, 0, 1, 1, 1],
            "position": [0, 1, 2, 0, 1, 2],
            "token": tokens * 2,
            "corrupted_token": tokens * 2,
            "patched": 0.0,
            "effect": [0.1, -0.2, 0.3, 0.0, 0.5, -0.6],
        }
    )
    html = mhsa.show(frame).html
    cells = _all(_svg(html), "rect", "mhsa-cell")
    assert [float(c.get("data-value")) for c in cells] == frame["effect"].tolist()
    assert "<b>" not in html.replace("<p><b>", "") and HOSTILE not in html
    assert "&lt;b&gt;" in html


def _edges(n: int, seed: int = 0) -> pd.DataFrame:
    graph = graph_of(3, 4)
    table = graph.edges(np.random.default_rng(seed).normal(size=graph.mask.shape))
    table.attrs.update(layers=3, heads=4)
    return table.head(n)


@pytest.mark.parametrize("n", [12, 150])
def test_circuit_edges_drawn_by_score(n: int) -> None:
    edges = _edges(n)
    html = mhsa.show(edges).html
    lines = _all(_svg(html), "line", "mhsa-edge")
    assert len(lines) == min(n, MAX_DRAWN_EDGES)
    strongest = edges["score"].abs().sort_values(ascending=False).head(MAX_DRAWN_EDGES)
    drawn = sorted(abs(float(e.get("data-score"))) for e in lines)
    assert drawn == pytest.approx(sorted(strongest))
    widths = [float(e.get("stroke-width")) for e in lines]
    assert widths == sorted(widths)  # the strongest drawn last, widest
    assert max(widths) == pytest.approx(6.0)
    for line in lines:
        r, _, b = _rgb(line.get("stroke"))
        score = float(line.get("data-score"))
        assert (b > r) if score < 0 else (r > b)  # blue: carries the clean answer (-score > 0)
    assert len(re.findall(r"<tr[ >]", html)) == n + 1  # the table: every row given
    _self_contained(html)


def test_a_circuit_graph_draws_each_of_its_edges() -> None:
    small = graph_of(2, 4)
    assert len(_all(_svg(small._repr_html_()), "line", "mhsa-edge")) == small.n_edges == 110
    large = mhsa.circuits.circuit_graph("default")
    html = large._repr_html_()
    assert "<svg" not in html and f"{large.n_edges} edges are too many" in html


def test_agreement_scatter_places_each_head() -> None:
    agreement = PatchingAgreement(
        heads=("L1H0", "L0H3"), exact=(0.6, 0.3), estimated=(0.5, -0.2), found=1, pearson=0.75
    )
    html = agreement._repr_html_()
    points = _all(_svg(html), "circle", "mhsa-point")
    assert [
        (p.get("data-name"), float(p.get("data-x")), float(p.get("data-y"))) for p in points
    ] == [
        ("L1H0", 0.6, 0.5),
        ("L0H3", 0.3, -0.2),
    ]
    assert "ranks 1 among its own top 2" in html and "0.750" in html
    _self_contained(html)


def test_path_patch_bars_are_its_metrics() -> None:
    patch = PathPatch("L0H1", "L1H2", "k", patched=1.5, clean=2.0, corrupted=-1.0)
    html = patch._repr_html_()
    bars = _all(_svg(html), "rect", "mhsa-bar")
    assert [float(b.get("data-value")) for b in bars] == [2.0, 1.5, -1.0]
    assert "L0H1 → L1H2 (k)" in html and f"{patch.effect:.3f}" in html


def test_atlas_maps_its_induction_score(app_atlas) -> None:
    atlas = mhsa.atlas.open_atlas(app_atlas)
    html = atlas._repr_html_()
    cells = _all(_svg(html), "rect", "mhsa-cell")
    scores = atlas.heads()["induction score"]
    assert {c.get("data-name"): float(c.get("data-value")) for c in cells} == pytest.approx(
        scores.to_dict()
    )
    assert re.findall(r"<th>(L\d+H\d+)</th>", html) == list(scores.index)  # the table
    _self_contained(html)


def test_show_takes_any_result() -> None:
    result = mhsa.from_attention(np.full((1, 1, 2, 2), 0.5), ["a", "b"])
    assert "mhsa-data" in mhsa.show(result).html
    plain = mhsa.show(pd.DataFrame({"x": [HOSTILE]})).html
    assert HOSTILE not in plain and "&lt;script&gt;" in plain
    with pytest.raises(TypeError, match="No notebook view of a object"):
        mhsa.show(object())


def test_an_encoder_decoder_atlas_maps_each_part(tmp_path, tiny_bart_path) -> None:
    texts = ["The cat sat on the mat.", "Dogs bark at <b>night</b>.", "A b a b a b."]
    atlas = mhsa.atlas.build_atlas(texts, tmp_path / "bart", model=tiny_bart_path, progress=False)
    assert isinstance(atlas, mhsa.atlas.AtlasParts)
    html = mhsa.show(atlas).html
    svgs = [ET.fromstring(m) for m in re.findall(r"<svg.*?</svg>", html, re.S)]
    assert len(svgs) == len(atlas.parts) == 2
    for svg, (name, part) in zip(svgs, atlas.parts.items(), strict=True):
        scores = part.heads()["induction score"]
        letter = "E" if name == "encoder" else "D"
        assert all(label.startswith(letter) for label in scores.index)
        cells = _all(svg, "rect", "mhsa-cell")
        shown = {c.get("data-name"): float(c.get("data-value")) for c in cells}
        assert shown == pytest.approx(scores.to_dict())
        rows = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
        assert f"{letter}0" in rows and f"{letter}1" in rows
        assert f"{part.tokens:,} tokens" in html
    assert re.findall(r"<th>([ED]\d+H\d+)</th>", html) == atlas.labels  # each part's table
    _self_contained(html)


def _guide_y(svg: ET.Element, value: float) -> float:
    (guide,) = [g for g in _all(svg, "line", "mhsa-guide") if float(g.get("data-value")) == value]
    assert guide.get("y1") == guide.get("y2")
    return float(guide.get("y1"))


def test_faithfulness_curve_places_each_circuit() -> None:
    clean, corrupted = "ba ke mo di fu lo ba ke mo di", "ba ke mo ra fu lo ba ke mo di"
    kw = {"model": "toy:induction", "answer": "fu", "wrong": "lo"}
    scores = mhsa.circuits.edge_attribution(clean, corrupted, **kw)
    curve = mhsa.circuits.faithfulness_curve(clean, corrupted, scores, extra=(7,), **kw)
    html = curve._repr_html_()
    svg = _svg(html)
    points, extra = _all(svg, "circle", "mhsa-point"), _all(svg, "circle", "mhsa-extra")
    mib = curve.points[curve.points["mib"]]
    assert [float(p.get("data-y")) for p in points] == mib["faithfulness"].tolist()
    assert [float(p.get("data-x")) for p in points] == mib["fraction"].tolist()
    assert [float(p.get("data-y")) for p in extra] == [curve.points["faithfulness"].iloc[-1]]
    assert extra[0].get("data-name") == "top 7 of 110 edges (6.4%)"
    # geometry: y linear in f between the guides at f = 0 and f = 1; x linear in log10(share)
    y0, y1 = _guide_y(svg, 0.0), _guide_y(svg, 1.0)
    shares = [*mib["fraction"], 7 / 110]
    fs = [*mib["faithfulness"], curve.points["faithfulness"].iloc[-1]]
    circles = [*points, *extra]
    for circle, f in zip(circles, fs, strict=True):
        assert float(circle.get("cy")) == pytest.approx(y0 + (y1 - y0) * f, abs=0.02)
    x_lo, x_hi = float(points[0].get("cx")), float(points[-1].get("cx"))  # 0.1 % and 100 %
    for circle, share in zip(circles, shares, strict=True):
        want = x_lo + (x_hi - x_lo) * (np.log10(share) + 3) / 3
        assert float(circle.get("cx")) == pytest.approx(want, abs=0.02)
    (line,) = list(svg.iter("{http://www.w3.org/2000/svg}polyline"))
    joined = [tuple(map(float, xy.split(","))) for xy in line.get("points").split()]
    assert joined == [(float(p.get("cx")), float(p.get("cy"))) for p in points]
    assert f"CPR {curve.cpr:.3f}" in html and f"CMD {curve.cmd:.3f}" in html
    assert len(re.findall(r"<tr[ >]", html)) == len(curve.points) + 1
    assert mhsa.show(curve).html == html
    _self_contained(html)

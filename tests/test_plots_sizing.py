"""Presentation mode: every font of a figure at least 20 px (``plots.enlarge_fonts``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

import mhsa
from mhsa import plots
from mhsa.plots.sizing import PRESENTATION_FONT
from tests.tiny import hand_result


def _result(attention: np.ndarray, tokens: list[str]) -> mhsa.AttentionResult:
    return hand_result(attention, tokens)


def _sizes(fig) -> dict[str, float]:
    """Every font size the figure sets, by where it is (plain JSON, read independently of the
    function under test)."""
    layout = fig.layout.to_plotly_json()
    out = {"font": layout["font"]["size"], "hover": layout["hoverlabel"]["font"]["size"]}
    for name, axis in layout.items():
        if name.startswith(("xaxis", "yaxis")):
            out[f"{name}.tick"] = axis["tickfont"]["size"]
            out[f"{name}.title"] = axis["title"]["font"]["size"]
        if name.startswith("coloraxis"):
            out[f"{name}.tick"] = axis["colorbar"]["tickfont"]["size"]
            out[f"{name}.title"] = axis["colorbar"]["title"]["font"]["size"]
    for i, a in enumerate(layout.get("annotations", [])):
        out[f"annotation{i}"] = a["font"]["size"]
    for i, trace in enumerate(fig.to_plotly_json()["data"]):
        if "colorbar" in trace:
            out[f"trace{i}.bar.tick"] = trace["colorbar"]["tickfont"]["size"]
            out[f"trace{i}.bar.title"] = trace["colorbar"]["title"]["font"]["size"]
    return out


def test_every_font_of_a_heatmap_and_a_role_map_reaches_20() -> None:
    rng = np.random.default_rng(0)
    a = rng.random((2, 2, 5, 5))
    result = _result(a / a.sum(-1, keepdims=True), ["a", "b", "c", "d", "e"])
    heat = plots.head_heatmap(result, 1, 0)
    heat.update_layout(xaxis={"tickfont": {"size": 9}})  # a module's own small size
    scores = rng.random((2, 2))
    frame = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "x": scores.ravel()})
    maps = plots.role_maps([("X score", frame, "x"), ("Y score", frame, "x")], title="t")
    for fig in (heat, maps):
        plots.enlarge_fonts(fig)
        sizes = _sizes(fig)
        assert sizes and min(sizes.values()) >= PRESENTATION_FONT, sizes
        assert fig.layout.title.font.size >= 28
    big = plots.head_heatmap(result, 0, 0)
    big.update_layout(xaxis={"tickfont": {"size": 30}})
    assert plots.enlarge_fonts(big).layout.xaxis.tickfont.size == 30  # larger sizes are kept

"""Presentation mode keeps the figures readable (issue 46, item 9): a figure of a set height
grows with its fonts so that its plot area keeps its size; the map of heads writes only the
names that have room; icons are Streamlit's Material icons, not emoji a font may lack."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from mhsa import plots
from mhsa.plots.similarity import LABEL_ROOM, spaced_labels
from tests.tiny import hand_result

ROOT = Path(__file__).resolve().parents[1]


def _plot_height(fig) -> float:
    """The plot area's height: the figure's less its top and bottom margins, as fitted."""
    plots.fit_margins(fig)
    layout = fig.layout.to_plotly_json()
    return layout["height"] - layout["margin"]["t"] - layout["margin"]["b"]


def test_a_presented_map_keeps_its_plot_area() -> None:
    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    a = np.full((1, 1, 9, 9), 1 / 9)
    normal = plots.head_heatmap(hand_result(a, tokens), 0, 0)
    presented = plots.enlarge_fonts(plots.head_heatmap(hand_result(a, tokens), 0, 0))
    assert presented.layout.height > normal.layout.height
    assert _plot_height(presented) >= 0.95 * _plot_height(normal)


def test_only_names_with_room_are_written_on_the_map_of_heads() -> None:
    rng = np.random.default_rng(0)
    crowd = rng.normal(0, 0.005, size=(30, 2))  # thirty heads on top of each other
    far = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    xy = np.concatenate([crowd, far])
    names = [f"L{i // 12}H{i % 12}" for i in range(len(xy))]
    written = spaced_labels(xy[:, 0], xy[:, 1], names)
    kept = [i for i, w in enumerate(written) if w]
    assert {30, 31, 32} <= set(kept)  # the outliers are named
    assert sum(1 for i in kept if i < 30) == 1  # one name for the crowd, the rest on hover
    span = 2.0  # the larger side: x from -1 to 1
    for i in kept:  # every two written names apart by LABEL_ROOM, checked pair by pair
        for j in kept:
            if i < j:
                assert np.hypot(*(xy[i] - xy[j])) / span >= LABEL_ROOM
    coords = pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1], "layer": 0}, index=names)
    fig = plots.head_map_figure(coords)
    assert list(fig.data[0].text) == written
    assert [c[0] for c in fig.data[0].customdata] == names  # every name stays on hover


def test_icons_are_material_icons_not_emoji() -> None:
    emoji = re.compile("[\U0001f300-\U0001faff\u2600-\u27bf\u2b50\u23e9-\u23fa]")
    for path in [ROOT / "app.py", *ROOT.glob("pages/*.py"), *ROOT.glob("ui/**/*.py")]:
        text = path.read_text()
        for icon in re.findall(r"icon=\"([^\"]*)\"", text):
            assert icon.startswith(":material/"), (path.name, icon)
        assert not emoji.search(text), (path.name, emoji.search(text))

"""An edge that carries the answer is shown as carrying it (issue 46, item 7): the Circuits
graph and table and the Train heads K-composition curve show the support, minus the library's
EAP-IG score, and a live curve names the edge of each point instead of relabelling itself."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from mhsa import plots
from mhsa.plots.common import signed_color
from mhsa.training.circuit_probe import strongest_k_edges

#: the toy's top scores ran -8.0 to -1.7: every edge carrying the answer is below 0
EDGES = pd.DataFrame(
    {
        "source": ["L0H3", "L0H1", "input"],
        "target": ["L1H3", "L1H0", "logits"],
        "input": ["k", "q", ""],
        "score": [-8.0, 2.0, -1.7],
    }
)


def test_an_edge_that_carries_the_answer_is_drawn_blue_and_said_so() -> None:
    fig = plots.circuit_figure(EDGES, 2, 4)
    lines = [t for t in fig.data if t.mode == "lines"]
    # drawn weakest first: -1.7, 2.0, -8.0; colour by support = -score on the bound 8
    assert [t.line.color for t in lines] == [
        signed_color(1.7, 8.0),
        signed_color(-2.0, 8.0),
        signed_color(8.0, 8.0),
    ]
    blue, red = signed_color(8.0, 8.0), signed_color(-8.0, 8.0)
    assert int(blue[4:].split(",")[0]) < int(red[4:].split(",")[0])  # blue end: less red
    assert "blue: carries the clean answer" in fig.layout.title.text.replace(" <br>", " ")
    # a colour bar keyed to the support: its ends are the drawn colours' bound
    bar = next(t for t in fig.data if t.name == "support")
    assert (bar.marker.cmin, bar.marker.cmax) == (-8.0, 8.0)
    assert bar.marker.showscale and "support" in bar.marker.colorbar.title.text


def test_the_legend_names_the_metric_and_the_sign_it_explains() -> None:
    """Every edge drawn may have a negative score: the legend says, for this metric, that blue
    is a support (-score) above 0, corrupting the edge lowering the metric; a metric with the
    user's tokens is escaped."""
    metric = "logit(' <b>Mary') − logit(' John') at the last position"
    fig = plots.circuit_figure(EDGES, 2, 4, metric=metric)
    title = fig.layout.title.text.replace("<br>", " ").replace("  ", " ")
    assert "support = -score" in title
    assert "blue: corrupting the edge lowers logit(' &lt;b&gt;Mary')" in title
    assert "<b>Mary" not in fig.layout.title.text


def test_the_edge_table_shows_the_support_and_the_graphs_name_for_the_output() -> None:
    from ui.views.circuits import edge_table

    table = edge_table(EDGES, "last hidden state")
    assert table["source"].tolist() == ["L0H3", "L0H1", "input"]  # largest |score| first
    assert table["support"].tolist() == [8.0, -2.0, 1.7]
    assert table["score"].tolist() == [-8.0, 2.0, -1.7]  # the library's sign kept
    assert "logits" not in table["target"].tolist()
    assert table["target"].tolist()[-1] == "last hidden state"


def _snapshot(step: int, edges: dict[tuple[int, int, int, int], float]) -> SimpleNamespace:
    scores = np.full((2, 4, 2, 4), np.nan)
    for index, score in edges.items():
        scores[index] = score
    return SimpleNamespace(step=step, k_edge_scores=scores)


def test_the_k_curve_follows_the_strongest_edge_and_names_each_point() -> None:
    snapshots = [
        _snapshot(0, {(0, 3, 1, 0): -0.2, (0, 3, 1, 3): 0.1, (0, 1, 1, 2): 0.3}),
        _snapshot(50, {(0, 3, 1, 0): -1.0, (0, 3, 1, 3): -0.5}),
        _snapshot(100, {(0, 3, 1, 0): -1.0, (0, 3, 1, 3): -4.0}),
        SimpleNamespace(step=150, k_edge_scores=None),  # a snapshot without scores
    ]
    steps, edges, supports = strongest_k_edges(snapshots)
    want = []
    for s in snapshots[:3]:  # by a loop: the largest -score, and which edge
        best = max(
            (-v, f"L{a}H{b} → L{c}H{d}")
            for (a, b, c, d), v in np.ndenumerate(s.k_edge_scores)
            if v == v
        )
        want.append(best)
    assert steps == [0, 50, 100]
    assert list(zip(supports, edges, strict=True)) == want
    assert edges == ["L0H3 → L1H0", "L0H3 → L1H0", "L0H3 → L1H3"]
    fig = plots.k_support_figure(steps, edges, supports, phase_change_step=50)
    assert list(fig.data[0].y) == pytest.approx([0.2, 1.0, 4.0])  # rises as the circuit forms
    assert [c[0] for c in fig.data[0].customdata] == edges
    assert fig.layout.title.text.startswith("The strongest K-composition edge over the steps")
    assert strongest_k_edges([SimpleNamespace(step=0, k_edge_scores=None)]) is None

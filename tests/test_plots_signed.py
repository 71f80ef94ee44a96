"""Every map of signed values has its white point at 0 (issue 46): each figure function of
``mhsa.plots`` is either drawn here on values mostly above 0 (the case that put the Inside MHSA
map's white point near +2) and checked, or declared one that draws no signed map; and no module
of ``mhsa/plots`` picks a red-blue scale except through ``signed_scale`` or ``matrix_heatmap``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from mhsa import plots
from mhsa.analysis.classroom import Neuron
from mhsa.causal.attribution import HeadAttribution, LogitLens

PLOTS = Path(plots.__file__).parent
RDBU = go.Heatmap(colorscale=plots.SIGNED_COLORSCALE).colorscale  # as plotly stores it
#: skewed above 0: a scale from the data's own minimum to maximum is white near +2
SKEWED = np.array([[-0.5, 0.2, 1.0, 2.0], [3.0, 4.0, 4.5, 2.5], [1.5, 0.5, 3.5, 2.2]])
TOKENS = ["<b>a</b>", "b", "c", "d"]


def _heads_table(values: np.ndarray, column: str) -> pd.DataFrame:
    layers, heads = values.shape
    rows = [
        {"layer": li, "head": h, column: float(values[li, h])}
        for li in range(layers)
        for h in range(heads)
    ]
    return pd.DataFrame(rows, index=[f"L{r['layer']}H{r['head']}" for r in rows])


def _attribution() -> HeadAttribution:
    return HeadAttribution(
        "t", "m", ("a", "b"), "x", "y", 1, 2, "LayerNorm", 0.3, SKEWED, np.zeros(3),
        np.array([0.5, 1.0, 2.0]), 0.0, 0.0, float(SKEWED.sum()) + 3.8,
    )  # fmt: skip


def _lens() -> LogitLens:
    tokens = np.array([[["a", "b"]] * 4] * 3, dtype=object)
    probs = np.full((3, 4, 2), 0.4)
    return LogitLens(
        ("a", "b", "c", "d"), ("embeddings", "L0", "L1"), tokens, probs, probs, "x", "y", SKEWED
    )


def _neuron() -> Neuron:
    keys = SKEWED.T[:, :3]  # 4 keys, d_head 3
    query = np.array([0.5, 2.0, 3.0])
    dots = keys @ query
    return Neuron(0, 1, query, keys, keys * query, dots, dots * 0.5, np.full(4, 0.25), 0.5)


def _positions() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"layer": 0, "head": h, "position": p, "effect": SKEWED[h, p], "token": t,
             "corrupted_token": t}
            for h in range(3)
            for p, t in enumerate(TOKENS)
        ]
    )  # fmt: skip


#: every figure function that can draw signed values, drawn on skewed ones
SIGNED = {
    "step_heatmap": lambda: plots.step_heatmap(SKEWED, TOKENS[:3], "X", [1, 3, 4]),
    "matrix_heatmap": lambda: plots.matrix_heatmap(
        SKEWED, TOKENS[:3], TOKENS, title="t", colorscale=plots.SIGNED_COLORSCALE
    ),
    "patching_maps": lambda: plots.patching_maps(
        [("exact", _heads_table(SKEWED, "effect"))], title="t"
    ),
    "role_maps": lambda: plots.role_maps(
        [("a", _heads_table(SKEWED, "s"), "s")], title="t", signed=True
    ),
    "patching_positions_figure": lambda: plots.patching_positions_figure(_positions()),
    "detection_pattern_figure": lambda: plots.detection_pattern_figure(
        SKEWED[:, :3][:3], TOKENS[:3], "custom"
    ),
    "attribution_figure": lambda: plots.attribution_figure(_attribution()),
    "logit_lens_figure": lambda: plots.logit_lens_figure(_lens()),
    "neuron_figure": lambda: plots.neuron_figure(_neuron(), TOKENS),
    "head_value_grid": lambda: plots.head_value_grid(
        _heads_table(SKEWED, "importance"), "importance", title="t"
    ),
    "copying_figure": lambda: plots.copying_figure(
        pd.Series(SKEWED.reshape(-1), index=[f"L{i // 4}H{i % 4}" for i in range(SKEWED.size)])
    ),
}
#: figure functions that draw no map of signed values (weights, shares, counts, curves), and
#: helpers that draw nothing of their own; circuit_figure's edges are checked below
UNSIGNED = {
    "circuit_figure", "circuit_node_xy", "composition_figure", "decorate", "downsample",
    "enlarge_fonts", "faithfulness_figure", "figure_data", "fit_margins", "flow_figure",
    "head_grid", "head_heatmap", "head_map_figure", "head_scores_figure", "head_zoom",
    "importance_scatter", "k_composition_figure", "k_support_figure", "label",
    "layer_change_figure", "line_pairs", "line_view", "mark_window", "mean_heatmap",
    "patching_scatter", "probe_mosaic",
    "pruning_figure", "rollout_figure", "similarity_figure", "sink_map", "snapshot_history",
    "snapshot_scores", "stat_grid", "token_focus", "training_curves",
    "atlas_histogram", "example_heatmap", "positional_figure", "clickable_cells",
    "qk_terms_figure",  # bars from 0, not a map
    "head_style",  # a head's colour and dash
    "tag_histogram_figure",  # counts of tags
    "pattern_pair", "explanation_map",  # weights 0-1; kinds of program
    "alt_text", "describe_attention", "set_alt",  # a figure's text alternative
}  # fmt: skip


def test_every_figure_function_is_checked_or_declared_unsigned() -> None:
    functions = {n for n in plots.__all__ if inspect.isfunction(getattr(plots, n))}
    assert functions == set(SIGNED) | UNSIGNED, functions ^ (set(SIGNED) | UNSIGNED)


def _signed_scales(fig: go.Figure) -> list[tuple[float, float, float | None, np.ndarray]]:
    """``(low, high, mid, values)`` of every trace drawn on the red-blue scale (its own, or
    the coloraxis it shares)."""
    found = []
    for trace in fig.data:
        if "colorscale" not in trace:
            continue
        axis = getattr(trace, "coloraxis", None)
        if axis:
            a = fig.layout[axis]
            scale, low, high, mid = a.colorscale, a.cmin, a.cmax, a.cmid
        else:
            scale, low, high, mid = trace.colorscale, trace.zmin, trace.zmax, trace.zmid
        if scale == RDBU:
            found.append((low, high, mid, np.asarray(trace.z, dtype=np.float64)))
    return found


@pytest.mark.parametrize("name", sorted(SIGNED))
def test_every_signed_map_is_white_at_zero(name: str) -> None:
    scales = _signed_scales(SIGNED[name]())
    assert scales, "no map on the signed scale"
    for low, high, mid, z in scales:
        finite = np.abs(z[np.isfinite(z)])
        assert low is not None and high is not None
        assert low == pytest.approx(-high)  # white (the scale's middle) at 0
        assert mid in (None, 0)
        assert high >= finite.max(initial=0.0) - 1e-6  # and every value on the scale


def test_a_value_at_zero_is_drawn_white_and_the_signs_apart() -> None:
    white = plots.common.signed_color(0.0, 4.5)
    assert white == plots.common.signed_color(0.0, 0.1)  # the middle, whatever the bound
    red, blue = plots.common.signed_color(-4.5, 4.5), plots.common.signed_color(4.5, 4.5)
    assert red.startswith("rgb") and red != blue != white
    assert int(red[4:].split(",")[0]) > int(blue[4:].split(",")[0])  # red end: more red


def test_circuit_edges_take_their_colour_from_the_centred_scale() -> None:
    edges = pd.DataFrame(
        {
            "source": ["L0H0", "L0H1"],
            "target": ["L1H0", "logits"],
            "input": ["k", ""],
            "score": [4.0, 0.0],
        }
    )
    fig = plots.circuit_figure(edges, 2, 2)
    colours = {t.line.color for t in fig.data if t.mode == "lines"}
    assert plots.common.signed_color(0.0, 4.0) in colours
    assert plots.common.signed_color(-4.0, 4.0) in colours  # drawn by its support, -score


def test_no_plot_module_chooses_a_red_blue_scale_of_its_own() -> None:
    """Outside ``common.py`` the signed scale is named only as ``matrix_heatmap``'s
    ``colorscale`` (which centres it); no module names a diverging scale by its string."""
    diverging = {"rdbu", "rdylbu", "piyg", "prgn", "brbg", "puor", "rdgy", "balance", "picnic"}
    for path in sorted(PLOTS.glob("*.py")):
        if path.name in ("common.py", "__init__.py"):
            continue
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value.lower() not in diverging, (path.name, node.value)
            if isinstance(node, ast.Name) and node.id == "SIGNED_COLORSCALE":
                up = parents[node]
                while isinstance(up, ast.IfExp):
                    up = parents[up]
                call = parents.get(up)
                assert isinstance(up, ast.keyword) and up.arg == "colorscale", path.name
                assert isinstance(call, ast.Call) and getattr(call.func, "id", "") == (
                    "matrix_heatmap"
                ), path.name

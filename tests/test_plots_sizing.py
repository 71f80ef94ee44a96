"""Presentation mode: every font of a figure at least 20 px (``plots.enlarge_fonts``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

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


# --- room for titles, colour-bar titles and labels (issue 46, item 9) --------------------------

#: measured in Chromium (plotly.js as shipped): a title of several lines anchored at the top of
#: the figure starts this many font sizes above where one of a single line starts, and each
#: line takes 1.3 font sizes
RISE, LINE = 0.95, 1.3


def _presented(fig):
    """``fig`` as a page draws it in presentation mode: fonts enlarged, margins fitted."""
    return plots.fit_margins(plots.enlarge_fonts(fig))


def _figures() -> dict[str, object]:
    """Figure functions drawn with long titles (wrapped to two or three lines) and short ones:
    the signed maps of ``tests/test_plots_signed.py`` and the figures of item 9's screenshots."""
    from tests.test_plots_signed import SIGNED

    rng = np.random.default_rng(0)
    a = rng.random((2, 2, 6, 6))
    result = _result(a / a.sum(-1, keepdims=True), list("abcdef"))
    edges = pd.DataFrame(
        {"source": ["input", "L0H1"], "target": ["L1H0", "logits"], "input": ["k", ""],
         "score": [-1.0, 0.5]}
    )  # fmt: skip
    figures = {name: make() for name, make in SIGNED.items()}
    figures |= {
        "head_heatmap": plots.head_heatmap(result, 1, 0),
        "detection_pattern_figure": plots.detection_pattern_figure(
            np.eye(6, k=-1), list("abcdef"), "previous token"
        ),
        "circuit_figure": plots.circuit_figure(edges, 2, 4),
        "long_title": plots.matrix_heatmap(
            np.eye(3), list("abc"), list("abc"), title="word " * 30, columns=4
        ),
    }
    return figures


def test_every_title_starts_inside_the_figure_and_fits_its_margin_when_presented() -> None:
    multiline = 0
    for name, fig in _figures().items():
        layout = _presented(fig).layout.to_plotly_json()
        title = layout["title"]
        lines = 1 + title["text"].count("<br>")
        size = title["font"]["size"]
        pad = title["pad"]["t"]
        assert title["yref"] == "container" and title["yanchor"] == "top", name
        top = pad - (RISE * size if lines > 1 else 0.0)
        assert top >= 0, (name, lines, size, pad)  # main: 10 - 0.95 * 28 < 0: cut at the top
        assert layout["margin"]["t"] >= pad + LINE * lines * size, name
        multiline += lines > 1
    assert multiline >= 3  # the case that was cut ("Detection pattern: ...", "Circuit: ...")


def test_a_colour_bar_under_a_map_has_its_title_clear_of_it() -> None:
    """Colour bars lying under a map (figures in a column) keep their title on top over an
    empty line (plotly set it on the bar's edge: measured in Chromium, 1 px above the bar; the
    empty line lifts it 26 px), and the bottom margin holds the ticks and two title lines."""
    lying = 0
    for name, fig in _figures().items():
        presented = _presented(fig)
        for trace in presented.to_plotly_json()["data"]:
            bar = trace.get("colorbar")
            if trace.get("type") != "heatmap" or not bar or trace.get("showscale") is False:
                continue
            title = bar.get("title", {})
            if bar.get("orientation") == "h":
                lying += 1
                assert title["side"] == "top" and title["text"].endswith("<br> "), name
                size = max(title["font"]["size"], bar["tickfont"]["size"])
                # ticks, bar (12 px) and pad, two lines of title
                assert presented.layout.margin.b >= 10 + 12 + 3 * LINE * size, name
            else:  # plotly's default side of an upright bar: top
                assert title.get("side") in (None, "top"), name
    assert lying >= 1  # the long-titled map in a column


def test_a_figure_of_no_set_height_grows_with_its_fonts() -> None:
    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, 1]))
    assert fig.layout.height is None
    assert plots.enlarge_fonts(fig).layout.height == round(450 * 1.4)  # Streamlit's default


def _label_boxes(fig, trace: int) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Each written text label of ``fig``'s trace ``trace`` as a box in px (y up), from the
    fitted layout: the plot area is the page's width (880 px) or the figure's height less the
    margins; a label is its characters times 0.62 of the font size wide, one font size tall,
    centred over (``top``) or under (``bottom``) its point, 5 px from it."""
    layout = fig.layout.to_plotly_json()
    m = layout["margin"]
    width, height = 880 - m["l"] - m["r"], layout["height"] - m["t"] - m["b"]
    data = fig.data[trace]
    size = layout["font"]["size"]
    xs, ys = np.asarray(data.x, float), np.asarray(data.y, float)
    x0, x1 = layout["xaxis"].get("range") or (xs.min(), xs.max())
    y0, y1 = ys.min() - 0.5, ys.max() + 0.5
    positions = data.textposition
    boxes = []
    for i, text in enumerate(data.text):
        if not text:
            continue
        x = (xs[i] - x0) / (x1 - x0) * width
        y = (ys[i] - y0) / (y1 - y0) * height
        w = len(text) * 0.62 * size
        where = positions if isinstance(positions, str) else positions[i]
        if where == "middle right":  # beside its point
            boxes.append((text, (x + 4, y - size / 2, x + 4 + w, y + size / 2)))
            continue
        bottom = y + 5 if where.startswith("top") else y - 5 - size
        boxes.append((text, (x - w / 2, bottom, x + w / 2, bottom + size)))
    return boxes


def _overlapping(boxes) -> list[tuple[str, str]]:
    return [
        (a, b)
        for i, (a, p) in enumerate(boxes)
        for b, q in boxes[i + 1 :]
        if p[0] < q[2] and q[0] < p[2] and p[1] < q[3] and q[1] < p[3]
    ]


def test_no_two_node_names_of_the_default_models_circuit_overlap_when_presented() -> None:
    """MiniLM's graph: 6 layers of 12 heads (L5H10 and L5H11 were drawn over each other)."""
    edges = pd.DataFrame(
        {"source": ["L4H3", "L5H11"], "target": ["L5H11", "logits"], "input": ["k", ""],
         "score": [-1.0, -2.0]}
    )  # fmt: skip
    fig = _presented(plots.circuit_figure(edges, 6, 12, output="last hidden state"))
    nodes = next(i for i, t in enumerate(fig.data) if t.name == "nodes")
    boxes = _label_boxes(fig, nodes)
    assert len(boxes) == 2 + 6 * 13
    assert not _overlapping(boxes)
    small = _presented(plots.circuit_figure(edges.iloc[:0], 2, 4))  # room: every name on top
    assert set(small.data[-1].textposition) == {"top center"}


def test_the_q_k_v_letters_of_circuit_edges_stay_off_the_node_names_when_presented() -> None:
    """An edge's q/k/v letter (the "kv" beside L5H11 on the default model's circuit) is
    written where no node's name is, also on edges between neighbouring rows."""
    sources = ["L4H3", "M4", "L4H10", "L3H7", "input", "M3", "L4H11"]
    inputs = ["k", "v", "q", "k", "v", "q", "v"]
    edges = pd.DataFrame(
        {"source": sources, "target": ["L5H11"] * 5 + ["L4H10", "M4"],
         "input": [*inputs[:6], ""], "score": -np.linspace(1, 2, 7)}
    )  # fmt: skip
    fig = _presented(plots.circuit_figure(edges, 6, 12, output="last hidden state"))
    nodes = next(i for i, t in enumerate(fig.data) if t.name == "nodes")
    letters = next(i for i, t in enumerate(fig.data) if t.name == "edges")
    names, written = _label_boxes(fig, nodes), _label_boxes(fig, letters)
    assert sorted(t for t, _ in written) == sorted(inputs[:6])
    assert not [
        (a, b) for a, p in written for b, q in names if p[0] < q[2] and q[0] < p[2]
        and p[1] < q[3] and q[1] < p[3]
    ]  # fmt: skip


def test_the_names_written_on_the_map_of_heads_do_not_overlap_when_presented() -> None:
    """72 heads in a cloud with a few outliers (MiniLM's map looked so): the names written
    are apart in presentation mode's font, on the map's own scale."""
    rng = np.random.default_rng(1)
    xy = np.concatenate([rng.normal(0, 0.3, size=(68, 2)), [[3, 0], [0, 3], [-3, 0], [0, -3]]])
    names = [f"L{i // 12}H{i % 12}" for i in range(72)]
    coords = pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1], "layer": 0}, index=names)
    fig = _presented(plots.head_map_figure(coords))
    layout = fig.layout.to_plotly_json()
    m = layout["margin"]
    width, height = 880 - m["l"] - m["r"] - 100, layout["height"] - m["t"] - m["b"]  # the bar
    span = xy.max(axis=0) - xy.min(axis=0)
    scale = min(width / (1.1 * span[0]), height / (1.1 * span[1]))  # one scale (scaleanchor)
    size = layout["font"]["size"]
    boxes = []
    for (x, y), text in zip(xy, fig.data[0].text, strict=True):
        if text:
            w = len(text) * 0.62 * size
            boxes.append((text, (x * scale - w / 2, y * scale + 5, x * scale + w / 2,
                                 y * scale + 5 + size)))  # fmt: skip
    assert len(boxes) >= 8  # the outliers and some of the cloud are named
    assert not _overlapping(boxes)


def test_labels_written_on_a_figure_reach_the_presentation_font() -> None:
    coords = pd.DataFrame({"x": [0.0, 1.0], "y": [0.0, 1.0], "layer": 0}, index=["L0H0", "L0H1"])
    fig = plots.head_map_figure(coords)
    assert fig.data[0].textfont.size < PRESENTATION_FONT  # its own size: 12
    assert plots.enlarge_fonts(fig).data[0].textfont.size == PRESENTATION_FONT

"""The Circuits page: the top edges drawn across layers (placed as the Information flow graph
places its nodes: the embeddings at the bottom, the residual rising through the layers), and the
faithfulness curve with the chosen circuit size marked."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.circuits import FaithfulnessCurve
from mhsa.heads import parse_head_label
from mhsa.plots.alt import plain, set_alt
from mhsa.plots.common import (
    PAGE_PX,
    apply_layout,
    boxes_overlap,
    label,
    signed_color,
    signed_scale,
    text_box,
)
from mhsa.plots.sizing import PRESENTATION_FONT

__all__ = [
    "circuit_figure",
    "circuit_node_xy",
    "faithfulness_figure",
    "k_composition_figure",
    "k_support_figure",
    "node_label_positions",
]

#: where a head's q, k and v inputs meet it, left to right
_INPUT_DX = {"q": -0.18, "k": 0.0, "v": 0.18, "": 0.0}


def circuit_node_xy(node: str, layers: int, heads: int) -> tuple[float, float]:
    """A node's place: heads across (x), levels up (y): ``input`` at 0, layer l's heads at
    2l + 1, its MLP at 2l + 2 (right of the heads), ``logits`` at the top."""
    middle = (heads - 1) / 2
    if node == "input":
        return middle, 0.0
    if node == "logits":
        return middle, 2.0 * layers + 1
    if node.startswith("M"):
        return heads - 0.2, 2.0 * int(node[1:]) + 2
    layer, head = parse_head_label(node)
    return float(head), 2.0 * layer + 1


#: the width of the circuit's plot area, of a figure spanning the page (px, about: the page's
#: main column less the level names on the left)
_PLOT_PX = PAGE_PX - 160


def node_label_positions(nodes: Sequence[str], heads: int) -> list[str]:
    """Each node's ``textposition``: above it, or, where a row of head names in the largest
    font a figure gets (``PRESENTATION_FONT``) would be wider than the room between two heads,
    every other head's name below it (else neighbours such as L5H10 and L5H11 overlap)."""
    room = _PLOT_PX / (heads + 1.2)  # the x axis spans heads + 1.2 units
    widest = max((len(n) for n in nodes if n[:1] == "L"), default=0)
    left, _, right, _ = text_box(0.0, 0.0, "x" * widest, PRESENTATION_FONT)
    crowded = right - left + 4 > room
    return [
        "bottom center" if crowded and n[:1] == "L" and parse_head_label(n)[1] % 2 else "top center"
        for n in nodes
    ]


def _height(layers: int) -> int:
    """The figure's height (px)."""
    return min(1000, 200 + 60 * (2 * layers + 2))


def _name_boxes(
    nodes: Sequence[str], texts: Sequence[str], places: Sequence[str], layers: int, heads: int
) -> list[tuple[float, float, float, float]]:
    """Each node's written name's box (px, y up) in presentation's font (``text_box``)."""
    sx, sy = _PLOT_PX / (heads + 1.2), (_height(layers) - 160) / (2 * layers + 2)
    out = []
    for node, text, place in zip(nodes, texts, places, strict=True):
        x, y = circuit_node_xy(node, layers, heads)
        out.append(text_box(x * sx, y * sy, text, PRESENTATION_FONT, place))
    return out


def _letter_at(
    start: tuple[float, float],
    end: tuple[float, float],
    letter: str,
    names: list[tuple[float, float, float, float]],
    layers: int,
    heads: int,
) -> tuple[float, float]:
    """Where on the edge ``start -> end`` its q/k/v letter goes: 70% of the way, or the place
    nearest it whose letter (in presentation's font, right of its point) covers no node's
    name (a short edge ends beside the names of its target's row)."""
    sx, sy = _PLOT_PX / (heads + 1.2), (_height(layers) - 160) / (2 * layers + 2)
    for t in (0.7, 0.6, 0.8, 0.5, 0.4, 0.9, 0.3, 0.2):
        x, y = start[0] + t * (end[0] - start[0]), start[1] + t * (end[1] - start[1])
        box = text_box(x * sx, y * sy, letter, PRESENTATION_FONT, "middle right")
        grown = (box[0] - 3, box[1] - 3, box[2] + 3, box[3] + 3)
        if not any(boxes_overlap(grown, name) for name in names):
            return x, y
    return start[0] + 0.7 * (end[0] - start[0]), start[1] + 0.7 * (end[1] - start[1])


#: the figure's legend: the colour is the support, minus the score
SUPPORT_LEGEND = "blue: carries the clean answer, red: works against it"


def support_legend(metric: str | None = None) -> str:
    """What an edge's colour says, for the metric its scores are of: blue where corrupting the
    edge lowers ``metric`` (support = -score > 0), red where it raises it. The metric names
    the user's tokens: the figure's title escapes it for plotly."""
    if not metric:
        return f"colour: support = -score; {SUPPORT_LEGEND}"
    return (
        f"colour: support = -score; blue: corrupting the edge lowers {metric} (it "
        "carries the clean answer), red: raises it (it works against it)"
    )


def _color(support: float, bound: float) -> str:
    """Blue above 0, red below (the app's signed scale), paler near 0."""
    return signed_color(support, bound)


def circuit_figure(
    edges: pd.DataFrame,
    layers: int,
    heads: int,
    *,
    title: str | None = None,
    output: str = "logits",
    metric: str | None = None,
) -> go.Figure:
    """The edges (``source``, ``target``, ``input``, ``score``: the circuit's) drawn between the
    model's nodes: each a line coloured by how much it carries the clean answer, its
    **support** ``-score`` (width by |score|), ending at its target's q, k or v input, its
    midpoint labelled q/k/v. A score (EAP, EAP-IG, exact: the metric with the edge corrupted
    minus the clean run's) is below 0 for an edge whose corruption lowers the metric, one that
    carries the clean answer: drawn blue, red for one that works against it
    (``support_legend(metric)``, in the title, and a colour bar of the support beside the
    graph, so that the sign read off the figure is the one its legend explains). Clickable
    markers carry
    ``customdata``: nodes ``["node", name]``, edge midpoints ``["edge", source, target,
    input]``. ``output``: what the graph's ``logits`` node is called on the figure (an
    encoder's is the last hidden state the sentence embedding pools); its customdata keeps the
    graph's name."""
    fig = go.Figure()
    scores = edges["score"].to_numpy(float)
    bound = float(np.abs(scores).max()) if len(scores) else 1.0
    bound = bound or 1.0
    nodes = ["input"]
    for layer in range(layers):
        nodes += [f"L{layer}H{h}" for h in range(heads)] + [f"M{layer}"]
    nodes.append("logits")
    places = node_label_positions(nodes, heads)
    texts = [output if n == "logits" else n for n in nodes]
    names = _name_boxes(nodes, texts, places, layers, heads)
    mids_x, mids_y, mids_text, mids_data, mids_hover = [], [], [], [], []
    order = np.argsort(np.abs(scores), kind="stable")  # the strongest drawn last (on top)
    for i in order:
        row = edges.iloc[int(i)]
        x0, y0 = circuit_node_xy(row["source"], layers, heads)
        x1, y1 = circuit_node_xy(row["target"], layers, heads)
        x1 += _INPUT_DX[row["input"]]
        y1 -= 0.22 if row["input"] else 0.0
        fig.add_trace(
            go.Scatter(
                x=[x0, x1],
                y=[y0, y1],
                mode="lines",
                line={"width": 1 + 6 * abs(scores[i]) / bound, "color": _color(-scores[i], bound)},
                hoverinfo="skip",
                showlegend=False,
            )
        )
        x, y = _letter_at((x0, y0), (x1, y1), row["input"], names, layers, heads)
        mids_x.append(x)
        mids_y.append(y)
        mids_text.append(row["input"])
        mids_data.append(["edge", row["source"], row["target"], row["input"]])
        into = f"{row['target']} ({row['input']})" if row["input"] else row["target"]
        mids_hover.append(
            f"{row['source']} → {into}: support {-scores[i]:.4g} (score {scores[i]:.4g})"
            "<br>click: path-patch it"
        )
    fig.add_trace(
        go.Scatter(
            x=mids_x,
            y=mids_y,
            mode="markers+text",
            text=mids_text,
            textposition="middle right",
            marker={"size": 8, "color": "rgba(0,0,0,0.25)"},
            customdata=mids_data,
            hovertext=mids_hover,
            hovertemplate="%{hovertext}<extra></extra>",
            name="edges",
            showlegend=False,
        )
    )
    fig.add_trace(  # the colour bar: the support each colour stands for
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            marker={
                "color": [0.0],
                **signed_scale([bound], axis=True),
                "showscale": True,
                "colorbar": {"title": {"text": "support<br>(-score)"}},
            },
            hoverinfo="skip",
            showlegend=False,
            name="support",
        )
    )
    xy = [circuit_node_xy(n, layers, heads) for n in nodes]
    used = set(edges["source"]) | set(edges["target"])
    fig.add_trace(
        go.Scatter(
            x=[p[0] for p in xy],
            y=[p[1] for p in xy],
            mode="markers+text",
            text=texts,
            textposition=places,
            marker={
                "size": [13 if n in used else 8 for n in nodes],
                "color": ["#ff8700" if n.startswith("M") else "#004280" for n in nodes],
                "opacity": [1.0 if n in used else 0.3 for n in nodes],
                "symbol": ["square" if n.startswith("M") else "circle" for n in nodes],
            },
            customdata=[["node", n] for n in nodes],
            hovertemplate="%{text}<br>a head: click to open it on Heads<extra></extra>",
            name="nodes",
            showlegend=False,
        )
    )
    levels = [0, *range(1, 2 * layers + 2)]
    names = ["input", *(f"L{i // 2} {'heads' if i % 2 == 0 else 'MLP'}" for i in range(2 * layers))]
    fig.update_layout(
        xaxis={"visible": False, "range": [-0.8, heads + 0.4]},
        yaxis={
            "tickmode": "array",
            "tickvals": levels,
            "ticktext": [*names, output],
            "showgrid": True,
            "zeroline": False,
        },
    )
    shown = title or f"Circuit: the top {len(edges)} edges ({support_legend(metric)})"
    apply_layout(fig, shown, height=_height(layers))
    if not len(scores):
        return set_alt(fig, f"{plain(shown)}: no edge to draw.")
    top = edges.iloc[int(np.argmax(np.abs(scores)))]
    into = f" ({top['input']})" if top["input"] else ""
    helping = int((scores < 0).sum())
    return set_alt(
        fig,
        f"{plain(shown)}: {len(scores)} edges, {helping} of them carrying the clean answer "
        f"(support above 0); the strongest, {top['source']} → {top['target']}{into}, has score "
        f"{float(top['score']):.3g}.",
    )


def faithfulness_figure(curve: FaithfulnessCurve, chosen: int | None = None) -> go.Figure:
    """Faithfulness f of the top-n edges against n as a share of all edges (log scale), at
    MIB's sizes, with the chosen n marked."""
    points = curve.points
    mib = points[points["mib"]]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=mib["fraction"],
            y=mib["faithfulness"],
            mode="lines+markers",
            name="MIB sizes",
            customdata=mib["edges"],
            hovertemplate="%{customdata} edges (%{x:.1%}): f = %{y:.3f}<extra></extra>",
        )
    )
    marked = points[~points["mib"] & (points["edges"] == chosen)]
    if chosen is not None and len(marked):
        x = max(float(marked["fraction"].iloc[0]), 1e-3)
        fig.add_vline(x=x, line={"dash": "dot", "color": "#ff2b2b"})
        fig.add_trace(
            go.Scatter(
                x=[x],
                y=marked["faithfulness"].iloc[:1],
                mode="markers",
                marker={"size": 14, "symbol": "star", "color": "#ff2b2b"},
                name=f"top {chosen}",
                hovertemplate=f"top {chosen} edges: f = %{{y:.3f}}<extra></extra>",
            )
        )
    fig.add_hline(y=1, line={"dash": "dash", "color": "#83c9ff"})
    fig.update_xaxes(type="log", title="share of all edges in the circuit (log)", tickformat=".1%")
    fig.update_yaxes(title="faithfulness f")
    title = f"Faithfulness of the top-n edges (CPR {curve.cpr:.3f}, CMD {curve.cmd:.3f})"
    return apply_layout(fig, title, height=380)


def k_support_figure(
    steps: Sequence[int],
    edges: Sequence[str],
    supports: Sequence[float],
    *,
    total_steps: int | None = None,
    phase_change_step: int | None = None,
) -> go.Figure:
    """At each training snapshot, the K-composition edge that carries the right answer most
    (``mhsa.training.circuit_probe.strongest_k_edges``) and its support (minus its EAP score on
    a fixed probe pair: above 0 when corrupting the edge lowers the right answer's logit), each
    point named by its edge: the induction circuit forming as a curve that rises."""
    fig = go.Figure(
        go.Scatter(
            x=list(steps),
            y=list(supports),
            mode="lines+markers",
            customdata=[[label(e)] for e in edges],
            name="strongest K edge",
            hovertemplate="step %{x}: %{customdata[0]} (k), support %{y:.4g}<extra></extra>",
        )
    )
    _k_axes(fig, total_steps, phase_change_step)
    fig.update_yaxes(title="support of the right answer (− EAP score)")
    last = f"; now {label(edges[-1])} (k)" if edges else ""
    return apply_layout(fig, f"The strongest K-composition edge over the steps{last}", height=340)


def _k_axes(fig: go.Figure, total_steps: int | None, phase_change_step: int | None) -> None:
    """The zero line, the phase change and the steps' axis of a K-composition curve."""
    fig.add_hline(y=0, line={"color": "#83c9ff"})
    if phase_change_step is not None:
        fig.add_vline(
            x=phase_change_step,
            line={"color": "#ff2b2b", "dash": "dash", "width": 2},
            annotation={"text": f"phase change, step {phase_change_step}"},
            annotation_position="top left",
        )
    if total_steps:
        fig.update_xaxes(range=[0, total_steps])
    fig.update_xaxes(title="step")


def k_composition_figure(
    sender: str,
    receiver: str,
    steps: Sequence[int],
    scores: Sequence[float],
    *,
    total_steps: int | None = None,
    phase_change_step: int | None = None,
) -> go.Figure:
    """The score of the K-composition edge ``sender -> receiver (k)`` at each training snapshot
    (edge attribution patching on a fixed probe pair): the induction circuit forming. Below 0:
    corrupting the edge lowers the right answer's logit, so the edge carries it."""
    fig = go.Figure(
        go.Scatter(
            x=list(steps),
            y=list(scores),
            mode="lines+markers",
            name=f"{sender} → {receiver} (k)",
            hovertemplate="step %{x}: %{y:.4g}<extra></extra>",
        )
    )
    _k_axes(fig, total_steps, phase_change_step)
    fig.update_yaxes(title="EAP score (logit difference)")
    title = f"The K-composition edge {sender} → {receiver} (k) over the steps"
    return apply_layout(fig, title, height=340)

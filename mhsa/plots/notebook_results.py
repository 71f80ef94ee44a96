"""Patching, circuit and atlas results in a notebook: each its table (pandas ``to_html``, text
escaped) and a small figure drawn as inline SVG, so that a cell holds a few kilobytes and no
script: nothing is requested from the network and no plotting library travels with a cell.

- a patching table (``patch_heads``, ``attribution_patching``; ``patch_positions``): a heatmap
  of layers x heads (heads x positions), the app's diverging colours centred at 0;
- scored circuit edges (``edge_attribution``, ``top_edges``): the edges between the model's
  nodes, width by |score|, coloured by support ``-score`` as the app's Circuits page
  (``mhsa.plots.circuits.circuit_figure``); a ``CircuitGraph``: its edges, unscored;
- a ``PatchingAgreement``: exact against estimated effect, one point per head, and y = x;
- a ``PathPatch``: the edge's metric, clean / patched / corrupted;
- an ``Atlas``: a heatmap of one of its per-head scores beside its table; an ``AtlasParts``
  (an encoder-decoder's): one such map and table per part (encoder, decoder);
- a ``FaithfulnessCurve``: faithfulness against the number of edges kept (log scale), MIB's
  sizes joined by a line.

``PatchGrid`` has no view: it holds the sizes patching runs over, no values.

The figures sit on a light card of their own (their colours read the same in a dark notebook).
``show`` draws any of these, an ``AttentionResult`` or a plain table: ``mhsa.show(value)``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from mhsa.engine.result import AttentionResult, NotebookView
from mhsa.heads import parse_head_label, parse_layer_head_label
from mhsa.plots.circuits import SUPPORT_LEGEND, circuit_node_xy
from mhsa.plots.common import signed_color

if TYPE_CHECKING:
    from mhsa.atlas.reader import Atlas, AtlasParts
    from mhsa.causal.patching import PatchingAgreement
    from mhsa.circuits.discovery import FaithfulnessCurve, PathPatch
    from mhsa.circuits.graph import CircuitGraph

__all__ = [
    "MAX_DRAWN_EDGES",
    "MAX_GRAPH_EDGES",
    "agreement_html",
    "atlas_html",
    "atlas_parts_html",
    "edges_html",
    "faithfulness_html",
    "graph_html",
    "patching_html",
    "path_patch_html",
    "show",
]

#: at most this many edges are drawn (the strongest |score|); the table lists every row given
MAX_DRAWN_EDGES = 60
#: a graph with at most this many edges is drawn whole (toy:induction: 110)
MAX_GRAPH_EDGES = 200
_CARD = (
    "background:#ffffff;color:#1f2328;padding:8px;border-radius:6px;"
    "font:12px/1.4 system-ui,sans-serif;display:inline-block"
)
_PATCH_LEGEND = (
    "blue: effect > 0, patching the head in moves the metric toward the clean run (1: all "
    "the way); red: effect < 0, away from it"
)
_SCORE_LEGEND = "blue: value > 0, red: value < 0"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _card(title: str, figure: str, legend: str, table: str = "") -> str:
    """One result: a bold title, the figure and its legend on a light card, then the table."""
    return (
        f'<div class="mhsa-result"><p><b>{_e(title)}</b></p>'
        f'<div style="{_CARD}">{figure}<div class="mhsa-legend">{_e(legend)}</div></div>'
        f"{table}</div>"
    )


def _table(frame: pd.DataFrame) -> str:
    return frame.round(4).to_html(border=0, escape=True)


def _bound(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def heatmap_svg(
    values: np.ndarray,
    rows: Sequence[str],
    columns: Sequence[str],
    cell_names: Sequence[Sequence[str]],
) -> str:
    """A ``[rows, columns]`` map of signed values, blue above 0 and red below (``signed_color``
    with the largest |value| as bound), each cell a ``<rect>`` with its name and value
    (``data-name``, ``data-value``, a ``<title>`` tooltip), white-ish at 0."""
    cell, left, top = 26, 8 + 7 * max((len(r) for r in rows), default=1), 18
    bound = _bound(values)
    width, height = left + cell * len(columns) + 4, top + cell * len(rows) + 4
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for j, name in enumerate(columns):
        x = left + cell * j + cell / 2
        parts.append(f'<text x="{x}" y="12" text-anchor="middle" font-size="10">{_e(name)}</text>')
    for i, name in enumerate(rows):
        y = top + cell * i
        parts.append(
            f'<text x="{left - 4}" y="{y + cell / 2 + 4}" text-anchor="end" '
            f'font-size="10">{_e(name)}</text>'
        )
        for j in range(len(columns)):
            v = float(values[i, j])
            fill = signed_color(v, bound) if np.isfinite(v) else "rgb(220,220,220)"
            label = cell_names[i][j]
            parts.append(
                f'<rect class="mhsa-cell" x="{left + cell * j}" y="{y}" width="{cell - 1}" '
                f'height="{cell - 1}" fill="{fill}" data-name="{_e(label)}" '
                f'data-value="{v!r}"><title>{_e(label)}: {_fmt(v)}</title></rect>'
            )
    parts.append("</svg>")
    return "".join(parts)


def _value_column(frame: pd.DataFrame) -> str:
    for name in ("effect", "effect_attribution", "score"):
        if name in frame.columns:
            return name
    raise ValueError(f"a patching table has an effect column; this one has {list(frame.columns)}")


def patching_html(frame: pd.DataFrame) -> str:
    """A patching table (``patch_heads``, ``attribution_patching``: a row per head with
    ``layer``, ``head`` and ``effect``; ``patch_positions``: a row per head and position) as
    a heatmap beside the table."""
    column = _value_column(frame)
    if "position" in frame.columns:
        positions = sorted(set(frame["position"]))
        heads = sorted(set(frame["head"]))
        tokens = dict(zip(frame["position"], frame.get("token", frame["position"]), strict=False))
        grid = frame.pivot_table(index="head", columns="position", values=column, sort=True)
        layer = int(frame["layer"].iloc[0])
        rows, cols = [f"H{h}" for h in heads], [str(tokens[p]) for p in positions]
        names = [[f"L{layer}H{h} at {p} ({tokens[p]})" for p in positions] for h in heads]
    else:
        grid = frame.pivot_table(index="layer", columns="head", values=column, sort=True)
        rows = [f"L{li}" for li in grid.index]
        cols = [f"H{h}" for h in grid.columns]
        names = [[f"L{li}H{h}" for h in grid.columns] for li in grid.index]
    figure = heatmap_svg(grid.to_numpy(float), rows, cols, names)
    metric = frame.attrs.get("metric", "")
    title = f"Activation patching: {column}" + (f" of {metric}" if metric else "")
    return _card(title, figure, _PATCH_LEGEND, _table(frame))


def _node_names(names: Sequence[str]) -> tuple[int, int]:
    """The layers and heads the node names reach (``L2H3``, ``M4``)."""
    layers, heads = 1, 1
    for name in names:
        if name.startswith("M") and name[1:].isdigit():
            layers = max(layers, int(name[1:]) + 1)
        elif name not in ("input", "logits"):
            layer, head = parse_head_label(name)
            layers, heads = max(layers, layer + 1), max(heads, head + 1)
    return layers, heads


def circuit_svg(edges: pd.DataFrame, layers: int, heads: int) -> str:
    """Edges (``source``, ``target``, ``input``, and ``score`` where scored) between the
    model's nodes placed as the app's circuit figure (``circuit_node_xy``): each a ``<line>``
    of width ``1 + 5 |score| / max |score|``, coloured by its support ``-score``
    (``SUPPORT_LEGEND``), grey when unscored; every node that an edge touches, labelled."""
    sx, sy, pad = 56, 34, 30
    height = pad * 2 + sy * (2 * layers + 1)
    width = pad * 2 + sx * max(heads, 2)

    def xy(node: str, into: str = "") -> tuple[float, float]:
        x, y = circuit_node_xy(node, layers, heads)
        dx = {"q": -0.18, "k": 0.0, "v": 0.18}.get(into, 0.0)
        return pad + sx * (x + dx), height - pad - sy * (y - (0.22 if into else 0.0))

    scored = "score" in edges.columns
    scores = edges["score"].to_numpy(float) if scored else np.zeros(len(edges))
    bound = _bound(scores)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for i in np.argsort(np.abs(scores), kind="stable"):  # the strongest drawn last
        row = edges.iloc[int(i)]
        (x0, y0), (x1, y1) = xy(row["source"]), xy(row["target"], row["input"])
        s = float(scores[i])
        colour = signed_color(-s, bound) if scored else "rgb(140,140,140)"
        into = f"{row['target']} ({row['input']})" if row["input"] else row["target"]
        tip = f"{row['source']} → {into}" + (f": score {_fmt(s)}" if scored else "")
        parts.append(
            f'<line class="mhsa-edge" x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" '
            f'stroke="{colour}" stroke-width="{1 + 5 * abs(s) / bound:.2f}" '
            f'data-score="{s!r}"><title>{_e(tip)}</title></line>'
        )
    nodes = dict.fromkeys([*edges["source"], *edges["target"]])
    for node in nodes:
        x, y = xy(node)
        parts.append(
            f'<circle class="mhsa-node" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#1f2328" '
            f'data-name="{_e(node)}"/><text x="{x + 6:.1f}" y="{y - 5:.1f}" '
            f'font-size="10">{_e(node)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def edges_html(edges: pd.DataFrame, *, top: int = MAX_DRAWN_EDGES) -> str:
    """Scored circuit edges (``edge_attribution``, ``top_edges``): the ``top`` strongest
    |score| drawn (``circuit_svg``), every row in the table."""
    drawn = edges.loc[edges["score"].abs().sort_values(ascending=False, kind="stable").index]
    drawn = drawn.head(top)
    layers = edges.attrs.get("layers")
    heads = edges.attrs.get("heads")
    if not layers or not heads:
        layers, heads = _node_names([*edges["source"], *edges["target"]])
    shown = f"the {len(drawn)} strongest of {len(edges)}" if len(drawn) < len(edges) else "all"
    title = f"Circuit edges ({shown} drawn)"
    figure = circuit_svg(drawn, int(layers), int(heads))
    return _card(title, figure, f"width: |score|; {SUPPORT_LEGEND}", _table(edges))


def graph_html(graph: CircuitGraph) -> str:
    """A circuit graph (no scores): its size, and its edges drawn when there are at most
    ``MAX_GRAPH_EDGES``."""
    facts = pd.DataFrame(
        {
            "layers": [graph.layers],
            "heads": [graph.heads],
            "sources": [len(graph.sources)],
            "targets": [len(graph.targets)],
            "edges": [graph.n_edges],
        }
    )
    title = f"Circuit graph: {graph.n_edges} edges"
    if graph.n_edges > MAX_GRAPH_EDGES:
        legend = f"{graph.n_edges} edges are too many to draw: score them (edge_attribution)"
        return _card(title, "", legend, _table(facts))
    figure = circuit_svg(graph.edges(), graph.layers, graph.heads)
    return _card(title, figure, "every edge, unscored", _table(facts))


def scatter_svg(x: np.ndarray, y: np.ndarray, names: Sequence[str]) -> str:
    """Points ``(x, y)`` named ``names`` on equal axes through 0, with the line y = x."""
    size, pad = 240, 36
    lo = float(min(0.0, *x, *y)) if len(x) else 0.0
    hi = float(max(0.0, *x, *y)) if len(x) else 1.0
    span = (hi - lo) or 1.0
    lo, hi = lo - 0.08 * span, hi + 0.08 * span

    def px(v: float) -> float:
        return pad + (v - lo) / (hi - lo) * size

    def py(v: float) -> float:
        return pad + size - (v - lo) / (hi - lo) * size

    end = pad * 2 + size
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{end}" height="{end}">',
        f'<rect x="{pad}" y="{pad}" width="{size}" height="{size}" fill="none" stroke="#8c959f"/>',
        f'<line x1="{px(lo):.1f}" y1="{py(lo):.1f}" x2="{px(hi):.1f}" y2="{py(hi):.1f}" '
        'stroke="#8c959f" stroke-dasharray="4 3"/>',
        f'<text x="{pad + size / 2}" y="{end - 6}" text-anchor="middle" font-size="10">'
        "exact patching (effect)</text>",
        f'<text x="10" y="{pad + size / 2}" font-size="10" text-anchor="middle" '
        f'transform="rotate(-90 10 {pad + size / 2})">attribution patching (estimate)</text>',
    ]
    for v in (lo, hi):
        parts.append(f'<text x="{px(v):.1f}" y="{pad + size + 12}" font-size="9">{v:.2f}</text>')
    for a, b, name in zip(x, y, names, strict=True):
        parts.append(
            f'<circle class="mhsa-point" cx="{px(a):.1f}" cy="{py(b):.1f}" r="4" '
            f'fill="{signed_color(float(a), 1.0)}" stroke="#1f2328" data-name="{_e(name)}" '
            f'data-x="{float(a)!r}" data-y="{float(b)!r}"><title>{_e(name)}: exact '
            f"{_fmt(a)}, estimated {_fmt(b)}</title></circle>"
            f'<text x="{px(a) + 6:.1f}" y="{py(b) - 5:.1f}" font-size="10">{_e(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def agreement_html(agreement: PatchingAgreement) -> str:
    """Exact patching against attribution patching, for the heads that matter: a scatter
    (y = x where they agree) beside their table and the summary."""
    frame = pd.DataFrame(
        {"exact": agreement.exact, "estimated": agreement.estimated},
        index=pd.Index(agreement.heads, name="head", dtype=object),
    )
    figure = scatter_svg(np.asarray(agreement.exact), np.asarray(agreement.estimated), frame.index)
    legend = f"dashed: y = x. Pearson's r over every head: {agreement.pearson:.3f}"
    return _card(agreement.summary(), figure, legend, _table(frame))


def path_patch_html(patch: PathPatch) -> str:
    """One path-patched edge: the metric of the clean, patched and corrupted runs as bars
    from 0, and the numbers."""
    into = f"{patch.receiver} ({patch.input})" if patch.input else patch.receiver
    values = {"clean": patch.clean, "patched": patch.patched, "corrupted": patch.corrupted}
    frame = pd.DataFrame(
        {"metric": list(values.values())}, index=pd.Index(list(values), dtype=object)
    )
    frame.loc["score (patched - clean)", "metric"] = patch.score
    frame.loc["effect (share of the change)", "metric"] = patch.effect
    bound, width, zero = _bound(np.array(list(values.values()))), 120, 200
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{zero + width + 60}" height="70">']
    for i, (name, v) in enumerate(values.items()):
        length = width * abs(v) / bound
        x = zero if v >= 0 else zero - length
        parts.append(
            f'<text x="{zero - width - 8}" y="{14 + 20 * i}" font-size="10">{name}</text>'
            f'<rect class="mhsa-bar" x="{x:.1f}" y="{4 + 20 * i}" width="{length:.1f}" '
            f'height="14" fill="{signed_color(v, bound)}" data-value="{v!r}"/>'
        )
    parts.append(f'<line x1="{zero}" y1="0" x2="{zero}" y2="64" stroke="#8c959f"/></svg>')
    title = f"Path patching {patch.sender} → {into}: effect {patch.effect:.3f}"
    return _card(title, "".join(parts), _SCORE_LEGEND, _table(frame))


def _atlas_map(frame: pd.DataFrame, column: str) -> str:
    """``column`` of an atlas's ``heads()`` table as a heatmap: a row per layer (``L0``; an
    encoder-decoder's part: ``E0``, ``D0``), a column per head."""
    parsed = [parse_layer_head_label(str(label)) for label in frame.index]
    rows = sorted({name for name, _ in parsed}, key=lambda name: (name[0], int(name[1:])))
    heads = sorted({h for _, h in parsed})
    grid = np.full((len(rows), len(heads)), np.nan)
    for (name, h), v in zip(parsed, frame[column], strict=True):
        grid[rows.index(name), heads.index(h)] = v
    names = [[f"{name}H{h}" for h in heads] for name in rows]
    return heatmap_svg(grid, rows, [f"H{h}" for h in heads], names)


def _atlas_column(frame: pd.DataFrame, column: str | None) -> str:
    """The score to map: ``column``, else the induction score, else the first column."""
    return column or next((c for c in frame.columns if "induction" in c), frame.columns[0])


def atlas_html(atlas: Atlas, column: str | None = None) -> str:
    """An atlas: a heatmap of one per-head score (``column`` of ``heads()``; the induction
    score by default, else the first) over layers x heads, and every head's scores."""
    frame = atlas.heads()
    column = _atlas_column(frame, column)
    plan = atlas.manifest["plan"]
    title = (
        f"Atlas of {atlas.model}: {len(frame)} heads over {atlas.tokens:,} tokens of "
        f"{plan['texts']:,} texts; the map: {column}"
    )
    return _card(title, _atlas_map(frame, column), _SCORE_LEGEND, _table(frame))


def atlas_parts_html(atlas: AtlasParts, column: str | None = None) -> str:
    """An encoder-decoder's atlas: for each part (the encoder's self-attention, heads
    ``E{layer}H{head}``; the decoder's, ``D{layer}H{head}``, over the teacher-forced target)
    its map of one per-head score (as ``atlas_html``) and its heads' table: the parts read
    different tokens, so each has its own count."""
    cards = []
    for name, part in atlas.parts.items():
        frame = part.heads()
        shown = _atlas_column(frame, column)
        title = (
            f"{name} self-attention: {len(frame)} heads over {part.tokens:,} tokens; the "
            f"map: {shown}"
        )
        cards.append(_card(title, _atlas_map(frame, shown), _SCORE_LEGEND, _table(frame)))
    plan = atlas.manifest["plan"]
    title = (
        f"Atlas of {atlas.model} (an encoder-decoder): {len(atlas.labels)} heads in "
        f"{len(atlas.parts)} parts over {plan['texts']:,} texts"
    )
    return f'<div class="mhsa-result"><p><b>{_e(title)}</b></p>{"".join(cards)}</div>'


def line_chart_svg(x: np.ndarray, y: np.ndarray, names: Sequence[str], extra: np.ndarray) -> str:
    """Faithfulness ``y`` against the share of edges ``x`` (log scale, 0.1 % to 100 %): the
    points joined in order (``<polyline>``), each a ``<circle class="mhsa-point">`` named and
    holding its numbers; points where ``extra`` is true are marked apart (``mhsa-extra``),
    unjoined. Dashed guides at f = 0 and f = 1 (``mhsa-guide``, ``data-value``)."""
    width, height, left, top = 320, 200, 44, 14
    lo_x, hi_x = -3.0, 0.0
    lo_y = float(min(0.0, *y)) if len(y) else 0.0
    hi_y = float(max(1.0, *y)) if len(y) else 1.0
    pad = 0.05 * (hi_y - lo_y)
    lo_y, hi_y = lo_y - pad, hi_y + pad

    def px(share: float) -> float:
        v = np.log10(min(max(share, 10**lo_x), 10**hi_x))
        return left + (v - lo_x) / (hi_x - lo_x) * width

    def py(v: float) -> float:
        return top + height - (v - lo_y) / (hi_y - lo_y) * height

    end_x, end_y = left + width + 12, top + height + 36
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{end_x}" height="{end_y}">',
        f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" '
        'stroke="#8c959f"/>',
    ]
    for share, label in ((0.001, "0.1%"), (0.01, "1%"), (0.1, "10%"), (1.0, "100%")):
        parts.append(
            f'<text x="{px(share):.1f}" y="{top + height + 12}" text-anchor="middle" '
            f'font-size="9">{label}</text>'
        )
    for v in (0.0, 1.0):
        parts.append(
            f'<line class="mhsa-guide" x1="{left}" y1="{py(v):.2f}" x2="{left + width}" '
            f'y2="{py(v):.2f}" stroke="#8c959f" stroke-dasharray="4 3" data-value="{v!r}"/>'
            f'<text x="{left - 4}" y="{py(v) + 3:.1f}" text-anchor="end" font-size="9">'
            f"{v:g}</text>"
        )
    parts.append(
        f'<text x="{left + width / 2}" y="{end_y - 6}" text-anchor="middle" font-size="10">'
        "edges kept, as a share of all edges (log)</text>"
        f'<text x="10" y="{top + height / 2}" font-size="10" text-anchor="middle" '
        f'transform="rotate(-90 10 {top + height / 2})">faithfulness f</text>'
    )
    joined = [i for i in range(len(x)) if not extra[i]]
    path = " ".join(f"{px(float(x[i])):.2f},{py(float(y[i])):.2f}" for i in joined)
    parts.append(f'<polyline points="{path}" fill="none" stroke="#1c83e1" stroke-width="1.5"/>')
    for i in range(len(x)):
        cls, fill = ("mhsa-extra", "#ff2b2b") if extra[i] else ("mhsa-point", "#1c83e1")
        parts.append(
            f'<circle class="{cls}" cx="{px(float(x[i])):.2f}" cy="{py(float(y[i])):.2f}" '
            f'r="{5 if extra[i] else 3.5}" fill="{fill}" data-name="{_e(names[i])}" '
            f'data-x="{float(x[i])!r}" data-y="{float(y[i])!r}"><title>{_e(names[i])}: f = '
            f"{_fmt(float(y[i]))}</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


def faithfulness_html(curve: FaithfulnessCurve) -> str:
    """A faithfulness curve (``faithfulness_curve``): f of the top-n edges against n as a
    share of all edges, log scale (as the app's ``faithfulness_figure``): MIB's sizes joined,
    the extra n asked for marked in red; its table of points."""
    points = curve.points
    names = [
        f"top {n} of {curve.total} edges ({share:.1%})"
        for n, share in zip(points["edges"], points["fraction"], strict=True)
    ]
    figure = line_chart_svg(
        points["fraction"].to_numpy(float),
        points["faithfulness"].to_numpy(float),
        names,
        ~points["mib"].to_numpy(bool),
    )
    title = (
        f"Faithfulness of the top-n edges: CPR {curve.cpr:.3f} (higher is better), "
        f"CMD {curve.cmd:.3f} (lower is better)"
    )
    legend = (
        f"f = (m_circuit - m_corrupted) / (m_clean - m_corrupted), m_clean {_fmt(curve.clean)}, "
        f"m_corrupted {_fmt(curve.corrupted)}; dashed: f = 0 and f = 1; blue: MIB's sizes, "
        "red: the other sizes asked for"
    )
    return _card(title, figure, legend, _table(points))


def _kind_of_table(frame: pd.DataFrame) -> str:
    columns = set(frame.columns)
    if {"source", "target", "input", "score"} <= columns:
        return "edges"
    if {"layer", "head"} <= columns and columns & {"effect", "effect_attribution"}:
        return "patching"
    return "table"


def show(value: Any, **options: Any) -> NotebookView:
    """Any result as a notebook view: an ``AttentionResult`` (``result.show(**options)``), a
    patching table, a table of scored circuit edges, or anything with ``_repr_html_`` (a
    ``PatchingAgreement``, ``PathPatch``, ``CircuitGraph``, ``Atlas``, ``AtlasParts``,
    ``FaithfulnessCurve``); another table as
    itself (escaped).

    Raises:
        InputError: a result's view refused (see ``AttentionResult.show``).
        TypeError: a value with no view.
    """
    if isinstance(value, AttentionResult):
        return value.show(**options)
    if isinstance(value, pd.DataFrame):
        kind = _kind_of_table(value)
        if kind == "edges":
            return NotebookView(edges_html(value, **options))
        if kind == "patching":
            return NotebookView(patching_html(value))
        return NotebookView(_table(value))
    draw = getattr(value, "_repr_html_", None)
    if draw is None:
        raise TypeError(f"No notebook view of a {type(value).__name__}.")
    return NotebookView(draw())

"""The figures of heads explained by programs (``mhsa.explain``): a program's pattern beside the
head's own attention on one text, and a map of every head coloured by the kind of its program.

A program's kind is drawn in a qualitative colour (``palette.HEAD_COLORS``: distinct under the
three colour-vision deficiencies) and written in the cell as its short code with the score, so
that colour is never the only cue (WCAG 2.1 1.4.1)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.heads import parse_layer_head_label
from mhsa.plots.alt import describe_attention, plain, set_alt
from mhsa.plots.common import apply_layout, label, matrix_heatmap
from mhsa.plots.palette import HEAD_COLORS

__all__ = ["PROGRAM_KINDS", "explanation_map", "pattern_pair"]

#: each kind of program: its short code in a cell, and its colour (dark ones carry white text)
PROGRAM_KINDS: dict[str, tuple[str, str]] = {
    "positional": ("P", HEAD_COLORS[0]),
    "token": ("T", HEAD_COLORS[1]),
    "linguistic": ("L", HEAD_COLORS[2]),
    "combination": ("C", HEAD_COLORS[3]),
}
#: colours whose cells carry black text (light enough for 4.5:1 against black)
_LIGHT = {HEAD_COLORS[1], HEAD_COLORS[2]}


def pattern_pair(
    head: np.ndarray,
    pattern: np.ndarray,
    tokens: Sequence[str],
    *,
    head_title: str,
    program_title: str,
) -> tuple[go.Figure, go.Figure]:
    """The head's attention and the program's pattern on the same text, as two heatmaps on
    the 0-1 weight scale, for two columns side by side (tokens escaped by ``matrix_heatmap``)."""
    figures = []
    for matrix, title, value in (
        (head, head_title, "weight"),
        (pattern, program_title, "pattern"),
    ):
        figures.append(
            matrix_heatmap(
                np.asarray(matrix, dtype=np.float32),
                tokens,
                tokens,
                title=title,
                zmin=0.0,
                zmax=1.0,
                value_name=value,
                height=min(640, max(320, 14 * len(tokens) + 160)),
                columns=2,
            )
        )
        set_alt(figures[-1], describe_attention(matrix, list(tokens), what=plain(title)))
    return figures[0], figures[1]


def explanation_map(table: pd.DataFrame, *, score: str = "iou", title: str) -> go.Figure:
    """Every head (rows: layers, as ``L0`` or an encoder-decoder's ``E0``/``D0``; columns: heads)
    coloured by the kind of its program, each cell saying the kind's code and the score.

    Args:
        table: one row per head with ``head`` (its label), ``program``, ``kind`` (a key of
            ``PROGRAM_KINDS``), optionally ``mostly`` (the kind of the program's heaviest
            part: a combination is drawn in its colour, its code followed by "+") and the
            ``score`` column.
        score: the column written in each cell and shown on hover (``iou``: soft IoU).
        title: the figure's title.
    """
    parsed = [parse_layer_head_label(h) for h in table["head"]]
    layers = list(dict.fromkeys(name for name, _ in parsed))
    width = 1 + max(h for _, h in parsed)
    codes = list(PROGRAM_KINDS)
    z = np.full((len(layers), width), np.nan)
    xs, ys, texts, colours, hovers = [], [], [], [], []
    drawn: set[str] = set()  # the kinds of colour drawn, and whether a "+" is: the legend's
    combined = False
    for (name, h), (_, row) in zip(parsed, table.iterrows(), strict=True):
        kind = row["kind"] if row["kind"] in PROGRAM_KINDS else "combination"
        mostly = row.get("mostly", kind)
        mostly = mostly if mostly in PROGRAM_KINDS else kind
        code, colour = PROGRAM_KINDS[mostly]
        code += "+" if kind == "combination" and mostly != kind else ""
        r = layers.index(name)
        z[r, h] = codes.index(mostly)
        drawn.add(mostly)
        combined = combined or code.endswith("+")
        value = float(row[score])
        xs.append(h)
        ys.append(r)
        texts.append(f"{code} {value:.2f}" if np.isfinite(value) else code)
        colours.append("#000000" if colour in _LIGHT else "#ffffff")
        hovers.append(
            f"{label(row['head'])}: {label(str(row['program']), 60)}<br>{kind}, {score} {value:.3f}"
        )
    n = len(codes)
    scale = []
    for i, kind in enumerate(codes):  # one flat band per kind
        colour = PROGRAM_KINDS[kind][1]
        scale += [[i / n, colour], [(i + 1) / n, colour]]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(width)),
            y=list(range(len(layers))),
            zmin=-0.5,
            zmax=n - 0.5,
            colorscale=scale,
            showscale=False,
            hoverinfo="skip",
            xgap=2,
            ygap=2,
        )
    )
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="text",
            text=texts,
            textfont={"color": colours, "size": 12},
            hovertext=hovers,
            hovertemplate="%{hovertext}<extra></extra>",
            showlegend=False,
        )
    )
    for kind, (code, colour) in PROGRAM_KINDS.items():  # the legend: code, colour, name
        if kind not in drawn:
            continue
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                marker={"symbol": "square", "size": 12, "color": colour},
                name=f"{code}: {kind}",
            )
        )
    fig.update_xaxes(title="head", tickmode="array", tickvals=list(range(width)), showgrid=False)
    fig.update_yaxes(
        title="layer",
        tickmode="array",
        tickvals=list(range(len(layers))),
        ticktext=layers,
        autorange="reversed",
        showgrid=False,
    )
    if combined:  # a combination: its heaviest part's colour and code, and a "+"
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", marker={"opacity": 0}, name="+: combined"
            )
        )
    fig.update_layout(legend={"title": {"text": "kind"}})  # on the right, clear of the axes
    fig = apply_layout(fig, title, height=200 + 36 * len(layers))
    return set_alt(fig, _map_alt(table, score, title))


def _map_alt(table: pd.DataFrame, score: str, title: str) -> str:
    """The map in one sentence: how many heads each kind explains (by the heaviest part), and
    the best-explained head with its score."""
    mostly = table["mostly"] if "mostly" in table else table["kind"]
    counts = mostly.value_counts()
    kinds = ", ".join(f"{int(n)} {kind}" for kind, n in counts.items())
    values = pd.to_numeric(table[score], errors="coerce")
    if values.notna().any():
        best = table.loc[values.idxmax()]
        top = f"; the best explained is {best['head']}, {best['program']}"
        top += f" ({score} {values.max():.2f})"
    else:
        top = ""
    return f"{plain(title)}: {len(table)} heads by their program's main kind: {kinds}{top}."

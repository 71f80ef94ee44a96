"""The Head atlas page's figures: a head's histograms over the corpus (``mhsa.atlas``) and the
attention around one example."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.plots.common import apply_layout, label, matrix_heatmap

__all__ = ["atlas_histogram", "example_heatmap"]


def atlas_histogram(
    series: pd.Series, *, title: str, x_title: str, y_title: str, columns: int = 1
) -> go.Figure:
    """One of a head's histograms (``Atlas.summary``): bars of ``series`` over its index."""
    x = [label(str(v), 20) for v in series.index]
    fig = go.Figure(
        go.Bar(
            x=x,
            y=series.to_numpy(dtype=float),
            hovertemplate=f"{x_title} %{{x}}<br>{y_title} %{{y:.4g}}<extra></extra>",
            showlegend=False,
        )
    )
    fig.update_xaxes(title=x_title, type="category")
    fig.update_yaxes(title=y_title)
    return apply_layout(fig, title, height=300 if columns > 1 else 340)


def example_heatmap(
    weights: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    title: str,
    example: tuple[int, int] | None = None,
) -> go.Figure:
    """The head's attention around one example: its query's neighbours (rows) over its key's
    (columns), on the 0-1 weight scale. ``example``: the example's own (row, column) in the
    figure, outlined, its row's label marked "query ▶" and its column's "key ▼" (both always
    labelled, however the labels are thinned)."""
    fig = matrix_heatmap(
        weights, rows, cols, title=title, zmin=0.0, zmax=1.0, height=320, columns=2
    )
    if example is None:
        return fig
    r, c = example
    if not (0 <= r < len(rows) and 0 <= c < len(cols)):
        raise ValueError(f"example cell {example} is outside the {len(rows)}x{len(cols)} figure")
    heatmap = fig.data[0]
    for axis, names, i, mark in (
        ("yaxis", heatmap.y, r, "query ▶ "),
        ("xaxis", heatmap.x, c, "key ▼ "),
    ):
        layout = fig.layout[axis]
        shown = dict(zip(layout.tickvals, layout.ticktext, strict=True))
        shown[names[i]] = mark + label((rows if axis == "yaxis" else cols)[i], 20)
        order = [n for n in names if n in shown]
        layout.tickvals, layout.ticktext = order, [shown[n] for n in order]
    fig.add_shape(
        type="rect",
        xref="x",
        yref="y",
        x0=c - 0.5,
        x1=c + 0.5,
        y0=r - 0.5,
        y1=r + 0.5,
        line={"color": "#e66100", "width": 3},  # orange: apart from every blue of the scale
        fillcolor="rgba(0,0,0,0)",
        name="example",
    )
    return fig

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
    weights: np.ndarray, rows: Sequence[str], cols: Sequence[str], *, title: str
) -> go.Figure:
    """The head's attention around one example: its query's neighbours (rows) over its key's
    (columns), on the 0-1 weight scale."""
    return matrix_heatmap(
        weights, rows, cols, title=title, zmin=0.0, zmax=1.0, height=320, columns=2
    )

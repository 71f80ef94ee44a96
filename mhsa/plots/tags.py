"""The Head atlas page's part-of-speech figure: exBERT's histograms (Hoover et al. 2020) of the
tags of a set of examples' queries and keys (``mhsa.atlas.Atlas.tag_histogram``)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from mhsa.plots.common import COLORWAY, apply_layout, label

__all__ = ["tag_histogram_figure"]


def tag_histogram_figure(histogram: pd.DataFrame, *, title: str) -> go.Figure:
    """Bars of how many examples' queries and keys have each tag, side by side per tag.

    Args:
        histogram: ``Atlas.tag_histogram``'s frame (one row per tag, columns ``query`` and
            ``key``: counts).
        title: the figure's title (escaped by the layout).
    """
    tags = [label(str(t), 12) for t in histogram.index]
    fig = go.Figure()
    for column, name, colour in (("query", "query", COLORWAY[0]), ("key", "key", COLORWAY[1])):
        fig.add_trace(
            go.Bar(
                x=tags,
                y=histogram[column].to_numpy(dtype=float),
                name=name,
                marker_color=colour,
                hovertemplate=f"{name}s tagged %{{x}}: %{{y:d}}<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="group",
        legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"},
    )
    fig.update_xaxes(title="part of speech (Universal tagset)", type="category")
    fig.update_yaxes(title="examples")
    return apply_layout(fig, title, height=320)

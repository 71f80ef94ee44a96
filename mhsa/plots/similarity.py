"""The Head similarity page: the heads x heads matrix and the 2-D map of heads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.plots.alt import set_alt
from mhsa.plots.common import PAGE_PX, apply_layout, boxes_overlap, matrix_heatmap, text_box
from mhsa.plots.palette import LAYER_COLORSCALE
from mhsa.plots.sizing import PRESENTATION_FONT

__all__ = [
    "LABEL_ROOM",
    "MAP_PX",
    "head_map_figure",
    "map_scale",
    "similarity_figure",
    "spaced_labels",
]


def similarity_figure(similarity: pd.DataFrame, order: Sequence[str] | None = None) -> go.Figure:
    """Heads x heads matrix, optionally reordered (by cluster leaves)."""
    sim = similarity if order is None else similarity.loc[list(order), list(order)]
    metric = similarity.attrs.get("metric", "js")
    cosine = metric == "cosine"
    names = list(sim.index)
    return matrix_heatmap(
        sim.to_numpy(),
        names,
        names,
        title="Head similarity (cosine)"
        if cosine
        else "Head divergence (Jensen-Shannon, summed over query rows)",
        row_title="head",
        col_title="head",
        zmin=None,
        colorscale="Viridis" if cosine else "Viridis_r",
        value_name="cosine" if cosine else "JS",
        height=760,
    )


#: a head's name is written on the map only this far (a share of the map's larger side) from
#: every name already written; the crowded ones are named on hover
LABEL_ROOM = 0.06
#: the map's plot area (px, about: 620 px tall less its title and axis title, the page's width
#: less the colour bar), which converts its coordinates to the px its names take
MAP_PX = (PAGE_PX - 200, 500)


def map_scale(x: np.ndarray, y: np.ndarray) -> float:
    """Pixels per unit of the map (its axes share one scale: ``scaleanchor``), whose plot area
    is ``MAP_PX``: the tighter of the two sides."""
    span_x = float(np.ptp(x)) * 1.1 or 1.0  # plotly pads a range by about 5% each side
    span_y = float(np.ptp(y)) * 1.1 or 1.0
    return min(MAP_PX[0] / span_x, MAP_PX[1] / span_y)


def spaced_labels(
    x: np.ndarray, y: np.ndarray, names: list[str], *, size: float = PRESENTATION_FONT
) -> list[str]:
    """The names to write above the points ``(x, y)``, "" for a point whose name would cover
    one already written: the points farthest from the centre first (the outliers a class asks
    about), each only where its name's box in ``size`` px (``text_box``, on the map's scale,
    ``map_scale``; presentation mode's font by default, so that the names stay apart there)
    overlaps no name written before it and it lies ``LABEL_ROOM`` or more from each."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    span = max(float(np.ptp(x)), float(np.ptp(y))) or 1.0
    points = np.stack([x, y], axis=1) / span
    scale = map_scale(x, y)
    boxes = [text_box(a * scale, b * scale, n, size) for a, b, n in zip(x, y, names, strict=True)]
    order = np.argsort(-np.linalg.norm(points - points.mean(axis=0), axis=1), kind="stable")
    shown: list[int] = []
    for i in order:
        near = any(np.linalg.norm(points[i] - points[j]) < LABEL_ROOM for j in shown)
        if not near and not any(boxes_overlap(boxes[i], boxes[j]) for j in shown):
            shown.append(int(i))
    keep = set(shown)
    return [name if i in keep else "" for i, name in enumerate(names)]


def head_map_figure(
    coords: pd.DataFrame, *, color: pd.Series | None = None, roles: pd.Series | None = None
) -> go.Figure:
    """The 2-D map of heads; ``color`` defaults to the layer, ``roles`` shown on hover; the
    names of heads in a crowd are left to the hover (``spaced_labels``), so that the written
    ones stay readable."""
    colour = coords["layer"] if color is None else color.reindex(coords.index)
    hover_roles = roles.reindex(coords.index) if roles is not None else pd.Series("", coords.index)
    fig = go.Figure(
        go.Scatter(
            x=coords["x"],
            y=coords["y"],
            mode="markers+text",
            text=spaced_labels(coords["x"], coords["y"], [str(h) for h in coords.index]),
            textposition="top center",
            textfont={"size": 12},
            marker={
                "size": 11,
                "color": colour.to_numpy(),
                "colorscale": LAYER_COLORSCALE,
                "showscale": True,
                "colorbar": {"title": {"text": "layer" if color is None else "cluster"}},
            },
            customdata=np.stack([coords.index.to_numpy(), hover_roles.to_numpy()], axis=1),
            hovertemplate="%{customdata[0]}: %{customdata[1]}<extra></extra>",
        )
    )
    fig.update_xaxes(showticklabels=False, title="MDS 1")
    fig.update_yaxes(showticklabels=False, title="MDS 2", scaleanchor="x")
    apply_layout(fig, "Map of heads (similar heads lie close together)", height=620)
    return set_alt(fig, _map_alt(coords))


def _map_alt(coords: pd.DataFrame) -> str:
    """The map's finding: its closest and its farthest pair of heads."""
    names = [str(h) for h in coords.index]
    if len(names) < 2:
        return f"Map of {len(names)} head: nothing to compare."
    xy = coords[["x", "y"]].to_numpy(float)
    d = np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))
    far = np.unravel_index(np.argmax(d), d.shape)
    d[np.eye(len(d), dtype=bool)] = np.inf
    near = np.unravel_index(np.argmin(d), d.shape)
    return (
        f"Map of {len(names)} heads, similar heads close together: the closest pair is "
        f"{names[near[0]]} and {names[near[1]]} ({d[near]:.2g} apart), the farthest "
        f"{names[far[0]]} and {names[far[1]]} ({d[far] if np.isfinite(d[far]) else 0:.2g})."
    )

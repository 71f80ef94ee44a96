"""Plotly figures of attention results and head analyses. No torch, no streamlit.

Every label that comes from user text goes through ``label`` (HTML-escaped: plotly renders tags
such as ``<b>`` in tick labels and hovers), and token axes have one category per position with
the token as tick text, so repeated tokens ("the" twice) keep their own rows and columns.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.result import AttentionResult

__all__ = [
    "downsample",
    "head_grid",
    "head_heatmap",
    "head_map_figure",
    "label",
    "matrix_heatmap",
    "rollout_figure",
    "similarity_figure",
    "stat_grid",
    "token_focus",
]

COLORSCALE = "Blues"
GRID_THUMB = 24  # largest side of a head's thumbnail in the grid, in cells
MAX_TICKS = 64  # beyond this, tick labels are thinned (hover still names every cell)


def label(text: str, limit: int = 40) -> str:
    """A user-supplied string made safe and short for a plotly label (escaped, one line)."""
    clean = "".join(ch if ch.isprintable() else "\ufffd" for ch in str(text))
    if len(clean) > limit:
        clean = clean[: limit - 1] + "…"
    return html.escape(clean, quote=False) or "\u2423"


def _axis(names: Sequence[str]) -> tuple[list[str], dict]:
    """Unique category per position ("cat #2": repeated tokens keep their own row) and tick
    labels showing the tokens themselves, thinned beyond MAX_TICKS."""
    categories = [f"{label(t, 30)} #{i}" for i, t in enumerate(names)]
    step = max(1, -(-len(names) // MAX_TICKS))
    idx = range(0, len(names), step)
    axis = {
        "type": "category",
        "tickmode": "array",
        "tickvals": [categories[i] for i in idx],
        "ticktext": [label(names[i], 20) for i in idx],
        "showgrid": False,
    }
    return categories, axis


def _layout(fig: go.Figure, title: str, *, height: int | None = None) -> go.Figure:
    fig.update_layout(
        title={"text": label(title, 120)},
        margin={"l": 10, "r": 10, "t": 110, "b": 10},
        height=height,
        plot_bgcolor="white",
    )
    return fig


def matrix_heatmap(
    matrix: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    title: str,
    row_title: str = "query (from)",
    col_title: str = "key (to)",
    zmin: float | None = 0.0,
    zmax: float | None = None,
    colorscale: str = COLORSCALE,
    value_name: str = "weight",
    height: int | None = None,
) -> go.Figure:
    """A labelled heatmap with exact values on hover; ``rows``/``cols`` are escaped here.

    The browser gets the matrix (float32, binary-encoded by plotly) and one label per row and
    column; hover text is assembled from those, not stored per cell.
    """
    y, y_axis = _axis(rows)
    x, x_axis = _axis(cols)
    fig = go.Figure(
        go.Heatmap(
            z=np.asarray(matrix, dtype=np.float32),
            x=x,
            y=y,
            colorscale=colorscale,
            zmin=zmin,
            zmax=zmax,
            hovertemplate=f"%{{y}} → %{{x}}<br>{value_name} %{{z:.4f}}<extra></extra>",
            colorbar={"thickness": 12},
        )
    )
    fig.update_xaxes(title=col_title, side="top", **x_axis)
    fig.update_yaxes(title=row_title, autorange="reversed", **y_axis)
    return _layout(fig, title, height=height)


def _square_height(n: int) -> int:
    """Pixels for an n x n token map: readable rows, within one screen."""
    return min(900, max(420, 18 * n + 120))


def head_heatmap(result: AttentionResult, layer: int, head: int) -> go.Figure:
    """One head at full resolution, tokens on both axes."""
    n = result.num_tokens
    return matrix_heatmap(
        result.attention[layer, head],
        result.tokens,
        result.tokens,
        title=f"Layer {layer}, head {head}",
        zmax=1.0,
        height=_square_height(n),
    )


def downsample(matrix: np.ndarray, size: int) -> np.ndarray:
    """Block-average the last two axes to at most ``size`` x ``size`` (rows keep summing to
    the mean mass of their block)."""
    n = matrix.shape[-1]
    if n <= size:
        return matrix
    edges = np.linspace(0, n, size + 1).round().astype(int)
    rows = np.add.reduceat(matrix, edges[:-1], axis=-2) / np.diff(edges)[:, None]
    return np.add.reduceat(rows, edges[:-1], axis=-1)


def head_grid(
    result: AttentionResult,
    *,
    thumb: int = GRID_THUMB,
    selected: tuple[int, int] | None = None,
) -> go.Figure:
    """Every head at a glance: a layers x heads mosaic of thumbnails in one heatmap trace.

    Thumbnails are block-averaged to at most ``thumb`` cells a side, so the browser receives
    layers x heads x thumb^2 numbers whatever the sentence length. An invisible marker on each
    thumbnail carries the head's name, for hovering and for selecting by click.
    """
    layers, heads, n, _ = result.attention.shape
    small = downsample(result.attention, thumb)  # (L, H, s, s)
    s = small.shape[-1]
    cell = s + 1  # one empty cell between thumbnails
    mosaic = np.full((layers * cell - 1, heads * cell - 1), np.nan, dtype=np.float32)
    for li in range(layers):
        for h in range(heads):
            mosaic[li * cell : li * cell + s, h * cell : h * cell + s] = small[li, h]
    vmax = float(np.nanpercentile(mosaic, 99)) or 1.0
    fig = go.Figure(
        go.Heatmap(
            z=mosaic, colorscale=COLORSCALE, zmin=0, zmax=vmax, showscale=False, hoverinfo="skip"
        )
    )
    centres = np.arange(layers * heads)
    fig.add_trace(
        go.Scatter(
            x=(centres % heads) * cell + (s - 1) / 2,
            y=(centres // heads) * cell + (s - 1) / 2,
            mode="markers",
            marker={"symbol": "square", "size": 28, "color": "rgba(0,0,0,0)"},
            customdata=np.stack([centres // heads, centres % heads], axis=1),
            hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<extra></extra>",
            name="heads",
            showlegend=False,
        )
    )
    if selected is not None:
        li, h = selected
        fig.add_shape(
            type="rect",
            x0=h * cell - 0.5,
            x1=h * cell + s - 0.5,
            y0=li * cell - 0.5,
            y1=li * cell + s - 0.5,
            line={"color": "crimson", "width": 3},
        )
    fig.update_xaxes(
        tickmode="array",
        tickvals=[h * cell + (s - 1) / 2 for h in range(heads)],
        ticktext=[f"H{h}" for h in range(heads)],
        side="top",
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        tickmode="array",
        tickvals=[li * cell + (s - 1) / 2 for li in range(layers)],
        ticktext=[f"L{li}" for li in range(layers)],
        autorange="reversed",
        scaleanchor="x",
        showgrid=False,
        zeroline=False,
    )
    fig.update_layout(clickmode="event+select", dragmode=False)
    note = f" (each {n}x{n} head shown at {s}x{s})" if s < n else ""
    return _layout(fig, f"All heads{note}: click one to enlarge", height=80 + 70 * layers)


def token_focus(result: AttentionResult, token: int) -> go.Figure:
    """Where one token attends, in every head: rows are heads, columns are keys."""
    a = result.attention[:, :, token, :]  # (L, H, n)
    rows = result.head_labels()
    return matrix_heatmap(
        a.reshape(-1, a.shape[-1]),
        rows,
        result.tokens,
        title=f"Where '{result.tokens[token]}' attends, in every head",
        row_title="head",
        col_title="key (to)",
        zmax=1.0,
        height=min(1400, 120 + 12 * len(rows)),
    )


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


def head_map_figure(
    coords: pd.DataFrame, *, color: pd.Series | None = None, roles: pd.Series | None = None
) -> go.Figure:
    """The 2-D map of heads; ``color`` defaults to the layer, ``roles`` shown on hover."""
    colour = coords["layer"] if color is None else color.reindex(coords.index)
    hover_roles = roles.reindex(coords.index) if roles is not None else pd.Series("", coords.index)
    fig = go.Figure(
        go.Scatter(
            x=coords["x"],
            y=coords["y"],
            mode="markers+text",
            text=list(coords.index),
            textposition="top center",
            textfont={"size": 9},
            marker={
                "size": 11,
                "color": colour.to_numpy(),
                "colorscale": "Turbo",
                "showscale": True,
                "colorbar": {"title": {"text": "layer" if color is None else "cluster"}},
            },
            customdata=np.stack([coords.index.to_numpy(), hover_roles.to_numpy()], axis=1),
            hovertemplate="%{customdata[0]}: %{customdata[1]}<extra></extra>",
        )
    )
    fig.update_xaxes(showticklabels=False, title="MDS 1")
    fig.update_yaxes(showticklabels=False, title="MDS 2", scaleanchor="x")
    return _layout(fig, "Map of heads (similar heads lie close together)", height=620)


def stat_grid(stats: pd.DataFrame, column: str) -> go.Figure:
    """One statistic as a layers x heads heatmap."""
    table = stats.pivot(index="layer", columns="head", values=column)
    return matrix_heatmap(
        table.to_numpy(),
        [f"L{li}" for li in table.index],
        [f"H{h}" for h in table.columns],
        title=column,
        row_title="layer",
        col_title="head",
        zmin=None,
        value_name=column,
        height=80 + 45 * len(table),
    )


def rollout_figure(rollout: np.ndarray, tokens: Sequence[str], layer: int) -> go.Figure:
    """Rolled-out attention after ``layer``: how much each input token reaches each position."""
    return matrix_heatmap(
        rollout[layer],
        tokens,
        tokens,
        title=f"Attention rollout through layer {layer}",
        row_title="position",
        col_title="input token",
        zmax=None,
        value_name="share",
        height=_square_height(len(tokens)),
    )


def head_value_grid(
    table: pd.DataFrame,
    column: str,
    *,
    title: str,
    marked: Sequence[tuple[int, int]] = (),
    colorscale: str = "Viridis",
) -> go.Figure:
    """One value per head as a layers x heads map (``table`` as ``head_stats`` /
    ``head_importance`` give it); an invisible marker on each cell carries ``[layer, head]``
    for clicks, and the ``marked`` heads get a cross."""
    grid = table.pivot(index="layer", columns="head", values=column)
    layers, heads = grid.index.to_numpy(), grid.columns.to_numpy()
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(dtype=np.float32),
            x=heads,
            y=layers,
            colorscale=colorscale,
            colorbar={"thickness": 12},
            hoverinfo="skip",
        )
    )
    ll, hh = np.meshgrid(layers, heads, indexing="ij")
    values = grid.to_numpy().reshape(-1)
    fig.add_trace(
        go.Scatter(
            x=hh.reshape(-1),
            y=ll.reshape(-1),
            mode="markers",
            marker={"symbol": "square", "size": 26, "color": "rgba(0,0,0,0)"},
            customdata=np.stack([ll.reshape(-1), hh.reshape(-1), values], axis=1),
            hovertemplate=(
                f"layer %{{customdata[0]}}, head %{{customdata[1]}}<br>{label(column)} "
                "%{customdata[2]:.4g}<extra></extra>"
            ),
            showlegend=False,
        )
    )
    if marked:
        fig.add_trace(
            go.Scatter(
                x=[h for _, h in marked],
                y=[li for li, _ in marked],
                mode="markers",
                marker={"symbol": "x", "size": 16, "color": "crimson"},
                hoverinfo="skip",
                name="switched off",
            )
        )
    fig.update_xaxes(title="head", side="top", tickmode="array", tickvals=heads, showgrid=False)
    fig.update_yaxes(
        title="layer", autorange="reversed", tickmode="array", tickvals=layers, showgrid=False
    )
    fig.update_layout(clickmode="event+select", dragmode=False)
    return _layout(fig, title, height=140 + 45 * len(layers))


def pruning_figure(curve: pd.DataFrame, metric_name: str) -> go.Figure:
    """Michel et al.'s pruning figure: the metric against the share of heads removed, in
    importance order and in the seeded random order."""
    fig = go.Figure()
    for order, rows in curve.groupby("order", sort=False):
        fig.add_trace(
            go.Scatter(
                x=rows["fraction_pruned"] * 100,
                y=rows["metric"],
                mode="lines+markers",
                name=label(f"{order} order"),
                customdata=rows["heads_pruned"],
                hovertemplate=(
                    f"%{{x:.0f}}% of heads off (%{{customdata}})<br>{label(metric_name)} "
                    "%{y:.4g}<extra></extra>"
                ),
            )
        )
    fig.update_xaxes(title="heads switched off (%)", range=[-2, 102])
    fig.update_yaxes(title=label(metric_name))
    return _layout(fig, "Pruning curve: heads switched off, least important first", height=420)


def importance_scatter(importance: pd.DataFrame, stats: pd.DataFrame, x: str) -> go.Figure:
    """Importance against a head statistic (Voita et al.: are the important heads the confident
    ones?), one point per head, coloured by layer."""
    joined = importance[["layer", "head", "importance"]].join(stats[[x]])
    fig = go.Figure(
        go.Scatter(
            x=joined[x],
            y=joined["importance"],
            mode="markers",
            marker={
                "color": joined["layer"],
                "colorscale": "Viridis",
                "size": 9,
                "colorbar": {"title": "layer", "thickness": 12},
            },
            customdata=np.stack([joined["layer"], joined["head"]], axis=1),
            hovertemplate=(
                f"L%{{customdata[0]}}H%{{customdata[1]}}<br>{label(x)} %{{x:.3f}}<br>"
                "importance %{y:.4g}<extra></extra>"
            ),
            showlegend=False,
        )
    )
    fig.update_xaxes(title=label(x))
    fig.update_yaxes(title="importance")
    return _layout(fig, f"Importance against {x}", height=420)


def layer_change_figure(intact: AttentionResult, ablated: AttentionResult) -> go.Figure:
    """Per layer, how far the knock-out moved the attention: the largest and the mean
    absolute change of any weight."""
    diff = np.abs(ablated.attention - intact.attention)  # (L, H, n, n)
    layers = [f"L{li}" for li in range(diff.shape[0])]
    fig = go.Figure(
        [
            go.Bar(x=layers, y=diff.max(axis=(1, 2, 3)), name="largest change"),
            go.Bar(x=layers, y=diff.mean(axis=(1, 2, 3)), name="mean change"),
        ]
    )
    fig.update_yaxes(title="|attention after − before|")
    fig.update_layout(barmode="group")
    return _layout(fig, "How much each layer's attention moved", height=360)

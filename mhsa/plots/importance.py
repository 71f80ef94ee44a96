"""The Head importance page: importance (or any value) per head as a clickable layers x heads
map, Michel et al.'s pruning curve, importance against a statistic, and how far a knock-out
moved each layer's attention."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.engine.result import AttentionResult
from mhsa.heads import layer_name
from mhsa.plots.common import apply_layout, label, signed_scale

__all__ = ["head_value_grid", "importance_scatter", "layer_change_figure", "pruning_figure"]


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
    for clicks, and the ``marked`` heads get a cross. Values below 0 (an importance where a
    knock-out lowers the loss) put the map on ``signed_scale``, white at 0, instead of
    ``colorscale``."""
    grid = table.pivot(index="layer", columns="head", values=column)
    layers, heads = grid.index.to_numpy(), grid.columns.to_numpy()
    names = _layer_names(table)
    z = grid.to_numpy(dtype=np.float32)
    signed = bool((z[np.isfinite(z)] < 0).any())
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=heads,
            y=layers,
            **(signed_scale(z) if signed else {"colorscale": colorscale}),
            colorbar={"thickness": 12, "title": {"text": label(column, 20)}},
            hoverinfo="skip",
        )
    )
    fig.add_trace(_cell_markers(grid, column, names))
    if marked:
        fig.add_trace(_crosses(marked))
    fig.update_xaxes(title="head", side="top", tickmode="array", tickvals=heads, showgrid=False)
    fig.update_yaxes(
        title="layer" if names is None else "attention and layer",
        autorange="reversed",
        tickmode="array",
        tickvals=layers,
        ticktext=None if names is None else [names[li] for li in layers],
        showgrid=False,
    )
    fig.update_layout(clickmode="event+select", dragmode=False)
    return apply_layout(fig, title, height=140 + 45 * len(layers))


def _layer_names(table: pd.DataFrame) -> dict[int, str] | None:
    """How an encoder-decoder's table (a ``kind`` column) names each block: ``{4: "C0"}`` from
    its labels (``C0H1``); None for a table of ``L{layer}`` heads."""
    if "kind" not in table.columns:
        return None
    return {int(li): str(name).rsplit("H", 1)[0] for name, li in table["layer"].items()}


def _cell_markers(
    grid: pd.DataFrame, column: str, names: dict[int, str] | None = None
) -> go.Scatter:
    """An invisible marker on each cell of the layers x heads ``grid`` carrying ``[layer, head,
    value]``, for hovering and for selecting a head by click (``names``: an encoder-decoder's
    block names, ``E0`` ..., which the hover says)."""
    ll, hh = np.meshgrid(grid.index.to_numpy(), grid.columns.to_numpy(), indexing="ij")
    values = grid.to_numpy().reshape(-1)
    where = "layer %{customdata[0]}, head %{customdata[1]}"
    text = None
    if names is not None:
        text = [
            f"{names[int(li)]}H{int(h)}"
            for li, h in zip(ll.reshape(-1), hh.reshape(-1), strict=True)
        ]
        where = "%{text}"
    return go.Scatter(
        x=hh.reshape(-1),
        y=ll.reshape(-1),
        mode="markers",
        marker={"symbol": "square", "size": 26, "color": "rgba(0,0,0,0)"},
        customdata=np.stack([ll.reshape(-1), hh.reshape(-1), values], axis=1),
        text=text,
        hovertemplate=f"{where}<br>{label(column)} %{{customdata[2]:.4g}}<extra></extra>",
        showlegend=False,
    )


def _crosses(marked: Sequence[tuple[int, int]]) -> go.Scatter:
    """A cross on each ``(layer, head)`` of ``marked`` (the heads switched off)."""
    return go.Scatter(
        x=[h for _, h in marked],
        y=[li for li, _ in marked],
        mode="markers",
        marker={"symbol": "x", "size": 16, "color": "crimson"},
        hoverinfo="skip",
        name="switched off",
    )


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
    return apply_layout(fig, "Pruning curve: heads switched off, least important first", height=420)


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
            text=list(joined.index),  # the head's label (an encoder-decoder's: E0H1 ...)
            hovertemplate=(
                f"%{{text}}<br>{label(x)} %{{x:.3f}}<br>importance %{{y:.4g}}<extra></extra>"
            ),
            showlegend=False,
        )
    )
    fig.update_xaxes(title=label(x))
    fig.update_yaxes(title="importance")
    return apply_layout(fig, f"Importance against {x}", height=420)


def layer_change_figure(intact: AttentionResult, ablated: AttentionResult) -> go.Figure:
    """Per layer, how far the knock-out moved the attention: the largest and the mean
    absolute change of any weight."""
    diff = np.abs(ablated.attention - intact.attention)  # (L, H, m, n)
    kind = intact.kind or ("encoder" if intact.is_encoder_decoder else "self")
    layers = [layer_name(kind, li) for li in range(diff.shape[0])]
    what = "" if intact.kind is None else f", {intact.kind} attention"
    fig = go.Figure(
        [
            go.Bar(x=layers, y=diff.max(axis=(1, 2, 3)), name="largest change"),
            go.Bar(x=layers, y=diff.mean(axis=(1, 2, 3)), name="mean change"),
        ]
    )
    fig.update_yaxes(title="|attention after − before|")
    fig.update_layout(barmode="group")
    return apply_layout(fig, f"How much each layer's attention moved{what}", height=360)

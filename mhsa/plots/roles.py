"""The Head roles page: the detectors' scores side by side, a detector's detection pattern,
where heads sink their attention, and how strongly heads compose."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.plots.common import (
    SIGNED_COLORSCALE,
    apply_layout,
    label,
    matrix_heatmap,
    signed_scale,
    square_height,
    token_axis,
)
from mhsa.plots.marks import mark_token_axes

__all__ = ["composition_figure", "detection_pattern_figure", "role_maps", "sink_map"]


def role_maps(
    panels: Sequence[tuple[str, pd.DataFrame, str]],
    *,
    title: str,
    signed: bool = False,
    value_name: str = "score",
) -> go.Figure:
    """Layers x heads maps side by side, one per ``(name, table, column)`` (``table`` with
    ``layer`` and ``head`` columns), on one colour scale: 0 to 1 (scores that are shares of
    attention) unless a value lies outside, so the detectors compare at a glance; ``signed``:
    red below 0 and blue above, symmetric around 0 (at least -1 to 1)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=len(panels),
        subplot_titles=[label(name, 60) for name, _, _ in panels],
        horizontal_spacing=0.05,
    )
    low, high = 0.0, 1.0
    values = []
    suffix = f": {value_name}" if signed else ""
    for i, (name, table, column) in enumerate(panels, start=1):
        grid = table.pivot(index="layer", columns="head", values=column)
        z = grid.to_numpy(dtype=np.float32)
        low, high = min(low, float(np.nanmin(z))), max(high, float(np.nanmax(z)))
        values.append(z.ravel())
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=grid.columns.to_numpy(),
                y=grid.index.to_numpy(),
                coloraxis="coloraxis",
                hovertemplate=f"layer %{{y}}, head %{{x}}<br>{label(name)}{suffix} %{{z:.3f}}"
                "<extra></extra>",
            ),
            row=1,
            col=i,
        )
        fig.update_xaxes(title="head", tickmode="array", tickvals=grid.columns, row=1, col=i)
        fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=grid.index, row=1, col=i)
    fig.update_xaxes(showgrid=False)
    fig.update_yaxes(showgrid=False)
    fig.update_yaxes(title="layer", row=1, col=1)
    scale = (
        signed_scale(np.concatenate(values), at_least=1.0, axis=True)
        if signed
        else {"colorscale": "Blues", "cmin": low, "cmax": high}
    )
    colorbar = {"thickness": 12, "title": {"text": value_name}}
    fig.update_layout(coloraxis={**scale, "colorbar": colorbar})
    layers = max(len(table["layer"].unique()) for _, table, _ in panels)
    return apply_layout(fig, title, height=160 + 40 * layers)


def detection_pattern_figure(
    pattern: np.ndarray, tokens: Sequence[str], name: str, *, columns: int = 1
) -> go.Figure:
    """A detection pattern (which key each query should attend to), tokens on both axes, drawn
    as a head is, so that it sits beside the heads that match it; ``columns``: figures sharing
    the page's width (``matrix_heatmap``)."""
    pattern = np.asarray(pattern, dtype=np.float32)
    high = float(np.abs(pattern).max(initial=0.0)) or 1.0
    signed = bool((pattern < 0).any())
    fig = matrix_heatmap(
        pattern,
        tokens,
        tokens,
        title=f"Detection pattern: {name}",
        zmin=-high if signed else 0.0,
        zmax=high,
        colorscale=SIGNED_COLORSCALE if signed else "Blues",
        value_name="pattern",
        height=square_height(len(tokens)),
        columns=columns,
    )
    return mark_token_axes(fig)


def sink_map(
    received: np.ndarray,
    heads: Sequence[str],
    tokens: Sequence[str],
    *,
    threshold: float,
) -> go.Figure:
    """Heads x key positions: the mean attention each key receives from the queries that can
    attend it (``received``, ``[heads, n]``, ``mhsa.analysis.attention_sinks``; NaN, left blank,
    where too few can), a cross on every position where a head sinks (above ``threshold``)."""
    fig = matrix_heatmap(
        received,
        heads,
        tokens,
        title=f"Attention received by each position (× = a sink, above {threshold:g})",
        row_title="head",
        col_title="key (receives)",
        zmax=1.0,
        value_name="received",
        height=min(1400, 140 + 12 * len(heads)),
    )
    rows, cols = np.nonzero(np.nan_to_num(np.asarray(received), nan=0.0) > threshold)
    y, _ = token_axis(heads)
    x, _ = token_axis(tokens)
    fig.add_trace(
        go.Scatter(
            x=[x[c] for c in cols],
            y=[y[r] for r in rows],
            mode="markers",
            marker={"symbol": "x", "size": 9, "color": "crimson"},
            hoverinfo="skip",
            name="sink",
            showlegend=False,
        )
    )
    return mark_token_axes(fig, rows=False)


def composition_figure(scores: pd.DataFrame, kind: str, *, columns: int = 1) -> go.Figure:
    """One kind of composition (Q, K or V) between every head (rows: the earlier head, which
    writes) and every head (columns: the one that reads), as ``mhsa.analysis.head_composition``
    gives it: 0 where the reading head is not in a later layer; ``columns``: figures sharing the
    page's width (``matrix_heatmap``)."""
    return matrix_heatmap(
        scores.to_numpy(dtype=np.float32),
        [str(h) for h in scores.index],
        [str(h) for h in scores.columns],
        title=f"{kind}-composition: what each later head reads from each earlier one",
        row_title="earlier head (writes)",
        col_title="later head (reads)",
        zmin=0.0,
        value_name=f"{kind}-comp.",
        height=min(900, 200 + 10 * len(scores)),
        columns=columns,
    )

"""The Inside MHSA page: one step of our module's computation as a heatmap, and BertViz's neuron
view of how one query token's weights come about."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from mhsa.plots.common import (
    COLORSCALE,
    SIGNED_COLORSCALE,
    apply_layout,
    label,
    matrix_heatmap,
    signed_scale,
)
from mhsa.plots.marks import mark_token_axes

__all__ = ["neuron_figure", "step_heatmap"]


def step_heatmap(
    value: np.ndarray,
    tokens: Sequence[str],
    name: str,
    shape: list[int],
    *,
    keys: Sequence[str] | None = None,
) -> go.Figure:
    """One step of the classroom walk-through: a token x token matrix (scores, weights) or
    token x dimension (vectors); -inf (masked) shows as blank. ``tokens``: the rows';
    ``keys``: the columns' of a scores matrix where they are other tokens (cross-attention:
    decoder rows, encoder columns)."""
    keys = tokens if keys is None else keys
    square = value.shape == (len(tokens), len(keys))
    cols = keys if square else [f"d{i}" for i in range(value.shape[1])]
    probabilities = name == "probabilities"
    fig = matrix_heatmap(
        np.where(np.isinf(value), np.nan, value),
        tokens,
        cols,
        title=f"{name} {shape}",
        row_title="token",
        col_title="key" if square else "dimension",
        zmin=0.0 if probabilities else None,
        colorscale=COLORSCALE if probabilities else SIGNED_COLORSCALE,
        value_name="value",
    )
    return mark_token_axes(fig, cols=square)


def neuron_figure(
    neuron: Any, tokens: Sequence[str], *, queries: Sequence[str] | None = None
) -> go.Figure:
    """BertViz's neuron view for one query token and head (a ``mhsa.analysis.classroom.Neuron``):
    the
    query vector, each key vector, their elementwise product, q·k, the scaled score and the
    softmax, values on hover. ``tokens``: the keys'; ``queries``: the queries' where they are
    other tokens (cross-attention: the decoder's)."""
    n, d = neuron.keys.shape
    rows = [f"{label(t, 20)} #{i}" for i, t in enumerate(tokens)]
    query = tokens[neuron.token] if queries is None else queries[neuron.token]
    query_row = rows[neuron.token] if queries is None else f"{label(query, 20)} #{neuron.token}"
    dims = [f"d{i}" for i in range(d)]
    height = min(2400, 200 + 20 * n)
    fig = _neuron_subplots(n, height)
    _add_vectors(fig, neuron, rows, dims, query_row)
    _add_score_columns(fig, neuron, rows)
    _label_neuron_axes(fig, rows, tokens)
    return apply_layout(
        fig, f"Neuron view: head {neuron.head}, query '{query}' (#{neuron.token})", height=height
    )


def _neuron_subplots(n: int, height: int) -> go.Figure:
    """Two rows of five panels: the query alone on top; below, one row per key token for the
    keys, the products, and the three score columns."""
    from plotly.subplots import make_subplots

    return make_subplots(
        rows=2,
        cols=5,
        row_heights=[1, max(n, 2)],
        column_widths=[0.37, 0.37, 0.09, 0.09, 0.08],
        shared_xaxes="columns",
        # room for the second row's titles ("keys k", ...) between the rows, in pixels of the
        # plot area (a fixed fraction put them over the query row for short sentences)
        vertical_spacing=min(0.3, 40 / (height - 120)),
        horizontal_spacing=0.015,
        subplot_titles=["query q", "", "", "", "", "keys k", "q ⊙ k", "q·k", "× scale", "softmax"],
    )


def _add_vectors(
    fig: go.Figure, neuron: Any, rows: list[str], dims: list[str], query_row: str
) -> None:
    """The query vector (top left), every key vector and their products with the query (the
    second row's first two panels), per dimension."""
    vec = "%{y}, %{x}: %{z:.4f}<extra>%{meta}</extra>"
    fig.add_trace(
        go.Heatmap(
            z=neuron.query[None],
            x=dims,
            y=[query_row],
            hovertemplate=vec,
            meta="q",
            showscale=False,
            **signed_scale(neuron.query),
        ),
        1,
        1,
    )
    for col, (z, what) in enumerate(((neuron.keys, "k"), (neuron.products, "q ⊙ k")), start=1):
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=dims,
                y=rows,
                hovertemplate=vec,
                meta=what,
                showscale=False,
                **signed_scale(z),
            ),
            2,
            col,
        )


def _add_score_columns(fig: go.Figure, neuron: Any, rows: list[str]) -> None:
    """One column per key token for q·k, the scaled score and the softmax (the second row's
    last three panels)."""
    for col, (z, what, scale) in enumerate(
        (
            (neuron.dots, "q·k", signed_scale(neuron.dots)),
            (neuron.scaled, f"q·k × {neuron.scale:.4g}", signed_scale(neuron.scaled)),
            (neuron.probabilities, "softmax", {"colorscale": COLORSCALE, "zmin": 0, "zmax": 1}),
        ),
        start=3,
    ):
        fig.add_trace(
            go.Heatmap(
                z=np.asarray(z)[:, None],
                x=[what],
                y=rows,
                meta=what,
                hovertemplate="%{y}: %{z:.4f}<extra>%{meta}</extra>",
                **{**scale, "showscale": False},
            ),
            2,
            col,
        )


def _label_neuron_axes(fig: go.Figure, rows: list[str], tokens: Sequence[str]) -> None:
    """Token names beside the keys' rows and the query's row only; no other tick labels."""
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_yaxes(
        showticklabels=True,
        row=2,
        col=1,
        tickmode="array",
        tickvals=rows,
        ticktext=[label(t, 16) for t in tokens],
    )
    fig.update_yaxes(showticklabels=True, row=1, col=1)
    fig.update_xaxes(showticklabels=False)

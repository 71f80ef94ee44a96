"""Figures of a head's weights (``mhsa.analysis.weights``) and of a score split into residual
parts (``mhsa.analysis.qk_attribution``): the copying score of every head, a positional QK
pattern, and the largest (query part, key part) terms of scores. Signed values are centred at 0
(blue above, red below)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.heads import parse_head_label
from mhsa.plots.common import COLORWAY, SIGNED_COLORSCALE, apply_layout, label, matrix_heatmap
from mhsa.plots.export import NOT_EXPORTED

__all__ = ["clickable_cells", "copying_figure", "positional_figure", "qk_terms_figure"]


def copying_figure(scores: pd.Series) -> go.Figure:
    """Every head's copying score (``ov_copying_scores``) as a layers x heads map, from -1
    (red: lowers the logit of what it reads) through 0 (white) to 1 (blue: copies)."""
    cells = [parse_head_label(str(h)) for h in scores.index]
    layers, heads = 1 + max(c[0] for c in cells), 1 + max(c[1] for c in cells)
    matrix = np.full((layers, heads), np.nan, dtype=np.float32)
    for (layer, head), value in zip(cells, scores.to_numpy(), strict=True):
        matrix[layer, head] = value
    circuit = scores.attrs.get("circuit", "")
    return matrix_heatmap(
        matrix,
        [f"L{i}" for i in range(layers)],
        [f"H{h}" for h in range(heads)],
        title=f"Copying score of each head's OV circuit {circuit}".strip(),
        row_title="layer",
        col_title="head",
        zmin=-1.0,
        zmax=1.0,
        colorscale=SIGNED_COLORSCALE,
        value_name="copying",
        height=min(900, 160 + 28 * layers),
    )


def positional_figure(pattern: np.ndarray, head: str, reads: str = "W_pos") -> go.Figure:
    """One head's positional QK pattern ``[P, P]`` (``qk_positional_scores``): the attention
    its QK circuit gives the position embeddings alone, rows the query position; ``reads``:
    the positions as the heads read them (``PositionalQK.reads``: ``W_pos``, or a post-norm
    encoder's ``LN(W_pos)``)."""
    names = [str(i) for i in range(pattern.shape[0])]
    formula = f"{reads} W_Q W_K^T {reads}^T"
    fig = matrix_heatmap(
        pattern,
        names,
        names,
        title=f"{head}: attention from position embeddings alone ({formula})",
        row_title="query position",
        col_title="key position",
        zmax=1.0,
        height=min(700, 160 + 8 * len(names)),
    )
    # positions are numbers in order: every k-th named (16 at most) is enough, and a row of
    # 64 numbers side by side overlaps on a page's width
    step = -(-len(names) // 16)
    categories = list(fig.data[0].x)
    ticks = {"tickvals": categories[::step], "ticktext": names[::step]}
    fig.update_xaxes(**ticks)
    fig.update_yaxes(**ticks)
    return fig


def qk_terms_figure(terms: pd.DataFrame, *, title: str) -> go.Figure:
    """The largest terms of scores as horizontal bars, one colour per key: ``terms`` has
    ``pair`` (``"query part · key part"``), ``key`` (the key's label) and ``score``; bars
    centred at 0 (a term can lower a score)."""
    fig = go.Figure()
    for i, (key, rows) in enumerate(terms.groupby("key", sort=False)):
        fig.add_trace(
            go.Bar(
                x=rows["score"].to_numpy(dtype=float),
                y=[label(p, 60) for p in rows["pair"]],
                orientation="h",
                name=label(str(key), 40),
                marker={"color": COLORWAY[i % len(COLORWAY)]},
                hovertemplate="%{y}: %{x:.4f}<extra>%{fullData.name}</extra>",
            )
        )
    reach = float(terms["score"].abs().max()) if len(terms) else 1.0
    fig.update_xaxes(title="term of the score", range=[-1.05 * reach, 1.05 * reach], zeroline=True)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(barmode="group", legend={"title": {"text": "key"}})
    return apply_layout(fig, title, height=max(380, 80 + 22 * len(terms)))


#: cells up to which ``clickable_cells`` puts a marker on each (64 tokens a side)
MAX_CLICKABLE = 64 * 64


def clickable_cells(fig: go.Figure) -> go.Figure:
    """``fig`` (a ``matrix_heatmap``) with an invisible marker on the centre of each cell
    carrying ``[row, column, value]``: Streamlit's plotly selection picks points of a scatter
    trace, not the cells of a heatmap (as ``heads._head_markers`` makes the head grid's
    thumbnails clickable). The marker's hover is the cell's; the CSV export leaves the
    markers out (``export.NOT_EXPORTED``). Beyond ``MAX_CLICKABLE`` cells
    ``fig`` is returned as it is."""
    heat = fig.data[0]
    rows, cols = list(heat.y), list(heat.x)
    if len(rows) * len(cols) > MAX_CLICKABLE:
        return fig
    r, c = (grid.ravel() for grid in np.indices((len(rows), len(cols))))
    side = ((fig.layout.height or 450) - 200) / max(len(rows), 1)
    fig.add_trace(
        go.Scatter(
            x=[cols[j] for j in c],
            y=[rows[i] for i in r],
            mode="markers",
            marker={
                "symbol": "square",
                "size": max(4.0, min(28.0, side)),
                "color": "rgba(0,0,0,0)",
            },
            customdata=np.stack([r, c, np.asarray(heat.z, dtype=float).ravel()], axis=1),
            hovertemplate=str(heat.hovertemplate).replace("%{z", "%{customdata[2]"),
            name="cells",
            meta=NOT_EXPORTED,  # the heatmap's own cells are the figure's data
            showlegend=False,
        )
    )
    return fig

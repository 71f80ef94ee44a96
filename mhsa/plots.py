"""Plotly figures of attention results and head analyses. No torch, no streamlit.

Every label that comes from user text goes through ``label`` (HTML-escaped: plotly renders tags
such as ``<b>`` in tick labels and hovers), and token axes have one category per position with
the token as tick text, so repeated tokens ("the" twice) keep their own rows and columns.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.result import AttentionResult

__all__ = [
    "TEMPLATE",
    "decorate",
    "downsample",
    "figure_data",
    "head_grid",
    "head_heatmap",
    "head_map_figure",
    "label",
    "line_view",
    "matrix_heatmap",
    "mean_heatmap",
    "neuron_figure",
    "rollout_figure",
    "similarity_figure",
    "stat_grid",
    "step_heatmap",
    "token_focus",
]

#: The chart colours of Streamlit's light theme (the app's theme, .streamlit/config.toml) as its
#: frontend fills in the placeholders of the "streamlit" plotly template, which ``import
#: streamlit`` makes plotly's default. Every figure of the app carries ``TEMPLATE`` instead, so
#: that a figure saved as HTML (the page's zip) has these colours: with Streamlit's template it
#: kept the placeholders (#000001 to #000040, near-black), which only Streamlit's browser code
#: replaces. (Speed: the app's plotly element then has nothing to replace; measured on Heads at
#: 512 tokens, its replaceAll time fell from 0.45 to 0.33 s, not visible end to end.)
COLORWAY = [
    "#0068c9", "#83c9ff", "#ff2b2b", "#ffabab", "#29b09d",
    "#7defa1", "#ff8700", "#ffd16a", "#6d3fc0", "#d5dae5",
]  # fmt: skip
_SEQUENTIAL = [
    "#e4f5ff", "#c7ebff", "#a6dcff", "#83c9ff", "#60b4ff",
    "#3d9df3", "#1c83e1", "#0068c9", "#0054a3", "#004280",
]  # fmt: skip
_DIVERGING = [
    "#7d353b", "#bd4043", "#ff4b4b", "#ff8c8c", "#ffc7c7",
    "#a6dcff", "#60b4ff", "#1c83e1", "#0054a3", "#004280",
]  # fmt: skip


def _scale(colors: list[str]) -> list[list]:
    return [[i / (len(colors) - 1), c] for i, c in enumerate(colors)]


_SEQUENTIAL_SCALE = _scale(_SEQUENTIAL)
TEMPLATE = go.layout.Template(
    layout={
        "colorway": COLORWAY,
        "colorscale": {
            "sequential": _SEQUENTIAL_SCALE,
            "sequentialminus": _SEQUENTIAL_SCALE,
            "diverging": _scale(_DIVERGING),
        },
        "coloraxis": {"colorscale": _SEQUENTIAL_SCALE},
    },
    data={
        "heatmap": [{"type": "heatmap", "colorscale": _SEQUENTIAL_SCALE}],
        "scatter": [{"type": "scatter", "marker": {"line": {"width": 0}}}],
    },
)

COLORSCALE = "Blues"  # every attention weight, on every page, 0 (white) to 1 (dark blue)
SIGNED_COLORSCALE = "RdBu"  # signed values (vectors, scores): blue above 0, red below
GRID_THUMB = 24  # largest side of a head's thumbnail in the grid, in cells
MAX_TICKS = 64  # beyond this, tick labels are thinned (hover still names every cell)


def label(text: str, limit: int = 40) -> str:
    """A user-supplied string made safe and short for a plotly label (escaped, one line).
    ``#`` is written ``&#35;`` (plotly shows it as ``#``): Streamlit's plotly element replaces
    ``#000001`` to ``#000040`` anywhere in a figure's spec with its theme's colours, so the
    word "#000001" would have been shown as "#0068c9"."""
    clean = "".join(ch if ch.isprintable() else "\ufffd" for ch in str(text))
    if len(clean) > limit:
        clean = clean[: limit - 1] + "…"
    return html.escape(clean, quote=False).replace("#", "&#35;") or "\u2423"


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


def _layout_props(title: str, height: int | None = None) -> dict:
    """The layout every figure starts from: its title (escaped), margins, height, background."""
    return {
        "title": {"text": label(title, 120)},
        "margin": {"l": 10, "r": 10, "t": 110, "b": 10},
        "height": height,
        "plot_bgcolor": "white",
    }


def _layout(fig: go.Figure, title: str, *, height: int | None = None) -> go.Figure:
    fig.update_layout(_layout_props(title, height))
    return fig


#: average width of a glyph of plotly's default font (Open Sans), in font sizes
_GLYPH = 0.62


def _tick_chars(fig: go.Figure, name: str, axis: dict) -> int:
    """Characters of the longest tick label of axis ``name`` ("xaxis"/"yaxis"), whose layout is
    ``axis`` (plain JSON): its tick texts, else the strings it shows from the data
    (categories), else 6 (numbers)."""
    if axis.get("showticklabels") is False:
        return 0
    if axis.get("ticktext") is not None:
        texts = list(axis["ticktext"])
    else:
        data = (getattr(trace, name[0], None) for trace in fig.data)
        texts = [v for d in data if d is not None for v in list(d[:2000]) if isinstance(v, str)]
    return max((len(html.unescape(str(t))) for t in texts), default=6)


def fit_margins(fig: go.Figure) -> go.Figure:
    """Margins that hold the tick labels, axis titles, title and colour bar of ``fig``, with
    plotly's automargin off: automargin measures every label after drawing and, when a margin
    grows, draws the whole figure again (a second drawing each time a sentence is typed).
    Labels are at most 30 characters (``label``), so the estimate bounds them; the top side
    assumes vertical tick labels (plotly turns crowded ones). Figures with more than one pair
    of axes keep automargin. Only grows margins. Reads one plain copy of the layout and writes
    once: plotly validates every attribute read and write, which made this a tenth of the
    server's work for a typed sentence."""
    layout = fig.layout.to_plotly_json()
    size = layout.get("font", {}).get("size") or 12
    glyph = _GLYPH * size
    line = 1.6 * size
    need = {"l": 10.0, "r": 10.0, "t": 10.0, "b": 10.0}
    title = layout.get("title", {})
    if title.get("text"):
        need["t"] += 1.6 * (title.get("font", {}).get("size") or size + 5) + 10
    for name in ("xaxis", "yaxis"):
        axis = layout.get(name, {})
        if axis.get("visible") is False:
            continue
        chars = _tick_chars(fig, name, axis)
        side = axis.get("side") or ("left" if name == "yaxis" else "bottom")
        turned = name == "yaxis" or side == "top" or chars > 8  # long labels turn
        ticks = 0 if not chars else chars * glyph + 8 if turned else line + 8
        need[side[0]] += ticks + (line + 4 if axis.get("title", {}).get("text") else 0)
    if any(
        getattr(t, "showscale", None) is not False and t.type in ("heatmap", "histogram2d")
        for t in fig.data
    ):
        need["r"] += 60 + glyph * 6
    margin = layout.get("margin", {})
    update: dict = {
        "margin": {k: max(int(need[k]), margin.get(k) or 0) for k in need},
        "title": {"yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 10}},
    }
    if {k for k in layout if k.startswith(("xaxis", "yaxis"))} <= {"xaxis", "yaxis"}:
        update |= {"xaxis": {"automargin": False}, "yaxis": {"automargin": False}}
    fig.update_layout(update)
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
    heatmap = go.Heatmap(
        z=np.asarray(matrix, dtype=np.float32),
        x=x,
        y=y,
        colorscale=colorscale,
        zmin=zmin,
        zmax=zmax,
        hovertemplate=f"%{{y}} → %{{x}}<br>{value_name} %{{z:.4f}}<extra></extra>",
        colorbar={"thickness": 12, "title": {"text": value_name}},  # the same legend everywhere
    )
    layout = _layout_props(title, height) | {  # one validated layout, not one update per part
        "xaxis": {"title": {"text": col_title}, "side": "top", **x_axis},
        "yaxis": {"title": {"text": row_title}, "autorange": "reversed", **y_axis},
    }
    return go.Figure(heatmap, layout)


def _square_height(n: int) -> int:
    """Pixels for an n x n token map: readable rows, within one screen."""
    return min(900, max(420, 18 * n + 120))


def head_heatmap(result: AttentionResult, layer: int, head: int) -> go.Figure:
    """One head at full resolution, tokens on both axes."""
    n = result.num_tokens
    fig = matrix_heatmap(
        result.attention[layer, head],
        result.tokens,
        result.tokens,
        title=f"Layer {layer}, head {head}",
        zmax=1.0,
        height=_square_height(n),
    )
    return _token_axes(fig)


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
    fig = matrix_heatmap(
        a.reshape(-1, a.shape[-1]),
        rows,
        result.tokens,
        title=f"Where '{result.tokens[token]}' attends, in every head",
        row_title="head",
        col_title="key (to)",
        zmax=1.0,
        height=min(1400, 120 + 12 * len(rows)),
    )
    return _token_axes(fig, rows=False)


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
    fig = matrix_heatmap(
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
    return _token_axes(fig)


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
            colorbar={"thickness": 12, "title": {"text": label(column, 20)}},
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


# --- views of one layer, one head, one token -----------------------------------------------------
#: distinct colours for heads (line view), cycled beyond 24 heads
HEAD_COLORS = (
    "#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #7f7f7f #bcbd22 #17becf "
    "#393b79 #e6550d #31a354 #843c39 #756bb1 #637939 #d6616b #3182bd #8c6d31 #ce6dbd "
    "#636363 #9c9ede #fd8d3c #74c476"
).split()
LINE_BINS = 5  # opacity levels: a line's opacity is its weight, rounded up to 1/LINE_BINS
LINE_MIN_WEIGHT = 0.01  # lines below this weight are not drawn (invisible anyway)
LINE_DENSE = 40  # beyond this many tokens, each token keeps only its strongest lines
LINE_TOP_K = 5
LINE_BUDGET = 8000  # most lines drawn by default (SVG paths: the browser's cost grows with them)


def _rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha:.2f})"


def line_pairs(
    weights: np.ndarray, *, token: int | None, min_weight: float, top_k: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """The (query, key) pairs a line view draws for one head's ``[n, n]`` weights: at least
    ``min_weight``, only the ``top_k`` strongest per query when given, only row ``token`` when
    given."""
    keep = weights >= min_weight
    if top_k is not None and top_k < weights.shape[1]:
        kth = -np.sort(-weights, axis=1)[:, top_k - 1 : top_k]
        keep &= weights >= kth
    if token is not None:
        keep[np.arange(len(keep)) != token] = False
    return np.nonzero(keep)


def line_view(
    result: AttentionResult,
    layer: int,
    *,
    heads: Sequence[int] | None = None,
    token: int | None = None,
    min_weight: float = LINE_MIN_WEIGHT,
    top_k: int | None = None,
) -> go.Figure:
    """BertViz's head view: the tokens in two columns (left: from, right: to) joined by lines
    whose opacity is the weight, each head in its own colour (click a legend entry to hide or
    show a head). ``token`` shows only that token's lines. Beyond ``LINE_DENSE`` tokens each
    token keeps only its strongest lines, ``top_k`` of them: by default ``LINE_TOP_K``, fewer
    where that would draw more than ``LINE_BUDGET`` lines (at least one); the title says so.

    Traces: 0 the left tokens, 1 the right tokens (``customdata`` = token index, for
    selecting by click), then per head its legend entry (no points) and one trace per opacity
    level that has lines (``legendgroup`` = head).
    """
    n = result.num_tokens
    heads = list(range(result.num_heads)) if heads is None else list(heads)
    if top_k is None and n > LINE_DENSE:
        top_k = int(np.clip(LINE_BUDGET // (len(heads) * n), 1, LINE_TOP_K))
    y = -np.arange(n, dtype=float)
    names = [label(t, 24) for t in result.tokens]
    fig = go.Figure()
    for side, x in (("from", 0.0), ("to", 1.0)):
        fig.add_trace(
            go.Scatter(
                x=np.full(n, x),
                y=y,
                mode="markers+text",
                text=names,
                textposition="middle left" if side == "from" else "middle right",
                marker={"size": 8, "color": "rgba(120,120,120,0.35)"},
                customdata=np.arange(n),
                hovertemplate=f"%{{text}} (#%{{customdata}}, {side}): click to show only its "
                "lines<extra></extra>",
                showlegend=False,
                name=f"tokens ({side})",
            )
        )
    for h in heads:
        w = result.attention[layer, h]
        q, k = line_pairs(w, token=token, min_weight=min_weight, top_k=top_k)
        levels = np.clip(np.ceil(w[q, k] * LINE_BINS), 1, LINE_BINS).astype(int)
        color = HEAD_COLORS[h % len(HEAD_COLORS)]
        fig.add_trace(  # the head's legend entry, in full colour (toggles its whole group)
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                line={"color": _rgba(color, 1.0), "width": 3},
                name=f"head {h}",
                legendgroup=f"H{h}",
                hoverinfo="skip",
            )
        )
        for level in range(1, LINE_BINS + 1):
            sel = levels == level
            if not sel.any():
                continue
            m = int(sel.sum())
            xs = np.tile([0.0, 1.0, np.nan], m)
            ys = np.column_stack([y[q[sel]], y[k[sel]], np.full(m, np.nan)]).ravel()
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines",
                    line={
                        "color": _rgba(color, level / LINE_BINS),
                        "width": 2 if n <= LINE_DENSE else 1,
                    },
                    hoverinfo="skip",
                    name=f"head {h}",
                    legendgroup=f"H{h}",
                    showlegend=False,
                    meta={"head": h, "lines": m},
                )
            )
    what = f"lines of '{result.tokens[token]}'" if token is not None else "all tokens"
    dense = f", top {top_k} per token" if top_k is not None else ""
    fig.update_xaxes(visible=False, range=[-0.6, 1.6])
    fig.update_yaxes(visible=False, range=[-n + 0.5, 0.8])
    fig.update_layout(
        legend={"title": {"text": "heads (click to toggle)"}, "itemsizing": "constant"},
        clickmode="event+select",
        dragmode=False,
        meta={"line_view": True},
    )
    return _layout(
        fig,
        f"Layer {layer}, {what}: opacity = weight (weights ≥ {min_weight:g}{dense})",
        height=min(4000, max(480, 140 + (22 if n <= LINE_DENSE else 14) * n)),
    )


def mean_heatmap(result: AttentionResult, *, layer: int | None = None, head: int | None = None):
    """The mean over the heads of ``layer``, or over the layers for ``head``."""
    if layer is not None:
        matrix, title = result.attention[layer].mean(0), f"Layer {layer}, mean over heads"
    elif head is not None:
        matrix, title = result.attention[:, head].mean(0), f"Head {head}, mean over layers"
    else:
        raise ValueError("give a layer or a head")
    fig = matrix_heatmap(matrix, result.tokens, result.tokens, title=title, zmax=1.0)
    return _token_axes(fig, height=_square_height(result.num_tokens))


def step_heatmap(value: np.ndarray, tokens: Sequence[str], name: str, shape: list[int]):
    """One step of the classroom walk-through: a token x token matrix (scores, weights) or
    token x dimension (vectors); -inf (masked) shows as blank."""
    square = value.shape == (len(tokens), len(tokens))
    cols = tokens if square else [f"d{i}" for i in range(value.shape[1])]
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
    return _token_axes(fig, cols=square)


def neuron_figure(neuron: Any, tokens: Sequence[str]) -> go.Figure:
    """BertViz's neuron view for one query token and head: the query vector, each key vector,
    their elementwise product, q·k, the scaled score and the softmax, values on hover."""
    from plotly.subplots import make_subplots

    n, d = neuron.keys.shape
    rows = [f"{label(t, 20)} #{i}" for i, t in enumerate(tokens)]
    dims = [f"d{i}" for i in range(d)]
    height = min(2400, 200 + 20 * n)
    fig = make_subplots(
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
    signed = {"colorscale": SIGNED_COLORSCALE, "zmid": 0, "showscale": False}
    vec = "%{y}, %{x}: %{z:.4f}<extra>%{meta}</extra>"
    fig.add_trace(
        go.Heatmap(
            z=neuron.query[None],
            x=dims,
            y=[rows[neuron.token]],
            hovertemplate=vec,
            meta="q",
            **signed,
        ),
        1,
        1,
    )
    for col, (z, what) in enumerate(((neuron.keys, "k"), (neuron.products, "q ⊙ k")), start=1):
        fig.add_trace(
            go.Heatmap(z=z, x=dims, y=rows, hovertemplate=vec, meta=what, **signed), 2, col
        )
    for col, (z, what, scale) in enumerate(
        (
            (neuron.dots, "q·k", signed),
            (neuron.scaled, f"q·k × {neuron.scale:.4g}", signed),
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
    return _layout(
        fig,
        f"Neuron view: head {neuron.head}, query '{tokens[neuron.token]}' (#{neuron.token})",
        height=height,
    )


# --- what every figure of tokens can show: the found token, the generated part ------------------
def _token_axes(fig: go.Figure, *, rows: bool = True, cols: bool = True, height=None) -> go.Figure:
    """Mark ``fig`` as a heatmap with tokens on its rows and/or columns (``decorate`` reads it)."""
    meta = {"token_axes": ("y" if rows else "") + ("x" if cols else "")}
    fig.update_layout({"meta": meta} | ({"height": height} if height is not None else {}))
    return fig


def decorate(fig: go.Figure, *, found: int | None = None, generated_from: int | None = None):
    """On a figure of tokens: a box round the found token's row and column, and a dashed line
    where the generated text begins (tokens ``generated_from`` on). The line view gets the
    same on its two columns. Figures without tokens are returned unchanged."""
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    axes = meta.get("token_axes", "")
    line = meta.get("line_view", False)
    if found is not None:
        box = {"color": "#d62728", "width": 2}
        if line:
            for x in (0.0, 1.0):
                fig.add_shape(
                    type="rect",
                    x0=x - 0.03,
                    x1=x + 0.03,
                    y0=-found - 0.45,
                    y1=-found + 0.45,
                    line=box,
                )
        if "y" in axes:
            fig.add_shape(
                type="rect", xref="x domain", x0=0, x1=1, y0=found - 0.5, y1=found + 0.5, line=box
            )
        if "x" in axes:
            fig.add_shape(
                type="rect", yref="y domain", y0=0, y1=1, x0=found - 0.5, x1=found + 0.5, line=box
            )
    if generated_from is not None:
        dash = {"color": "#2ca02c", "width": 2, "dash": "dash"}
        if line:
            fig.add_shape(
                type="line",
                xref="x domain",
                x0=0,
                x1=1,
                y0=-generated_from + 0.5,
                y1=-generated_from + 0.5,
                line=dash,
            )
        if "y" in axes:
            fig.add_shape(
                type="line",
                xref="x domain",
                x0=0,
                x1=1,
                y0=generated_from - 0.5,
                y1=generated_from - 0.5,
                line=dash,
            )
        if "x" in axes:
            fig.add_shape(
                type="line",
                yref="y domain",
                y0=0,
                y1=1,
                x0=generated_from - 0.5,
                x1=generated_from - 0.5,
                line=dash,
            )
        if axes or line:
            fig.add_annotation(
                text="dashed: generated text begins",
                xref="paper",
                yref="paper",
                x=1,
                y=-0.02,
                showarrow=False,
                font={"color": "#2ca02c"},
            )
    return fig


def _plain(value: Any) -> Any:
    """A label as text again (``label`` escapes it for plotly); other values unchanged."""
    return html.unescape(value) if isinstance(value, str) else value


def figure_data(fig: go.Figure) -> pd.DataFrame:
    """The numbers a figure draws, one row per cell or point: ``trace``, ``x``, ``y`` and, for
    heatmaps, ``value`` (NaN cells left out); a line of the line view is its two ends. Labels
    are plain text (not HTML-escaped as in the figure)."""
    frames = []
    for i, trace in enumerate(fig.data):
        name = _plain(trace.name or trace.meta or f"trace {i}")
        if trace.type == "heatmap":
            z = np.asarray(trace.z, dtype=float)
            if z.ndim == 1:
                z = z[None]
            xs = [_plain(v) for v in trace.x] if trace.x is not None else range(z.shape[1])
            ys = [_plain(v) for v in trace.y] if trace.y is not None else range(z.shape[0])
            r, c = np.nonzero(~np.isnan(z))
            frames.append(
                pd.DataFrame(
                    {
                        "trace": str(name),
                        "y": [ys[j] for j in r],
                        "x": [xs[j] for j in c],
                        "value": z[r, c],
                    }
                )
            )
        elif trace.x is not None and trace.y is not None:
            xs = np.asarray([_plain(v) for v in trace.x], dtype=object)
            ys = np.asarray([_plain(v) for v in trace.y], dtype=object)
            keep = np.array([v is not None and v == v for v in ys], dtype=bool)
            frame = pd.DataFrame({"trace": str(name), "x": xs[keep], "y": ys[keep]})
            if trace.text is not None and not isinstance(trace.text, str):
                frame["text"] = np.asarray([_plain(v) for v in trace.text], dtype=object)[keep]
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

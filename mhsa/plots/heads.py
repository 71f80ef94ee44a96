"""The Heads page: one head at full resolution, every head at a glance, where one token attends
in every head, and the mean over a layer's heads or over a head's layers."""

from __future__ import annotations

import itertools

import numpy as np
import plotly.graph_objects as go

from mhsa.engine.result import AttentionResult
from mhsa.plots.alt import describe_attention, set_alt
from mhsa.plots.common import (
    COLORSCALE,
    apply_layout,
    label,
    matrix_heatmap,
    square_height,
)
from mhsa.plots.marks import mark_token_axes

__all__ = [
    "GRID_THUMB",
    "WEIGHTED_BY_NORM",
    "WEIGHTS",
    "downsample",
    "head_grid",
    "head_heatmap",
    "head_zoom",
    "long_scale",
    "mark_window",
    "mean_heatmap",
    "token_focus",
]

GRID_THUMB = 24  # largest side of a head's thumbnail in the grid, in cells


#: what the views of a result draw, and its top of scale: the weights (0 to 1) or, for
#: ``mhsa.engine.norms_as_attention``'s results, weights times value norms (scaled to their maximum)
WEIGHTS, WEIGHTED_BY_NORM = ("weight", 1.0), ("weight × value norm", None)


def head_heatmap(
    result: AttentionResult,
    layer: int,
    head: int,
    *,
    values: tuple[str, float | None] = WEIGHTS,
    columns: int = 1,
) -> go.Figure:
    """One head, tokens on both axes (cross-attention: the decoder's tokens, the queries,
    down the side; the encoder's, the keys, across the top); ``values``: what the cells hold
    (``WEIGHTS`` or ``WEIGHTED_BY_NORM``). ``layer`` and ``head`` are positions in
    ``result.attention``; the title names the model's own (a partial result's ``layer_ids``);
    ``columns``: figures sharing the page's width (``matrix_heatmap``).

    At full resolution up to ``FULL_SIDE`` tokens a side; a longer input is block-averaged to
    ``FULL_SIDE`` cells (as ``downsample``), each row and column labelled with the token span it
    averages, so that the browser is never sent millions of cells. Over ``LONG_SIDE`` tokens a
    side, weights spread so thin (1/n each) that a 0-to-1 scale shows an empty square: the
    scale then ends at the mean of the rows' largest values (``long_scale``), said on the
    colour bar.
    """
    matrix = result.attention[layer, head]
    rows, cols = result.queries, result.tokens
    note = ""
    if max(matrix.shape) > FULL_SIDE:
        matrix = downsample(matrix.astype(np.float32), FULL_SIDE)
        rows, cols = _spans(rows, matrix.shape[0]), _spans(cols, matrix.shape[1])
        shown = f"{matrix.shape[0]}x{matrix.shape[1]}"
        note = f" ({len(result.queries)}x{len(result.tokens)} shown at {shown})"
    real_layer, real_head = result.layers[layer], result.heads[head]
    name, zmax = values
    if zmax is not None and max(matrix.shape) > LONG_SIDE:
        zmax = long_scale(matrix, zmax)
        name = f"{name} (scale to {zmax:.2g}: the rows' mean largest)"
    fig = matrix_heatmap(
        matrix,
        rows,
        cols,
        title=f"Layer {real_layer}, head {real_head}{_kind_note(result)}{note}",
        value_name=name,
        zmax=zmax,
        height=square_height(max(result.num_queries, result.num_tokens)),
        columns=columns,
        **_axis_titles(result),
    )
    what = f"Head L{real_layer}H{real_head}'s {values[0]}s{_kind_note(result)}"
    pattern = result.attention[layer, head]
    set_alt(fig, describe_attention(pattern, result.queries, result.tokens, what=what))
    return mark_token_axes(fig)


#: tokens a side up to which ``head_heatmap`` draws every cell
FULL_SIDE = 512
#: over this many tokens a side, ``head_heatmap``'s scale ends where a row's strongest cell is
LONG_SIDE = 128


def long_scale(matrix: np.ndarray, top: float) -> float:
    """The top of a long map's colour scale: the mean over rows of each row's largest value
    (for weights, Voita et al.'s confidence; NaN left out), at most ``top`` (the values' own
    scale, 1 for weights) and above 0: where a head looks stays dark however thin its weights
    spread, and a uniform background stays pale."""
    values = np.asarray(matrix, dtype=np.float64)
    largest = np.where(np.isfinite(values), values, -np.inf).max(axis=-1)
    largest = largest[np.isfinite(largest)]
    if largest.size == 0:
        return top
    return float(min(top, max(largest.mean(), 1e-6)))


def head_zoom(
    result: AttentionResult,
    layer: int,
    head: int,
    start: int,
    stop: int,
    *,
    values: tuple[str, float | None] = WEIGHTS,
) -> go.Figure:
    """One head's weights from the tokens ``start`` to ``stop - 1`` to the same keys (at most
    ``FULL_SIDE`` a side), every cell exact: the full-resolution window of a long input whose
    ``head_heatmap`` is block-averaged. Rows and columns are labelled with the tokens' own
    positions in the text. ``layer`` and ``head``: positions in ``result.attention``."""
    start = max(0, start)
    rows = slice(start, min(stop, start + FULL_SIDE, result.num_queries))
    cols = slice(start, min(stop, start + FULL_SIDE, result.num_tokens))
    matrix = result.attention[layer, head, rows, cols]
    fig = matrix_heatmap(
        matrix,
        result.queries[rows],
        result.tokens[cols],
        title=f"Layer {result.layers[layer]}, head {result.heads[head]}{_kind_note(result)}: "
        f"tokens {rows.start}-{rows.stop - 1} at full resolution",
        value_name=values[0],
        zmax=values[1],
        height=square_height(matrix.shape[0]),
        **_axis_titles(result),
    )
    for axis, names, first in (
        ("x", result.tokens[cols], cols.start),
        ("y", result.queries[rows], rows.start),
    ):
        categories = [f"{label(t, 30)} #{first + i}" for i, t in enumerate(names)]
        fig.update_traces({axis: categories})
        ticks = fig.layout[f"{axis}axis"].tickvals
        position = {old: new for old, new in zip(fig.data[0][axis], categories, strict=True)}
        fig.layout[f"{axis}axis"].tickvals = [position.get(t, t) for t in ticks]
    what = (
        f"Head L{result.layers[layer]}H{result.heads[head]}'s {values[0]}s, tokens "
        f"{rows.start}-{rows.stop - 1}"
    )
    queries, keys = result.queries[rows], result.tokens[cols]
    return set_alt(fig, describe_attention(matrix, queries, keys, what=what))


def mark_window(fig: go.Figure, result: AttentionResult, start: int, stop: int) -> go.Figure:
    """Outline on ``head_heatmap``'s figure of ``result`` the square of tokens ``start`` to
    ``stop - 1`` (as ``head_zoom`` draws it), in the cells the figure shows: block-averaged
    cells beyond ``FULL_SIDE`` tokens a side."""
    box = {}
    for axis, n in (("x", result.num_tokens), ("y", result.num_queries)):
        cells = min(n, FULL_SIDE)
        edges = np.linspace(0, n, cells + 1).round().astype(int)  # as ``downsample`` cuts
        first = int(np.searchsorted(edges, min(start, n - 1), side="right")) - 1
        last = int(np.searchsorted(edges, min(stop, n) - 1, side="right")) - 1
        box[f"{axis}0"], box[f"{axis}1"] = first - 0.5, last + 0.5
    fig.add_shape(type="rect", **box, line={"color": "#d62728", "width": 2}, name="zoom")
    return fig


def _spans(tokens: list[str], size: int) -> list[str]:
    """Labels of ``size`` blocks of ``tokens`` (as ``downsample`` cuts them): each block's
    first token and its positions, ``"the #0-7"``."""
    edges = np.linspace(0, len(tokens), size + 1).round().astype(int)
    return [f"{tokens[a]} #{a}-{b - 1}" for a, b in itertools.pairwise(edges)]


def _kind_note(result: AttentionResult) -> str:
    """``", cross attention"`` and the like for one kind of an encoder-decoder's attention."""
    return "" if result.kind is None else f", {result.kind} attention"


def _axis_titles(result: AttentionResult) -> dict[str, str]:
    """The axes' titles of cross-attention (which text each side's tokens are); none else."""
    if result.query_tokens is None:
        return {}
    return {"row_title": "decoder query (from)", "col_title": "encoder key (to)"}


def downsample(matrix: np.ndarray, size: int) -> np.ndarray:
    """Block-average the last two axes to at most ``size`` cells each (rows keep summing to
    the mean mass of their block)."""
    m, n = matrix.shape[-2:]
    if m > size:
        edges = np.linspace(0, m, size + 1).round().astype(int)
        matrix = np.add.reduceat(matrix, edges[:-1], axis=-2) / np.diff(edges)[:, None]
    if n > size:
        edges = np.linspace(0, n, size + 1).round().astype(int)
        matrix = np.add.reduceat(matrix, edges[:-1], axis=-1)
    return matrix


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
    layers, _, m, n = result.attention.shape
    small = downsample(result.attention, thumb)  # (L, H, r, c)
    r, c = small.shape[-2:]
    s = max(r, c)
    if r != c:  # cross-attention: each thumbnail padded (blank) to a square
        small = np.pad(small, [(0, 0), (0, 0), (0, s - r), (0, s - c)], constant_values=np.nan)
    cell = s + 1  # one empty cell between thumbnails
    mosaic = _mosaic(small, cell)
    vmax = float(np.nanpercentile(mosaic, 99)) or 1.0
    fig = go.Figure(
        go.Heatmap(
            z=mosaic, colorscale=COLORSCALE, zmin=0, zmax=vmax, showscale=False, hoverinfo="skip"
        )
    )
    fig.add_trace(_head_markers(result, s, cell))
    if selected is not None:
        _outline_head(fig, selected, s, cell)
    _label_layers_and_heads(fig, result.layers, result.heads, s, cell)
    fig.update_layout(clickmode="event+select", dragmode=False)
    note = f" (each {m}x{n} head shown at {r}x{c})" if (r, c) != (m, n) else ""
    what = "All heads" if result.kind is None else f"All heads, {result.kind} attention"
    apply_layout(fig, f"{what}{note}: click one to enlarge", height=80 + 70 * layers)
    return set_alt(fig, _grid_alt(result, what))


def _grid_alt(result: AttentionResult, what: str) -> str:
    """The grid's finding: the sharpest and the most diffuse head, by the mean weight each
    head's queries put on their strongest key."""
    a = result.attention
    peak = np.nanmax(a, axis=-1).mean(-1)  # (L, H): mean over queries of each row's largest
    sharp = np.unravel_index(np.nanargmax(peak), peak.shape)
    flat = np.unravel_index(np.nanargmin(peak), peak.shape)
    name = [f"L{result.layers[li]}H{result.heads[h]}" for li, h in (sharp, flat)]
    return (
        f"{what} ({a.shape[0]} layers of {a.shape[1]} heads) on {result.num_tokens} tokens: "
        f"the sharpest is {name[0]}, whose queries put {float(peak[sharp]):.2f} on their "
        f"strongest key on average, the most spread out {name[1]} ({float(peak[flat]):.2f})."
    )


def _mosaic(small: np.ndarray, cell: int) -> np.ndarray:
    """The ``[layers, heads, s, s]`` thumbnails side by side in one array, ``cell`` apart (the
    gaps NaN, drawn blank)."""
    layers, heads, s, _ = small.shape
    mosaic = np.full((layers * cell - 1, heads * cell - 1), np.nan, dtype=np.float32)
    for li in range(layers):
        for h in range(heads):
            mosaic[li * cell : li * cell + s, h * cell : h * cell + s] = small[li, h]
    return mosaic


def _head_markers(result: AttentionResult, s: int, cell: int) -> go.Scatter:
    """An invisible marker on the centre of each thumbnail carrying ``[layer, head]``
    (positions in ``result.attention``, for selecting a head by click) and the model's own
    layer and head (for hovering: a partial result's ``layer_ids``/``head_ids``)."""
    layers, heads = result.num_layers, result.num_heads
    centres = np.arange(layers * heads)
    real_layers = np.asarray(result.layers)[centres // heads]
    real_heads = np.asarray(result.heads)[centres % heads]
    return go.Scatter(
        x=(centres % heads) * cell + (s - 1) / 2,
        y=(centres // heads) * cell + (s - 1) / 2,
        mode="markers",
        marker={"symbol": "square", "size": 28, "color": "rgba(0,0,0,0)"},
        customdata=np.stack([centres // heads, centres % heads, real_layers, real_heads], axis=1),
        hovertemplate="layer %{customdata[2]}, head %{customdata[3]}<extra></extra>",
        name="heads",
        showlegend=False,
    )


def _outline_head(fig: go.Figure, selected: tuple[int, int], s: int, cell: int) -> None:
    """A box round the thumbnail of the selected ``(layer, head)``."""
    li, h = selected
    fig.add_shape(
        type="rect",
        x0=h * cell - 0.5,
        x1=h * cell + s - 0.5,
        y0=li * cell - 0.5,
        y1=li * cell + s - 0.5,
        line={"color": "crimson", "width": 3},
    )


def _label_layers_and_heads(
    fig: go.Figure, layers: list[int], heads: list[int], s: int, cell: int
) -> None:
    """Ticks ``H0``.. above the thumbnails' columns and ``L0``.. beside their rows (the
    model's own numbers of the layers and heads shown), the first layer on top, square
    cells."""
    fig.update_xaxes(
        tickmode="array",
        tickvals=[i * cell + (s - 1) / 2 for i in range(len(heads))],
        ticktext=[f"H{h}" for h in heads],
        side="top",
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        tickmode="array",
        tickvals=[i * cell + (s - 1) / 2 for i in range(len(layers))],
        ticktext=[f"L{li}" for li in layers],
        autorange="reversed",
        scaleanchor="x",
        showgrid=False,
        zeroline=False,
    )


def token_focus(
    result: AttentionResult, token: int, *, values: tuple[str, float | None] = WEIGHTS
) -> go.Figure:
    """Where one token (a query: a decoder token for cross-attention) attends, in every head:
    rows are heads, columns are keys."""
    a = result.attention[:, :, token, :]  # (L, H, n)
    rows = result.head_labels()
    fig = matrix_heatmap(
        a.reshape(-1, a.shape[-1]),
        rows,
        result.tokens,
        title=f"Where '{result.queries[token]}' attends, in every head{_kind_note(result)}",
        row_title="head",
        col_title=_axis_titles(result).get("col_title", "key (to)"),
        value_name=values[0],
        zmax=values[1],
        height=min(1400, 120 + 12 * len(rows)),
    )
    flat = a.reshape(-1, a.shape[-1])
    h, k = np.unravel_index(np.nanargmax(flat), flat.shape)
    mean = np.nanmean(flat, axis=0)
    common = int(np.nanargmax(mean))
    set_alt(
        fig,
        f"Where {result.queries[token]!r} (token {token}) attends in each of {len(rows)} "
        f"heads{_kind_note(result)}: most in {rows[h]}, on {result.tokens[k]!r} "
        f"({float(flat[h, k]):.2f}); over all heads its strongest key is "
        f"{result.tokens[common]!r} ({float(mean[common]):.2f} on average).",
    )
    return mark_token_axes(fig, rows=False)


def mean_heatmap(
    result: AttentionResult,
    *,
    layer: int | None = None,
    head: int | None = None,
    values: tuple[str, float | None] = WEIGHTS,
) -> go.Figure:
    """The mean over the heads of ``layer``, or over the layers for ``head``."""
    if layer is not None:
        matrix, title = result.attention[layer].mean(0), f"Layer {layer}, mean over heads"
    elif head is not None:
        matrix, title = result.attention[:, head].mean(0), f"Head {head}, mean over layers"
    else:
        raise ValueError("give a layer or a head")
    fig = matrix_heatmap(
        matrix,
        result.queries,
        result.tokens,
        title=title + _kind_note(result),
        value_name=values[0],
        zmax=values[1],
        height=square_height(max(result.num_queries, result.num_tokens)),
        **_axis_titles(result),
    )
    what = f"{title}{_kind_note(result)} ({values[0]}s)"
    set_alt(fig, describe_attention(matrix, result.queries, result.tokens, what=what))
    return mark_token_axes(fig)

"""The Line view page (BertViz's head view): the tokens in two columns joined by lines whose
opacity is the attention weight, each head in its own colour."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from mhsa.engine.result import AttentionResult
from mhsa.plots.alt import describe_attention, set_alt
from mhsa.plots.common import apply_layout, label
from mhsa.plots.palette import head_style

__all__ = [
    "LINE_BINS",
    "LINE_BUDGET",
    "LINE_DENSE",
    "LINE_MIN_WEIGHT",
    "LINE_TOP_K",
    "line_pairs",
    "line_view",
]

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

    Cross-attention (``result.query_tokens``): the decoder's tokens (queries) on the left,
    the encoder's (keys) on the right.

    Traces: 0 the left tokens, 1 the right tokens (``customdata`` = token index, for
    selecting by click), then per head its legend entry (no points) and one trace per opacity
    level that has lines (``legendgroup`` = head).
    """
    n = max(result.num_queries, result.num_tokens)
    heads = list(range(result.num_heads)) if heads is None else list(heads)
    if top_k is None and n > LINE_DENSE:
        top_k = int(np.clip(LINE_BUDGET // (len(heads) * result.num_queries), 1, LINE_TOP_K))
    yq = -np.arange(result.num_queries, dtype=float)
    yk = -np.arange(result.num_tokens, dtype=float)
    fig = go.Figure()
    cross = result.query_tokens is not None
    for trace in _token_columns(result.queries, result.tokens, yq, yk, cross=cross):
        fig.add_trace(trace)
    dense = n > LINE_DENSE
    for h in heads:
        weights = result.attention[layer, h]
        pairs = line_pairs(weights, token=token, min_weight=min_weight, top_k=top_k)
        # named and coloured by the model's own head (a partial result's ``head_ids``)
        for trace in _head_lines(weights, pairs, result.heads[h], (yq, yk), dense=dense):
            fig.add_trace(trace)
    what = f"lines of '{result.queries[token]}'" if token is not None else "all tokens"
    if result.kind is not None:
        what = f"{result.kind} attention, {what}"
    dense = f", top {top_k} per token" if top_k is not None else ""
    fig.update_xaxes(visible=False, range=[-0.6, 1.6])
    fig.update_yaxes(visible=False, range=[-n + 0.5, 0.8])
    fig.update_layout(
        legend={"title": {"text": "heads (click to toggle)"}, "itemsizing": "constant"},
        clickmode="event+select",
        dragmode=False,
        meta={"line_view": True},
    )
    apply_layout(
        fig,
        f"Layer {result.layers[layer]}, {what}: opacity = weight (weights ≥ {min_weight:g}{dense})",
        height=min(4000, max(480, 140 + (22 if n <= LINE_DENSE else 14) * n)),
    )
    return set_alt(fig, _line_alt(result, layer, heads, token))


def _line_alt(result: AttentionResult, layer: int, heads: list[int], token: int | None) -> str:
    """The line view's finding: the mean pattern of the heads drawn (``describe_attention``),
    or, for one token's lines, the head and key of its strongest line."""
    shown = result.attention[layer, heads]  # (heads, queries, keys)
    where = f"Layer {result.layers[layer]}'s lines, {len(heads)} heads"
    if token is None:
        mean = shown.mean(0)
        return describe_attention(mean, result.queries, result.tokens, what=f"{where} averaged")
    row = shown[:, token, :]
    h, k = np.unravel_index(np.nanargmax(row), row.shape)
    return (
        f"{where}, the lines of {result.queries[token]!r} (token {token}): its strongest is "
        f"head {result.heads[heads[h]]}'s to {result.tokens[k]!r} ({float(row[h, k]):.2f})."
    )


def _token_columns(
    queries: Sequence[str],
    keys: Sequence[str],
    yq: np.ndarray,
    yk: np.ndarray,
    *,
    cross: bool = False,
) -> list[go.Scatter]:
    """The query tokens at heights ``yq`` (the left column, from) and the key tokens at ``yk``
    (the right one, to); each point carries its token's index, for showing only its lines by
    click (``cross``: the columns are named decoder and encoder)."""
    columns = (("from", 0.0, queries, yq), ("to", 1.0, keys, yk))
    return [
        go.Scatter(
            x=np.full(len(tokens), x),
            y=y,
            mode="markers+text",
            text=[label(t, 24) for t in tokens],
            textposition="middle left" if side == "from" else "middle right",
            marker={"size": 8, "color": "rgba(120,120,120,0.35)"},
            customdata=np.arange(len(tokens)),
            hovertemplate=f"%{{text}} (#%{{customdata}}, {side}): click to show only its "
            "lines<extra></extra>",
            showlegend=False,
            name=f"{('decoder' if side == 'from' else 'encoder') if cross else 'tokens'} ({side})",
        )
        for side, x, tokens, y in columns
    ]


def _head_lines(
    weights: np.ndarray,
    pairs: tuple[np.ndarray, np.ndarray],
    head: int,
    y: tuple[np.ndarray, np.ndarray],
    *,
    dense: bool,
) -> list[go.Scatter]:
    """Head ``head``'s traces: its legend entry in full colour (toggling its whole group), then
    one trace per opacity level that has lines, each line from query ``q`` (at height
    ``y[0][q]``) to key ``k`` (``y[1][k]``) of ``pairs`` (a NaN between lines); thinner lines
    when ``dense``."""
    q, k = pairs
    yq, yk = y
    levels = np.clip(np.ceil(weights[q, k] * LINE_BINS), 1, LINE_BINS).astype(int)
    color, dash = head_style(head)
    traces = [
        go.Scatter(
            x=[None],
            y=[None],
            mode="lines",
            line={"color": _rgba(color, 1.0), "width": 3, "dash": dash},
            name=f"head {head}",
            legendgroup=f"H{head}",
            hoverinfo="skip",
        )
    ]
    for level in range(1, LINE_BINS + 1):
        sel = levels == level
        if not sel.any():
            continue
        m = int(sel.sum())
        xs = np.tile([0.0, 1.0, np.nan], m)
        ys = np.column_stack([yq[q[sel]], yk[k[sel]], np.full(m, np.nan)]).ravel()
        traces.append(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line={
                    "color": _rgba(color, level / LINE_BINS),
                    "width": 1 if dense else 2,
                    "dash": dash,
                },
                hoverinfo="skip",
                name=f"head {head}",
                legendgroup=f"H{head}",
                showlegend=False,
                meta={"head": head, "lines": m},
            )
        )
    return traces

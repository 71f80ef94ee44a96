"""Plotly figures of a training run (the Train heads page): loss and accuracy over the steps, the
attention of every head on the probe sequence, and each head's previous-token and induction
scores over the steps with the phase change marked. No torch, no streamlit.

The figures read snapshots (``mhsa.training.TrainSnapshot``: step, loss, accuracy, elapsed,
probe tokens, probe attention ``[layers, heads, n, n]``, previous-token and induction scores
``[layers, heads]``) through two tidy tables, ``snapshot_history`` and ``snapshot_scores``. An
encoder-decoder task's snapshots carry the cross attention ``[layers, heads, n_dec, n_enc]``
and its anti-diagonal scores instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mhsa.heads import head_label
from mhsa.plots.common import COLORSCALE, label
from mhsa.plots.palette import head_style

__all__ = [
    "head_scores_figure",
    "probe_mosaic",
    "snapshot_history",
    "snapshot_scores",
    "training_curves",
]

#: the head scores, as columns of ``snapshot_scores`` and as the figure names them (a run has
#: the first two, or an encoder-decoder's the last)
SCORES = {
    "previous_token": "previous-token score",
    "induction": "induction score",
    "anti_diagonal": "cross-attention anti-diagonal score",
}
PHASE_COLOR = "crimson"


def snapshot_history(snapshots: Sequence[Any]) -> pd.DataFrame:
    """One row per snapshot: step, loss, accuracy, elapsed (seconds)."""
    return pd.DataFrame(
        {
            "step": [s.step for s in snapshots],
            "loss": [float(s.loss) for s in snapshots],
            "accuracy": [float(s.accuracy) for s in snapshots],
            "elapsed": [float(s.elapsed) for s in snapshots],
        }
    )


def snapshot_scores(snapshots: Sequence[Any]) -> pd.DataFrame:
    """One row per snapshot and head: step, layer, head, its label, previous_token, induction
    (snapshots of an encoder-decoder task: anti_diagonal, of its cross-attention heads)."""
    cross = bool(snapshots) and getattr(snapshots[0], "anti_diagonal_scores", None) is not None
    names = ["anti_diagonal"] if cross else ["previous_token", "induction"]
    rows = []
    for s in snapshots:
        arrays = (
            [np.asarray(s.anti_diagonal_scores)]
            if cross
            else [np.asarray(s.previous_token_scores), np.asarray(s.induction_scores)]
        )
        for (layer, head), _ in np.ndenumerate(arrays[0]):
            values = (float(a[layer, head]) for a in arrays)
            rows.append((s.step, layer, head, head_label(layer, head), *values))
    return pd.DataFrame(rows, columns=["step", "layer", "head", "label", *names])


def _titled(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        title={"text": label(title, 120)},
        margin={"l": 10, "r": 10, "t": 90, "b": 10},
        height=height,
        plot_bgcolor="white",
    )
    return fig


def _mark_phase_change(fig: go.Figure, step: int | None, cols: int) -> None:
    """A dashed vertical line at the phase change in each of the ``cols`` panels."""
    if step is None:
        return
    for col in range(1, cols + 1):
        fig.add_vline(
            x=step,
            line={"color": PHASE_COLOR, "dash": "dash", "width": 2},
            annotation={"text": f"phase change, step {step}", "font": {"color": PHASE_COLOR}},
            annotation_position="top left",
            row=1,
            col=col,
        )


def training_curves(
    history: pd.DataFrame, *, steps: int | None = None, phase_change_step: int | None = None
) -> go.Figure:
    """Loss and accuracy against the step, side by side.

    Args:
        history: ``step``, ``loss``, ``accuracy`` columns (``snapshot_history`` or the
            trainer's own history).
        steps: the planned number of steps: the x axis spans them from the start, so that the
            curves grow into a fixed frame while the model trains.
        phase_change_step: marked with a dashed line when given.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "accuracy on the scored part"))
    fig.add_trace(
        go.Scatter(x=history["step"], y=history["loss"], mode="lines", name="loss"), row=1, col=1
    )
    fig.add_trace(
        go.Scatter(x=history["step"], y=history["accuracy"], mode="lines", name="accuracy"),
        row=1,
        col=2,
    )
    if steps:
        fig.update_xaxes(range=[0, steps])
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="cross-entropy", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="accuracy", range=[0, 1.02], row=1, col=2)
    fig.update_layout(showlegend=False)
    _mark_phase_change(fig, phase_change_step, 2)
    return _titled(fig, "Loss and accuracy over the steps", 340)


def _grid(rows: int, cols: int, gap_x: float, gap_y: float) -> list[tuple[list, list]]:
    """Paper domains ``(x, y)`` of a rows x cols grid of panels, row by row from the top."""
    width, height = (1 - (cols - 1) * gap_x) / cols, (1 - (rows - 1) * gap_y) / rows

    def clip(low: float, high: float) -> list[float]:  # rounding must not leave [0, 1]
        return [max(0.0, round(low, 6)), min(1.0, round(high, 6))]

    return [
        (
            clip(c * (width + gap_x), c * (width + gap_x) + width),
            clip(1 - r * (height + gap_y) - height, 1 - r * (height + gap_y)),
        )
        for r in range(rows)
        for c in range(cols)
    ]


#: the axes of a mosaic panel: no ticks, labels or grid (hovering names the tokens)
_HIDDEN_AXIS = {
    "showticklabels": False,
    "ticks": "",
    "showgrid": False,
    "zeroline": False,
    "type": "category",
}


def _panel(
    matrix: np.ndarray,
    names: tuple[list[str], list[str]],
    head: str,
    suffix: str,
    domain: tuple[list, list],
) -> tuple[go.Heatmap, dict, dict]:
    """One head's panel of the mosaic: its heatmap (``names``: its rows', its columns'), its
    two axes' layout, its title."""
    x_domain, y_domain = domain
    trace = go.Heatmap(
        z=np.asarray(matrix, dtype=np.float32),
        x=names[1],
        y=names[0],
        xaxis=f"x{suffix}",
        yaxis=f"y{suffix}",
        coloraxis="coloraxis",
        name=head,
        hovertemplate=f"{head}<br>%{{y}} → %{{x}}<br>weight %{{z:.3f}}<extra></extra>",
    )
    axes = {
        f"xaxis{suffix}": _HIDDEN_AXIS | {"domain": x_domain, "anchor": f"y{suffix}"},
        f"yaxis{suffix}": _HIDDEN_AXIS
        | {"domain": y_domain, "anchor": f"x{suffix}", "autorange": "reversed"},
    }
    title = {
        "text": head,
        "x": sum(x_domain) / 2,
        "y": y_domain[1],
        "xref": "paper",
        "yref": "paper",
        "xanchor": "center",
        "yanchor": "bottom",
        "showarrow": False,
    }
    return trace, axes, title


def probe_mosaic(
    tokens: Sequence[str],
    attention: np.ndarray,
    *,
    step: int | None = None,
    key_tokens: Sequence[str] | None = None,
) -> go.Figure:
    """Every head's attention on the probe sequence: a layers x heads mosaic of heatmaps at full
    resolution (the probe is short), rows the query, columns the key, 0 to 1 on one scale.
    Hovering names the head and both tokens. With ``key_tokens`` (the encoder's tokens) the
    attention is cross attention ``[layers, heads, len(tokens), len(key_tokens)]``: rows the
    decoder's tokens, columns the encoder's.

    The layout is written out in one piece (the panels' axes and titles) rather than through
    ``make_subplots`` and an update per axis, which took most of the time of a figure the page
    redraws every second while it trains."""
    layers, heads, n, _ = attention.shape
    rows = [f"{label(t, 20)} #{i}" for i, t in enumerate(tokens)]
    columns = (
        rows if key_tokens is None else [f"{label(t, 20)} #{i}" for i, t in enumerate(key_tokens)]
    )
    names = (rows, columns)
    traces, layout, titles = [], {}, []
    domains = _grid(layers, heads, 0.02, 0.06 if layers > 1 else 0.0)
    for k, domain in enumerate(domains):
        li, h = divmod(k, heads)
        trace, axes, title = _panel(
            attention[li, h], names, head_label(li, h), str(k + 1) if k else "", domain
        )
        traces.append(trace)
        layout |= axes
        titles.append(title)
    layout["annotations"] = titles
    layout["coloraxis"] = {
        "colorscale": COLORSCALE,
        "cmin": 0,
        "cmax": 1,
        "colorbar": {"thickness": 12, "title": {"text": "weight"}},
    }
    when = f" at step {step}" if step is not None else ""
    cell = max(110, min(220, 900 // heads))
    axes = (
        f"rows: query, columns: key; {n} tokens"
        if key_tokens is None
        else f"cross attention, rows: the decoder's {n} tokens, columns: the encoder's "
        f"{len(columns)}"
    )
    return _titled(
        go.Figure(traces, layout),
        f"Every head on the probe sequence{when} ({axes})",
        90 + cell * layers,
    )


def head_scores_figure(
    scores: pd.DataFrame,
    *,
    steps: int | None = None,
    phase_change_step: int | None = None,
    threshold: float | None = None,
) -> go.Figure:
    """Each head's previous-token and induction scores (an encoder-decoder's: anti-diagonal
    scores) against the step (``snapshot_scores``), one line per head in the same colour in
    every panel, the phase change marked.

    Args:
        scores: ``snapshot_scores``.
        steps: the planned number of steps (the x axis spans them from the start).
        phase_change_step: marked with a dashed line when given.
        threshold: the induction score that counts as the phase change, a dotted line on the
            induction panel.
    """
    panels = [c for c in SCORES if c in scores.columns]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[SCORES[c] for c in panels])
    traces = []
    for i, (name, rows) in enumerate(scores.groupby("label", sort=False)):
        color, dash = head_style(i)
        for col, column in enumerate(panels, start=1):
            axes = "" if col == 1 else str(col)
            traces.append(
                go.Scatter(
                    x=rows["step"].to_numpy(),
                    y=rows[column].to_numpy(),
                    xaxis=f"x{axes}",
                    yaxis=f"y{axes}",
                    mode="lines",
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    line={"color": color, "dash": dash},
                    hovertemplate=f"{name} step %{{x}}<br>{SCORES[column]} "
                    "%{y:.3f}<extra></extra>",
                )
            )
    fig.add_traces(traces)  # at once, each naming its panel: one at a time cost most of the time
    if steps:
        fig.update_xaxes(range=[0, steps])
    fig.update_xaxes(title="step")
    fig.update_yaxes(range=[0, 1.02], title="attention share")
    if threshold is not None and "induction" in panels:
        fig.add_hline(
            y=threshold,
            line={"color": PHASE_COLOR, "dash": "dot", "width": 1},
            annotation={"text": "phase change threshold", "font": {"color": PHASE_COLOR}},
            annotation_position="bottom right",
            row=1,
            col=panels.index("induction") + 1,
        )
    _mark_phase_change(fig, phase_change_step, len(panels))
    return _titled(fig, "What each head attends to, over the steps", 380)

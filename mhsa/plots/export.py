"""The numbers a figure draws, as a table (the pages' CSV downloads)."""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

__all__ = ["NOT_EXPORTED", "figure_data"]

#: a trace's ``meta`` that keeps it out of ``figure_data``: invisible click targets repeating
#: what another trace draws (``weights.clickable_cells``)
NOT_EXPORTED = "not exported"


def _plain(value: Any) -> Any:
    """A label as text again (``label`` escapes it for plotly); other values unchanged."""
    return html.unescape(value) if isinstance(value, str) else value


def figure_data(fig: go.Figure) -> pd.DataFrame:
    """The numbers a figure draws, one row per cell or point: ``trace``, ``x``, ``y`` and, for
    heatmaps, ``value`` (NaN cells left out); a line of the line view is its two ends. Labels
    are plain text (not HTML-escaped as in the figure). Traces marked ``NOT_EXPORTED`` are
    left out."""
    frames = []
    for i, trace in enumerate(fig.data):
        if trace.meta == NOT_EXPORTED:
            continue
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

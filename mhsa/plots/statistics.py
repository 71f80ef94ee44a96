"""The Head statistics page: one statistic per head as a layers x heads map."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from mhsa.analysis.stats import stat_label
from mhsa.plots.common import matrix_heatmap

__all__ = ["stat_grid"]


def stat_grid(stats: pd.DataFrame, column: str) -> go.Figure:
    """One statistic as a layers x heads heatmap, titled in plain words (``stat_label``)."""
    table = stats.pivot(index="layer", columns="head", values=column)
    return matrix_heatmap(
        table.to_numpy(),
        [f"L{li}" for li in table.index],
        [f"H{h}" for h in table.columns],
        title=stat_label(column),
        row_title="layer",
        col_title="head",
        zmin=None,
        value_name=column,
        height=80 + 45 * len(table),
    )

"""The Patching page: activation and attribution patching per head as layers x heads maps side
by side, one against the other, and per head and position for one layer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mhsa.causal.patching import PatchingAgreement, patching_agreement
from mhsa.plots.common import SIGNED_COLORSCALE, apply_layout, label, matrix_heatmap
from mhsa.plots.roles import role_maps

__all__ = ["patching_maps", "patching_positions_figure", "patching_scatter"]


def _limit(values: np.ndarray) -> float:
    """A symmetric colour range around 0 that holds every value (at least -1 to 1: an effect
    of 1 restores the clean run)."""
    return max(1.0, float(np.abs(values[np.isfinite(values)]).max(initial=0.0)))


def patching_maps(panels: Sequence[tuple[str, pd.DataFrame]], *, title: str) -> go.Figure:
    """Each table's ``effect`` (``mhsa.causal.patching``: one row per head) as a layers x heads map,
    side by side on one signed colour scale centred on 0."""
    return role_maps(
        [(name, table, "effect") for name, table in panels],
        title=title,
        signed=True,
        value_name="effect",
    )


def patching_scatter(exact: pd.DataFrame, attribution: pd.DataFrame, r: float) -> go.Figure:
    """Each head's effect by exact patching against attribution patching's estimate, with the
    diagonal where they agree, the heads that matter named (``patching_agreement``), and in
    the title how many of them the estimate ranks alike. ``r`` (Pearson's, over every head)
    goes on the hover of the diagonal only: with most heads near 0 it says little."""
    agreement = patching_agreement(exact, attribution)
    joined = exact[["effect"]].join(
        attribution[["effect"]].rename(columns={"effect": "effect_attribution"})
    )
    x = joined["effect"].to_numpy(dtype=np.float64)
    y = joined["effect_attribution"].to_numpy(dtype=np.float64)
    finite = np.concatenate([x[np.isfinite(x)], y[np.isfinite(y)], [0.0, 1.0]])
    low, high = float(finite.min()), float(finite.max())
    fig = go.Figure(
        [
            go.Scatter(
                x=[low, high],
                y=[low, high],
                mode="lines",
                line={"color": "#999", "dash": "dot"},
                hovertemplate=f"where they agree (Pearson r over every head {r:.2f})"
                "<extra></extra>",
                name="agree",
            ),
            go.Scatter(
                x=x,
                y=y,
                mode="markers",
                marker={"size": 8},
                customdata=np.array(joined.index, dtype=object)[:, None],
                hovertemplate="%{customdata[0]}<br>exact %{x:.3f}<br>attribution %{y:.3f}"
                "<extra></extra>",
                name="head",
            ),
            go.Scatter(
                x=list(agreement.exact),
                y=list(agreement.estimated),
                mode="text",
                text=[label(h) for h in agreement.heads],
                textposition="top center",
                hoverinfo="skip",
                showlegend=False,
                name="the heads that matter",
            ),
        ]
    )
    fig.update_xaxes(title="exact patching (effect)")
    fig.update_yaxes(title="attribution patching (estimated effect)")
    return apply_layout(fig, f"Exact against attribution: {agreement_title(agreement)}")


def agreement_title(agreement: PatchingAgreement) -> str:
    """How the estimate ranks the heads that matter, in a few words (the scatter's title)."""
    k, found = len(agreement.heads), agreement.found
    if k == 0:
        return "no head has an exact effect"
    opposite = f"; opposite signs: {', '.join(agreement.opposite)}" if agreement.opposite else ""
    if k == 1:
        first = "ranks first by both" if found else "is not attribution's first"
        return f"the head that matters, {agreement.heads[0]}, {first}{opposite}"
    return f"{agreement.claim().text}{opposite}"


def patching_positions_figure(frame: pd.DataFrame) -> go.Figure:
    """``mhsa.causal.patch_positions``'s table as heads x positions, the clean tokens on the x axis
    (``clean → corrupted`` where the two texts differ)."""
    grid = frame.pivot(index="head", columns="position", values="effect")
    tokens = frame.drop_duplicates("position").sort_values("position")
    names = [
        t if t == c else f"{t} → {c}"
        for t, c in zip(tokens["token"], tokens["corrupted_token"], strict=True)
    ]
    layer = int(frame["layer"].iloc[0])
    z = grid.to_numpy(dtype=np.float64)
    high = _limit(z)
    return matrix_heatmap(
        z,
        [f"L{layer}H{h}" for h in grid.index],
        names,
        title=f"Layer {layer}: each head patched at one position (effect)",
        row_title="head",
        col_title="position (clean token → corrupted token)",
        zmin=-high,
        zmax=high,
        colorscale=SIGNED_COLORSCALE,
        value_name="effect",
        height=min(900, 160 + 28 * len(grid.index)),
    )

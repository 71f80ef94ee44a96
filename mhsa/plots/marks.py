"""What every figure of tokens can show: a box round the found token, a dashed line where the
generated text begins. Views mark which of their axes hold tokens (``mark_token_axes``; the line
view sets ``meta["line_view"]``) and ``decorate`` reads the mark."""

from __future__ import annotations

import plotly.graph_objects as go

__all__ = ["decorate", "mark_token_axes"]

_FOUND = {"color": "#d62728", "width": 2}
_GENERATED = {"color": "#2ca02c", "width": 2, "dash": "dash"}


def mark_token_axes(
    fig: go.Figure, *, rows: bool = True, cols: bool = True, height: int | None = None
) -> go.Figure:
    """Mark ``fig`` as a heatmap with tokens on its rows and/or columns (``decorate`` reads it)."""
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    meta = {**meta, "token_axes": ("y" if rows else "") + ("x" if cols else "")}
    fig.update_layout({"meta": meta} | ({"height": height} if height is not None else {}))
    return fig


def decorate(
    fig: go.Figure, *, found: int | None = None, generated_from: int | None = None
) -> go.Figure:
    """On a figure of tokens: a box round the found token's row and column, and a dashed line
    where the generated text begins (tokens ``generated_from`` on). The line view gets the
    same on its two columns. Figures without tokens are returned unchanged."""
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    axes = meta.get("token_axes", "")
    line = meta.get("line_view", False)
    if found is not None:
        _box_found_token(fig, found, axes=axes, line=line)
    if generated_from is not None:
        _mark_generated_text(fig, generated_from, axes=axes, line=line)
    return fig


def _box_found_token(fig: go.Figure, found: int, *, axes: str, line: bool) -> None:
    """A box round token ``found``: on both columns of the line view, across its row and/or
    column of a heatmap."""
    if line:
        for x in (0.0, 1.0):
            fig.add_shape(
                type="rect",
                x0=x - 0.03,
                x1=x + 0.03,
                y0=-found - 0.45,
                y1=-found + 0.45,
                line=_FOUND,
            )
    for axis in "yx":
        if axis in axes:
            fig.add_shape(type="rect", **_across(axis, found - 0.5, found + 0.5), line=_FOUND)


def _mark_generated_text(fig: go.Figure, start: int, *, axes: str, line: bool) -> None:
    """A dashed line before token ``start`` (the first generated one) across the line view
    and/or the heatmap's token axes, and a note saying what the dashes mean."""
    if line:
        fig.add_shape(
            type="line",
            xref="x domain",
            x0=0,
            x1=1,
            y0=-start + 0.5,
            y1=-start + 0.5,
            line=_GENERATED,
        )
    for axis in "yx":
        if axis in axes:
            fig.add_shape(type="line", **_across(axis, start - 0.5, start - 0.5), line=_GENERATED)
    if axes or line:
        fig.add_annotation(
            text="dashed: generated text begins",
            xref="paper",
            yref="paper",
            x=1,
            y=-0.02,
            showarrow=False,
            font={"color": _GENERATED["color"]},
        )


def _across(axis: str, low: float, high: float) -> dict:
    """A shape's coordinates from ``low`` to ``high`` on the token axis ``axis`` ("x" or "y"),
    over the whole plot along the other axis."""
    other = "x" if axis == "y" else "y"
    return {f"{other}ref": f"{other} domain", f"{other}0": 0, f"{other}1": 1} | {
        f"{axis}0": low,
        f"{axis}1": high,
    }

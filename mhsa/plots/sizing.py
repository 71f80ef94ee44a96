"""Figures readable on a projector: every font of a figure at least a size (presentation
mode), whatever sizes the figure's own module chose for its ticks, titles and colour bars."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

__all__ = [
    "DEFAULT_HEIGHT",
    "PRESENTATION_FONT",
    "PRESENTATION_GROWTH",
    "PRESENTATION_TITLE_FONT",
    "enlarge_fonts",
]

#: the smallest font of a figure in presentation mode (px), and of its title
PRESENTATION_FONT = 20
PRESENTATION_TITLE_FONT = 28
#: presentation mode grows a figure of a set height by this factor: its larger labels take
#: room from the margins' side, and the plot area keeps about its size (a head's map shrank
#: from 295 to 240 px without it)
PRESENTATION_GROWTH = 1.4

#: the height Streamlit (and plotly) draw a figure of no set height at (px)
DEFAULT_HEIGHT = 450

#: trace types that draw a colour bar of their own (others use a shared ``coloraxis``)
_COLORBAR_TRACES = ("heatmap", "contour", "histogram2d", "histogram2dcontour")


def _at_least(font: dict[str, Any] | None, size: int) -> dict[str, Any]:
    """``font`` with its size raised to ``size`` (a larger size is kept)."""
    font = dict(font or {})
    font["size"] = max(font.get("size") or 0, size)
    return font


def _axis(axis: dict[str, Any], size: int) -> dict[str, Any]:
    """An axis' (or colour axis's bar's) tick labels and title at least ``size``."""
    title = axis.get("title") or {}
    return {
        "tickfont": _at_least(axis.get("tickfont"), size),
        "title": {"font": _at_least(title.get("font"), size)},
    }


def enlarge_fonts(
    fig: go.Figure, size: int = PRESENTATION_FONT, title: int = PRESENTATION_TITLE_FONT
) -> go.Figure:
    """``fig`` with every font at least ``size`` px: the default font, every axis' tick labels
    and title, colour bars (a trace's own or a colour axis'), annotations (subplot titles),
    the legend and the hover label; the figure's title at least ``title`` px; a set height
    grown by ``PRESENTATION_GROWTH`` (no set height: ``DEFAULT_HEIGHT``). Reads one plain copy of
    the layout and writes once
    (plotly validates every attribute access)."""
    layout = fig.layout.to_plotly_json()
    update: dict[str, Any] = {
        "font": _at_least(layout.get("font"), size),
        "hoverlabel": {"font": _at_least(layout.get("hoverlabel", {}).get("font"), size)},
        "legend": {"font": _at_least(layout.get("legend", {}).get("font"), size)},
        "title": {"font": _at_least(layout.get("title", {}).get("font"), title)},
    }
    for name, value in layout.items():
        if name.startswith(("xaxis", "yaxis")) and isinstance(value, dict):
            update[name] = _axis(value, size)
        elif name.startswith("coloraxis") and isinstance(value, dict):
            update[name] = {"colorbar": _axis(value.get("colorbar") or {}, size)}
    # a figure of no set height is drawn at Streamlit's default height: grown from that
    update["height"] = round((layout.get("height") or DEFAULT_HEIGHT) * PRESENTATION_GROWTH)
    if layout.get("annotations"):
        update["annotations"] = [
            {**a, "font": _at_least(a.get("font"), size)} for a in layout["annotations"]
        ]
    fig.update_layout(update)
    for trace in fig.data:
        if trace.type in _COLORBAR_TRACES:
            bar = trace.colorbar.to_plotly_json() if trace.colorbar is not None else {}
            trace.update(colorbar=_axis(bar, size))
        trace.update(hoverlabel={"font": {"size": size}})
        font = getattr(trace, "textfont", None)
        if font is not None and font.size is not None and font.size < size:  # written labels
            trace.update(textfont={"size": size})
    return fig

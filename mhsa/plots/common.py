"""What every figure shares: the app's colours, escaped labels, token axes, the layout every
figure starts from, margins that fit the labels, and the labelled heatmap most views are made of.

Every label that comes from user text goes through ``label`` (HTML-escaped: plotly renders tags
such as ``<b>`` in tick labels and hovers), and token axes have one category per position with
the token as tick text, so repeated tokens ("the" twice) keep their own rows and columns.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

__all__ = [
    "COLORSCALE",
    "COLORWAY",
    "COLUMN_TITLE_WIDTH",
    "HORIZONTAL_COLORBAR",
    "MAX_TICKS",
    "MIN_HEIGHT",
    "SIGNED_COLORSCALE",
    "TEMPLATE",
    "apply_layout",
    "boxes_overlap",
    "fit_margins",
    "label",
    "layout_props",
    "matrix_heatmap",
    "signed_color",
    "signed_scale",
    "square_height",
    "text_box",
    "tick_room",
    "title_pad",
    "title_text",
    "token_axis",
]

#: The chart colours of Streamlit's light theme (the app's theme, .streamlit/config.toml) as its
#: frontend fills in the placeholders of the "streamlit" plotly template, which ``import
#: streamlit`` makes plotly's default. Every figure of the app carries ``TEMPLATE`` instead, so
#: that a figure saved as HTML (the page's zip) has these colours: with Streamlit's template it
#: kept the placeholders (#000001 to #000040, near-black), which only Streamlit's browser code
#: replaces (and the app's plotly element then has nothing left to replace).
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
MAX_TICKS = 64  # beyond this, tick labels are thinned (hover still names every cell)
TICK_PX = 16  # the least room a token tick label gets (px): closer ones are thinned
MIN_HEIGHT = 360  # the least height of a figure given one (px): a 2-layer map needs room
TITLE_WIDTH = 56  # characters of a title's line: longer titles wrap (plotly cuts, not wraps)
COLUMN_TITLE_WIDTH = 18  # the same for a figure drawn in a third or a quarter of the page
PAGE_PX = 880  # the width a figure spanning the page's main column is drawn at (px), about


def label(text: str, limit: int = 40) -> str:
    """A user-supplied string made safe and short for a plotly label (escaped, one line).
    ``#`` is written ``&#35;`` (plotly shows it as ``#``): Streamlit's plotly element replaces
    ``#000001`` to ``#000040`` anywhere in a figure's spec with its theme's colours, so the
    word "#000001" would have been shown as "#0068c9"."""
    clean = "".join(ch if ch.isprintable() else "\ufffd" for ch in str(text))
    if len(clean) > limit:
        clean = clean[: limit - 1] + "…"
    return html.escape(clean, quote=False).replace("#", "&#35;") or "\u2423"


def signed_scale(values: object, *, at_least: float = 0.0, axis: bool = False) -> dict[str, object]:
    """The colour settings of every map of signed values: ``SIGNED_COLORSCALE`` with its white
    point at 0, the bounds ``-b`` and ``b`` for ``b`` the largest |value| (NaN and inf left
    out; at least ``at_least``; 1 when every value is 0), so that a value near 0 looks white
    and a red and a blue cell of the same depth are the same size. ``axis``: as a coloraxis'
    ``cmin``/``cmax``/``cmid`` (several heatmaps on one scale), else a trace's ``zmin``..."""
    z = np.asarray(values, dtype=np.float64)
    finite = np.abs(z[np.isfinite(z)])
    bound = max(float(finite.max(initial=0.0)), at_least) or 1.0
    prefix = "c" if axis else "z"
    return {
        "colorscale": SIGNED_COLORSCALE,
        f"{prefix}min": -bound,
        f"{prefix}max": bound,
        f"{prefix}mid": 0.0,
    }


def signed_color(value: float, bound: float) -> str:
    """The colour of ``value`` on ``signed_scale``'s scale of bounds ``-bound`` to ``bound``
    (lines and markers drawn in a map's colours)."""
    from plotly.colors import sample_colorscale

    position = 0.5 + 0.5 * max(-1.0, min(1.0, value / (bound or 1.0)))
    return sample_colorscale(SIGNED_COLORSCALE, [position])[0]


def token_axis(names: Sequence[str], max_ticks: int = MAX_TICKS) -> tuple[list[str], dict]:
    """Unique category per position ("cat #2": repeated tokens keep their own row) and tick
    labels showing the tokens themselves, thinned beyond ``max_ticks`` (every k-th shown, and
    the last)."""
    categories = [f"{label(t, 30)} #{i}" for i, t in enumerate(names)]
    step = max(1, -(-len(names) // max(1, max_ticks)))
    idx = list(range(0, len(names), step))
    if len(idx) > 1:
        idx[-1] = len(names) - 1  # the last token ([SEP], the end) stays named, a step apart
    axis = {
        "type": "category",
        "tickmode": "array",
        "tickvals": [categories[i] for i in idx],
        "ticktext": [label(names[i], 20) for i in idx],
        "showgrid": False,
    }
    return categories, axis


def title_text(title: str, width: int = TITLE_WIDTH) -> str:
    """``title`` escaped (``label``, at most 120 characters) and wrapped at word boundaries into
    lines of at most ``width`` characters joined by `` <br>``: plotly draws a title on one line
    and cuts it at the figure's edge ("Q-composition: what each later head reads from eac" in
    a third of the page)."""
    clean = html.unescape(label(title, 120))  # printable and short; escaped again per line
    lines = textwrap.wrap(clean, width, break_long_words=True) or [clean]
    # each line but the last keeps its space: the rendered text reads as the title's own
    return " <br>".join(label(line, width + 1) for line in lines)


def layout_props(title: str, height: int | None = None, *, title_width: int = TITLE_WIDTH) -> dict:
    """The layout every figure starts from: its title (escaped, wrapped at ``title_width``
    characters: ``title_text``), margins, height (at least ``MIN_HEIGHT``), background."""
    return {
        "title": {"text": title_text(title, title_width)},
        "margin": {"l": 10, "r": 10, "t": 110, "b": 10},
        "height": None if height is None else max(MIN_HEIGHT, height),
        "plot_bgcolor": "white",
    }


def apply_layout(
    fig: go.Figure, title: str, *, height: int | None = None, title_width: int = TITLE_WIDTH
) -> go.Figure:
    """``fig`` with the layout every figure starts from (``layout_props``)."""
    fig.update_layout(layout_props(title, height, title_width=title_width))
    return fig


#: average width of a glyph of plotly's default font (Open Sans), in font sizes
_GLYPH = 0.62
#: plotly draws a title of several lines anchored at its top about this many font sizes
#: higher than one of a single line (measured in Chromium: 0.7 em above, plus the line's
#: cap height): without room for it the first line is cut at the figure's top edge
_MULTILINE_TITLE_RISE = 1.0


def title_pad(lines: int, size: float) -> int:
    """The room (px) above a title of ``lines`` lines in ``size`` px that keeps its first line
    inside the figure: 10, and for several lines the height plotly raises them by."""
    return 10 + (int(_MULTILINE_TITLE_RISE * size + 0.5) if lines > 1 else 0)


def text_box(
    x: float, y: float, text: str, size: float, position: str = "top center"
) -> tuple[float, float, float, float]:
    """The box ``(left, bottom, right, top)`` in px (y up) that a scatter trace's text label
    ``text`` in ``size`` px covers beside its point at ``(x, y)`` px, at plotly's
    ``textposition`` ``position`` (an estimate: ``_GLYPH`` a character, 1.2 sizes a line)."""
    width, height = len(html.unescape(text)) * _GLYPH * size, 1.2 * size
    vertical, horizontal = position.split()
    left = {"left": x - 4 - width, "center": x - width / 2, "right": x + 4}[horizontal]
    bottom = {"top": y + 5, "middle": y - height / 2, "bottom": y - 5 - height}[vertical]
    return left, bottom, left + width, bottom + height


def boxes_overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two boxes ``(left, bottom, right, top)`` overlap (touching is not)."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


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
    once: plotly validates every attribute read and write, which made the many small reads and
    writes a visible share of the server's work for a typed sentence."""
    layout = fig.layout.to_plotly_json()
    size = layout.get("font", {}).get("size") or 12
    glyph = _GLYPH * size
    line = 1.6 * size
    need = {"l": 10.0, "r": 10.0, "t": 10.0, "b": 10.0}
    title = layout.get("title", {})
    lines = 1 + str(title.get("text") or "").count("<br>")
    title_size = title.get("font", {}).get("size") or size + 5
    pad = title_pad(lines, title_size)
    if title.get("text"):  # the pad, the lines, and 10 px under them
        need["t"] += pad - 10 + 1.6 * lines * title_size + 10
    for name in ("xaxis", "yaxis"):
        axis = layout.get(name, {})
        if axis.get("visible") is False:
            continue
        chars = _tick_chars(fig, name, axis)
        side = axis.get("side") or ("left" if name == "yaxis" else "bottom")
        turned = name == "yaxis" or side == "top" or chars > 8  # long labels turn
        ticks = 0 if not chars else chars * glyph + 8 if turned else line + 8
        need[side[0]] += ticks + (line + 4 if axis.get("title", {}).get("text") else 0)
    bars = [
        t
        for t in fig.data
        if getattr(t, "showscale", None) is not False and t.type in ("heatmap", "histogram2d")
    ]
    if any(t.colorbar.orientation == "h" for t in bars):  # a colour bar under the map
        need["b"] += 30 + 3 * line  # its ticks, its title and the empty line under it
    elif bars:
        need["r"] += 60 + glyph * 6
    margin = layout.get("margin", {})
    update: dict = {
        "margin": {k: max(int(need[k]), margin.get(k) or 0) for k in need},
        "title": {"yref": "container", "y": 1, "yanchor": "top", "pad": {"t": pad}},
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
    columns: int = 1,
) -> go.Figure:
    """A labelled heatmap with exact values on hover; ``rows``/``cols`` are escaped here.
    ``columns``: how many figures share the page's width with this one (1: the whole width);
    in a column, the title wraps at ``COLUMN_TITLE_WIDTH`` characters and the column labels
    are upright and thinned to the column's room (``tick_room``).

    The browser gets the matrix (float32, binary-encoded by plotly) and one label per row and
    column; hover text is assembled from those, not stored per cell. With
    ``SIGNED_COLORSCALE`` the scale is ``signed_scale``'s, centred on 0 (``zmin``/``zmax``,
    where given, only widen it).
    """
    # a figure of the page's width keeps every label up to MAX_TICKS (as it always did); one
    # in a column gets what its height and width hold
    y, y_axis = token_axis(rows, tick_room(height) if columns > 1 else MAX_TICKS)
    across = MAX_TICKS
    if columns > 1:
        across = min(tick_room(height), tick_room(PAGE_PX // columns))
    x, x_axis = token_axis(cols, across)
    if columns > 1:
        x_axis["tickangle"] = -90  # turned labels' boxes overlap; upright ones a column apart
    scale: dict[str, object] = {"colorscale": colorscale, "zmin": zmin, "zmax": zmax}
    if colorscale == SIGNED_COLORSCALE:
        widest = max(abs(v) for v in (zmin or 0.0, zmax or 0.0))
        scale = signed_scale(matrix, at_least=widest)
    heatmap = go.Heatmap(
        z=np.asarray(matrix, dtype=np.float32),
        x=x,
        y=y,
        **scale,
        hovertemplate=f"%{{y}} → %{{x}}<br>{value_name} %{{z:.4f}}<extra></extra>",
        colorbar=_colorbar(value_name, columns),  # the same legend everywhere
    )
    title_width = TITLE_WIDTH if columns == 1 else COLUMN_TITLE_WIDTH
    if columns > 1:  # the rows keep their room under a wrapped title, over the colour bar
        lines = title_text(title, title_width).count("<br>")
        height = (height or 450) + 28 * lines + 80
    layout = layout_props(
        title, height, title_width=title_width
    ) | {  # one validated layout, not one update per part
        "xaxis": {"title": {"text": col_title}, "side": "top", **x_axis},
        "yaxis": {"title": {"text": row_title}, "autorange": "reversed", **y_axis},
    }
    return go.Figure(heatmap, layout)


def tick_room(height: int | None) -> int:
    """How many token tick labels fit along a side of a figure ``height`` px tall, or wide
    (its plot area: the side less the labels', title's or colour bar's margins, ``TICK_PX`` a
    label), at most ``MAX_TICKS``; a figure of unknown height (Streamlit's default, 450 px) as
    450."""
    return max(2, min(MAX_TICKS, ((height or 450) - 160) // TICK_PX))


#: a colour bar lying under a map: its title on top, over an empty line (plotly sets a
#: lying bar's title on the bar's top edge, which hid "weight", "pattern", "Q-comp." in
#: Chromium; a title on its right took most of a column's width from the bar)
HORIZONTAL_COLORBAR = {"title_gap": " <br> "}


def _colorbar(value_name: str, columns: int) -> dict:
    """A heatmap's colour bar: upright on the right, its title on top; in a column, lying
    under the map (beside it, it took half of a quarter page's width), its title over an
    empty line (``HORIZONTAL_COLORBAR``)."""
    bar = {"thickness": 12, "title": {"text": value_name, "side": "top"}}
    if columns > 1:
        bar |= {"orientation": "h", "y": 0, "yref": "container", "yanchor": "bottom"}
        text = value_name + HORIZONTAL_COLORBAR["title_gap"]
        bar |= {"title": {"text": text, "side": "top"}, "ypad": 10}
    return bar


def square_height(n: int) -> int:
    """Pixels for an n x n token map: readable rows, within one screen."""
    return min(900, max(420, 18 * n + 120))

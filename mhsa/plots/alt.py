"""Text alternatives of figures (WCAG 2.1 1.1.1): one sentence naming what a figure shows and
its main finding, made from the figure's own numbers.

A figure function that knows what its numbers mean stores its sentence with ``set_alt`` (in
``fig.layout.meta["alt"]``, which travels with the figure and which plotly.js ignores);
``alt_text`` returns it, or else one made from the figure's data (``figure_data``): the
largest value of its heatmap and where it is, or the highest point of its curves or bars.
``describe_attention`` is the finding of an attention pattern: where most queries' strongest
key is (themselves, the token before or after, the first or last token, or the token after an
earlier copy of their own, the induction pattern of Olsson et al. 2022).
"""

from __future__ import annotations

import html
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from mhsa.plots.export import NOT_EXPORTED

__all__ = ["alt_text", "describe_attention", "set_alt"]

_TAG = re.compile(r"<[^>]+>")


def plain(text: object) -> str:
    """Plotly text as people read it: tags (``<br>``, ``<b>``) out, entities decoded, spaces
    collapsed."""
    return " ".join(html.unescape(_TAG.sub(" ", str(text))).split())


def set_alt(fig: go.Figure, sentence: str) -> go.Figure:
    """Store ``sentence`` as ``fig``'s text alternative (``fig.layout.meta["alt"]``, beside
    whatever else the figure's meta holds); returns ``fig``."""
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    fig.update_layout(meta={**meta, "alt": plain(sentence)})
    return fig


def _title(fig: go.Figure) -> str:
    title = fig.layout.title.text if fig.layout.title is not None else None
    return plain(title) if title else "A figure"


def _number(value: float) -> str:
    return f"{value:.3g}"


def _heatmap_finding(trace: go.Heatmap) -> str | None:
    z = np.asarray(trace.z, dtype=float)
    if z.ndim == 1:
        z = z[None]
    if z.size == 0 or np.isnan(z).all():
        return None
    i, j = np.unravel_index(np.nanargmax(z), z.shape)
    xs = list(trace.x) if trace.x is not None else list(range(z.shape[1]))
    ys = list(trace.y) if trace.y is not None else list(range(z.shape[0]))
    low = float(np.nanmin(z))
    return (
        f"a map of {z.shape[0]} rows by {z.shape[1]} columns; the largest value, "
        f"{_number(float(z[i, j]))}, is at row {_category(ys[i])}, column {_category(xs[j])} "
        f"(the smallest {_number(low)})"
    )


_POSITION = re.compile(r"^(.*) #(\d+)$")


def _category(value: object) -> str:
    """A heatmap's row or column as people read it: a token's category ``"cat #2"`` (a
    token made unique by its position) as ``'cat' (#2)``."""
    text = plain(value)
    found = _POSITION.match(text)
    return f"{found[1]!r} (#{found[2]})" if found else repr(text)


def _where(x: object) -> str:
    return _number(float(x)) if isinstance(x, (int, float, np.number)) else _category(x)


def _points_finding(traces: Sequence) -> str | None:
    """The highest point of the curves, bars or points (a point named by its ``text`` when
    it has one, as a head's label); a pure line (a diagonal, a guide) counts only when
    nothing else does."""
    data = [t for t in traces if getattr(t, "mode", None) != "lines"] or list(traces)
    best: tuple[float, str, str] | None = None
    count = series = 0
    for trace in data:
        xs, ys = trace.x, trace.y
        if getattr(trace, "orientation", None) == "h":  # horizontal bars: values across
            xs, ys = ys, xs
        ys = list(ys) if ys is not None else []
        xs = list(xs) if xs is not None else list(range(len(ys)))
        texts = trace.text if isinstance(trace.text, (list, tuple)) else None
        values = [
            (i, x, y)
            for i, (x, y) in enumerate(zip(xs, ys, strict=False))
            if isinstance(y, (int, float, np.number)) and y == y
        ]
        series += bool(values)
        for i, x, y in values:
            count += 1
            if best is None or float(y) > best[0]:
                where = _where(x)
                if texts is not None and i < len(texts) and texts[i]:
                    where = f"{plain(texts[i])} (at {where})"
                best = (float(y), where, plain(trace.name or ""))
    if best is None:
        return None
    name = f" ({best[2]})" if best[2] else ""
    what = f"{count} values in {series} series" if series > 1 else f"{count} values"
    return f"{what}; the highest, {_number(best[0])}, at {best[1]}{name}"


def alt_text(fig: go.Figure) -> str:
    """``fig``'s text alternative: the sentence its figure function stored (``set_alt``), or
    one made from its data: its title, then its heatmap's size and largest value, or its
    curves' or bars' highest point. A figure with no numbers says its title alone."""
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    if meta.get("alt"):
        return str(meta["alt"])
    traces = [t for t in fig.data if t.meta != NOT_EXPORTED]
    finding = None
    heat = [t for t in traces if t.type == "heatmap"]
    if heat:
        finding = _heatmap_finding(heat[0])
    if finding is None:
        finding = _points_finding([t for t in traces if t.type in ("scatter", "bar", "scattergl")])
    title = _title(fig)
    return f"{title}: {finding}." if finding else f"{title}."


def describe_attention(
    matrix: np.ndarray,
    queries: Sequence[str],
    keys: Sequence[str] | None = None,
    *,
    what: str,
) -> str:
    """One sentence on an attention pattern ``matrix`` [queries, keys] (rows the queries):
    ``what`` it is, on how many tokens, and where most queries' strongest key lies: the query
    itself, the token before or after it, the first or the last token, the token after an
    earlier copy of the query's own token (induction, Olsson et al. 2022: key j with
    ``keys[j-1] == queries[i]``, j - 1 < i), or, when none of these holds for most rows, the
    key most often strongest. With the mean weight the queries put there.

    Example: "Layer 1, head 3 on 12 tokens: for 9 of 12 queries the strongest key is the token
    after an earlier copy of the query (0.85 on average)."
    """
    a = np.asarray(matrix, dtype=float)
    keys = list(queries if keys is None else keys)
    queries = list(queries)
    if a.ndim != 2 or a.size == 0:
        return f"{plain(what)}: no attention to describe."
    n, m = a.shape
    safe = np.where(np.isnan(a), -np.inf, a)
    best = safe.argmax(1)
    top = safe.max(1)
    same_text = queries == keys[:n] if n == m else False
    kinds: dict[str, list[int]] = {}
    for i, j in enumerate(best):
        found = []
        if same_text and j == i:
            found.append("the query itself")
        if same_text and j == i - 1:
            found.append("the token before it")
        if same_text and j == i + 1:
            found.append("the token after it")
        if j == 0:
            found.append(f"the first token ({plain(keys[0])!r})")
        if j == m - 1:
            found.append(f"the last token ({plain(keys[-1])!r})")
        if same_text and 0 < j <= i and keys[j - 1] == queries[i]:
            found.append("the token after an earlier copy of the query")
        for kind in found:
            kinds.setdefault(kind, []).append(i)
    head = f"{plain(what)} on {m} tokens"
    if kinds:
        kind, rows = max(kinds.items(), key=lambda item: len(item[1]))
        if len(rows) * 2 > n:
            mean = float(np.mean(top[rows]))
            return (
                f"{head}: for {len(rows)} of {n} queries the strongest key is {kind} "
                f"({mean:.2f} on average)."
            )
    key, count = Counter(int(j) for j in best).most_common(1)[0]
    rows = [i for i in range(n) if best[i] == key]
    return (
        f"{head}: no single pattern; key {key} ({plain(keys[key])!r}) is the strongest for "
        f"{count} of {n} queries ({float(np.mean(top[rows])):.2f} on average), and the "
        f"queries' strongest weights average {float(np.mean(top)):.2f}."
    )

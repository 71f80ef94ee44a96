"""What the pages offer for download: file names, figures as HTML and CSV, results as .npz."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile

import plotly.graph_objects as go

import mhsa
from mhsa import plots
from ui.core import Query

__all__ = ["figure_csv", "figures_zip", "file_stem", "result_file"]


def file_stem(query: Query) -> str:
    """The start of every saved file's name: the sentence's hash (and its target's), the
    model, the engine, and which attention of an encoder-decoder when not the encoder's."""
    text = query.text + (f"\0{query.target}" if query.target else "")
    digest = hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:8]
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", query.model.rstrip("/").rsplit("/", 1)[-1])[-40:]
    kind = "" if query.kind == "encoder" else f"-{query.kind}"
    return f"{digest}-{model or 'model'}-{query.engine}{kind}"


def figure_csv(fig: go.Figure) -> str:
    """The numbers a figure draws, as CSV (``mhsa.plots.figure_data``)."""
    return plots.figure_data(fig).to_csv(index=False)


def figures_zip(figures: list[tuple[str, go.Figure]]) -> bytes:
    """A zip of figures, each as ``STEM.html`` (interactive, loading ``plotly.min.js`` from
    the zip's own folder, so it opens offline) and ``STEM.csv`` (``figure_csv``). A stem that
    repeats gets ``-2``, ``-3``, ..."""
    from plotly.offline import get_plotlyjs

    buffer = io.BytesIO()
    seen: dict[str, int] = {}
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("plotly.min.js", get_plotlyjs())
        for stem, fig in figures:
            seen[stem] = seen.get(stem, 0) + 1
            name = stem if seen[stem] == 1 else f"{stem}-{seen[stem]}"
            archive.writestr(f"{name}.html", fig.to_html(include_plotlyjs="directory"))
            archive.writestr(f"{name}.csv", figure_csv(fig))
    return buffer.getvalue()


def result_file(result: mhsa.AttentionResult) -> bytes:
    """The result as the ``.npz`` file ``AttentionResult.load`` reads."""
    buffer = io.BytesIO()
    result.save(buffer)
    return buffer.getvalue()

"""Notebook views of an ``AttentionResult``: one self-contained piece of HTML.

Every head as a small map in a grid (a row per layer); click one, or pick its layer and head, to
enlarge it; hover a token to see where it attends in that head (CircuitsVis's interaction, which
its newest ``attention_heads`` lacks: TransformerLensOrg/CircuitsVis#98), or a cell of the
enlarged map to read its weight. ``view="line"`` draws the chosen head as BertViz's lines from
each query to the keys instead of a map. ``view="neuron"`` is BertViz's neuron view (Vig 2019,
"A Multiscale Visualization of Attention in the Transformer Model", §3.3): for the chosen head
and the query token under the pointer, the query vector q, each key vector k_j, their
elementwise product q * k_j, the scaled dot product q . k_j * scale (``1 / sqrt(d_head)``) and
the weight, signed values blue (> 0) and red (< 0) around white (or the dark background) at 0;
keys a causal mask hides are shown as masked. It needs the vectors: ``attend(..., qk=True)``
(embedded as float32, so that the scores shown are the model's).

Nothing is requested from the network: the script and the styles are inline, the weights
embedded once as base64 16-bit integers (within 1/65535 of the float32 weights), tokens set as
text (never parsed as HTML). Light and dark themes follow the
notebook's (JupyterLab's ``data-jp-theme-light``, else the browser's preference) unless
``theme`` says which.

No plotly here: the view draws on canvases and SVG with about 200 lines of script, so a notebook
carries no plotting library in each cell.
"""

from __future__ import annotations

import base64
import html
import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mhsa.errors import InputError

if TYPE_CHECKING:
    from mhsa.engine.result import AttentionResult

__all__ = ["MAX_VIEW_BYTES", "THEMES", "VIEWS", "result_html"]

#: what the enlarged head shows: a map of weights, or lines from queries to keys
VIEWS = ("heads", "line", "neuron")
THEMES = ("auto", "light", "dark")
#: the most bytes of embedded weights one view holds (MiniLM at 64 tokens: 0.6 MB)
MAX_VIEW_BYTES = 24 * 2**20
_SCRIPT_DIR = Path(__file__).with_name("notebook_assets")
#: the script that draws each view (the neuron view's own: it reads vectors, not a grid)
_SCRIPTS = {"heads": "view.js", "line": "view.js", "neuron": "neuron.js"}


def _asset(name: str) -> str:
    return (_SCRIPT_DIR / name).read_text(encoding="utf-8")


def _json_for_script(value: object) -> str:
    """JSON safe inside ``<script>``: no ``</script>``, no ``<!--``, no line separators."""
    text = json.dumps(value, ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _weights(attention: np.ndarray) -> str:
    """``[L, H, m, n]`` weights in [0, 1] as base64 of little-endian uint16 (value * 65535)."""
    clipped = np.clip(np.asarray(attention, dtype=np.float32), 0.0, 1.0)
    scaled = np.rint(clipped * 65535.0).astype("<u2")
    return base64.b64encode(scaled.tobytes()).decode("ascii")


def _floats(array: np.ndarray) -> str:
    """An array as base64 of little-endian float32."""
    return base64.b64encode(np.asarray(array, dtype="<f4").tobytes()).decode("ascii")


def _neuron_data(result: AttentionResult) -> tuple[dict[str, object], int]:
    """The neuron view's vectors (``q`` ``[L, H, m, Dh]``, ``k`` ``[L, H, n, Dh]`` as float32)
    and their size in bytes.

    Raises:
        InputError: the result holds no vectors (how to get them).
    """
    if result.q is None or result.k is None or result.qk_scale is None:
        raise InputError(
            "The neuron view needs each head's query and key vectors, which this result does "
            "not hold (results of from_attention hold weights only): compute it with "
            "mhsa.attend(text, model=..., qk=True)."
        )
    data = {
        "d": int(result.q.shape[3]),
        "scale": float(result.qk_scale),
        "causal": bool(result.causal),
        "q": _floats(result.q),
        "kv": _floats(result.k),
    }
    return data, (result.q.size + result.k.size) * 4


def result_html(
    result: AttentionResult,
    view: str = "heads",
    *,
    layer: int = 0,
    head: int = 0,
    theme: str = "auto",
) -> str:
    """A self-contained ``<div>`` (styles and script inline) showing ``result``'s heads.

    Args:
        result: any result (a partial one shows the heads it holds, with the model's numbers;
            cross attention its decoder queries over encoder keys).
        view: ``"heads"`` (the chosen head as a map), ``"line"`` (as lines) or ``"neuron"``
            (query and key vectors: the result needs ``q`` and ``k``, ``attend(qk=True)``).
        layer: position in ``result.attention`` of the head shown first.
        head: position of the head shown first.
        theme: ``"auto"`` (the notebook's), ``"light"`` or ``"dark"``.

    Raises:
        InputError: an unknown view or theme, a head outside the result, weights (and
            vectors) over ``MAX_VIEW_BYTES`` (select layers and heads with
            ``attend(layers=, heads=)``), or the neuron view of a result without vectors.
    """
    if view not in VIEWS:
        raise InputError(f"Unknown view {view!r}: one of {', '.join(VIEWS)}.")
    if theme not in THEMES:
        raise InputError(f"Unknown theme {theme!r}: one of {', '.join(THEMES)}.")
    a = result.attention
    if not (0 <= layer < a.shape[0] and 0 <= head < a.shape[1]):
        raise InputError(
            f"No head at layer {layer}, head {head}: this result holds {a.shape[0]} layers "
            f"of {a.shape[1]} heads."
        )
    size = a.shape[0] * a.shape[1] * a.shape[2] * a.shape[3] * 2
    vectors, vector_bytes = _neuron_data(result) if view == "neuron" else ({}, 0)
    size += vector_bytes
    if size > MAX_VIEW_BYTES:
        raise InputError(
            f"{size / 2**20:,.0f} MB of weights is too much for one view (at most "
            f"{MAX_VIEW_BYTES / 2**20:.0f} MB): select layers and heads "
            "(attend(..., layers=..., heads=...)) or give fewer tokens."
        )
    data = {
        "keys": list(result.tokens),
        "queries": list(result.queries),
        "layers": [f"L{li}" for li in result.layers],
        "heads": [f"H{h}" for h in result.heads],
        "L": int(a.shape[0]),
        "H": int(a.shape[1]),
        "m": int(a.shape[2]),
        "n": int(a.shape[3]),
        "view": view,
        "layer": layer,
        "head": head,
        "w": _weights(a),
        **vectors,
    }
    vid = "mhsa-" + uuid.uuid4().hex[:12]
    title = f"{result.model} · {result.engine} · {a.shape[3]} tokens"
    return (
        f'<div id="{vid}" class="mhsa-view" data-theme="{theme}">'
        f"<style>{_asset('view.css').replace('#ROOT', '#' + vid)}</style>"
        f'<div class="mhsa-title">{html.escape(title)}</div>'
        f'<script type="application/json" class="mhsa-data">{_json_for_script(data)}</script>'
        f"<script>{_asset(_SCRIPTS[view]).replace('ROOT_ID', vid)}</script>"
        "</div>"
    )

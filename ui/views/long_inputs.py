"""Long inputs in the app: the sidebar's layers and heads (link keys ``long_layers``,
``long_heads``), what a page says when a text is over the token limit or the attention budget,
and what a result materialised (``mhsa.engine.runs.partial``: only the selected layers and heads are
computed and kept)."""

from __future__ import annotations

import streamlit as st

import mhsa
from ui.core import LIMITS, Query, loaded_model
from ui.state import clamp, md_escape

__all__ = [
    "HINT",
    "ZOOM_SIDE",
    "ask_when_over_budget",
    "focus_inputs",
    "focused_head",
    "focused_layer",
    "materialised_note",
    "selection_inputs",
    "selection_reads_more",
    "zoom_window",
]

#: most tokens a side of the focused head's zoom window (``mhsa.plots.heads.FULL_SIDE``)
ZOOM_SIDE = 512

#: what a page adds when a text was cut or a request was over the attention budget
HINT = (
    "To see a long text whole, choose a layer and a range of heads under **Long inputs** in "
    "the sidebar: only those are computed and kept."
)


def selection_inputs() -> None:
    """The sidebar's layers and heads (empty: all), open when either is set."""
    state = st.session_state
    with st.expander("Long inputs", expanded=bool(state["long_layers"] or state["long_heads"])):
        st.caption(
            f"Over {LIMITS.max_tokens} tokens, or over this server's attention budget "
            f"({LIMITS.max_attention_mb:,} MB), choose what to compute: the other layers "
            "are still computed, the fast way that keeps no attention weights."
        )
        st.text_input(
            "Layers", key="long_layers", max_chars=200, help="As 2, or 0-3,8. Empty: all."
        )
        st.text_input("Heads", key="long_heads", max_chars=200, help="As 0-7. Empty: all.")


def selection_reads_more(result: mhsa.AttentionResult, query: Query) -> bool:
    """Whether choosing layers and heads (``HINT``) would show more of a cut text: only when
    this server's token limit cut it and the model itself reads more positions than that
    (MiniLM reads 512, this server's usual limit: a selection would be cut at the same place,
    so the advice is not given)."""
    if result.is_partial or result.num_tokens < LIMITS.max_tokens:
        return False
    positions = loaded_model(query.model, query.device).max_positions
    return positions is None or positions > LIMITS.max_tokens


def ask_when_over_budget(error: Exception) -> None:
    """After an error that a selection of layers and heads would avoid, say how."""
    if "MHSA_MAX_ATTENTION_MB" in str(error):
        st.info(HINT, icon=":material/content_cut:")


def materialised_note(result: mhsa.AttentionResult) -> str | None:
    """What a partial or 16-bit result holds and its size, for the Overview (markdown-safe);
    None for a whole float32 result."""
    if not result.is_partial and result.attention_dtype == "float32":
        return None
    return f"Materialised: {md_escape(result.materialised)}."


def _real(key: str, ids: list[int], what: str) -> int:
    """``st.session_state[key]``, a model's ``what`` number, kept among ``ids`` (what a partial
    result materialised): a number outside falls back to the first with a notice."""
    value = st.session_state.get(key)
    if value not in ids:
        st.warning(
            f"{what.capitalize()} {md_escape(str(value))} was not materialised (this result "
            f"holds {what}s {md_escape(', '.join(map(str, ids)))}): showing {what} {ids[0]}.",
            icon=":material/warning:",
        )
        st.session_state[key] = value = ids[0]
    return value


def focused_layer(result: mhsa.AttentionResult, key: str = "layer") -> int:
    """The focused layer's position in ``result.attention`` from the link key ``key`` (the
    model's own layer number), as ``focused_head`` keeps it."""
    if not result.is_partial:
        return clamp(key, 0, result.num_layers - 1)
    return list(result.layers).index(_real(key, list(result.layers), "layer"))


def focused_head(
    result: mhsa.AttentionResult, layer_key: str = "layer", head_key: str = "head"
) -> tuple[int, int]:
    """The focused head's position in ``result.attention`` from the link keys ``layer_key``
    and ``head_key``, which hold the model's own numbers (a partial result's ``layer_ids``
    and ``head_ids``). A whole result clamps them into range as before; a partial one falls
    back to its first layer or head, with a notice, when they name one not materialised."""
    if not result.is_partial:
        return (
            clamp(layer_key, 0, result.num_layers - 1),
            clamp(head_key, 0, result.num_heads - 1),
        )
    layer = _real(layer_key, list(result.layers), "layer")
    head = _real(head_key, list(result.heads), "head")
    return result.index_of(layer, head)


def focus_inputs(
    result: mhsa.AttentionResult,
    layer_box,
    head_box,
    layer_key: str = "layer",
    head_key: str = "head",
) -> tuple[int, int]:
    """The layer and head pickers (in the containers ``layer_box``, ``head_box``): numbers
    for a whole result, the model's materialised layers and heads for a partial one. Returns
    the picked head's position in ``result.attention``."""
    if result.is_partial:
        layer_box.selectbox("Layer", list(result.layers), key=layer_key)
        head_box.selectbox("Head", list(result.heads), key=head_key)
        return result.index_of(st.session_state[layer_key], st.session_state[head_key])
    layer_box.number_input("Layer", 0, result.num_layers - 1, key=layer_key)
    head_box.number_input("Head", 0, result.num_heads - 1, key=head_key)
    return st.session_state[layer_key], st.session_state[head_key]


def zoom_window(result: mhsa.AttentionResult, key: str = "zoom") -> tuple[int, int] | None:
    """For an input over ``ZOOM_SIDE`` tokens a side: a start token (link key ``key``) and
    the window ``(start, stop)`` of at most ``ZOOM_SIDE`` tokens drawn at full resolution;
    None for a shorter input. A start past the end is clamped, with a notice."""
    n = max(result.num_queries, result.num_tokens)
    if n <= ZOOM_SIDE:
        return None
    last = n - ZOOM_SIDE
    value = st.session_state.get(key, 0)
    if not isinstance(value, int) or not 0 <= value <= last:
        st.warning(
            f"Zoom start {md_escape(str(value))} is outside 0 to {last}: starting at "
            f"{min(max(value, 0), last) if isinstance(value, int) else 0}.",
            icon=":material/warning:",
        )
        st.session_state[key] = min(max(value, 0), last) if isinstance(value, int) else 0
    st.number_input(
        f"Zoom: first token of a {ZOOM_SIDE}-token window at full resolution",
        0,
        last,
        key=key,
        step=64,
        help="The overview is block-averaged; the window below shows every weight exactly.",
    )
    start = st.session_state[key]
    return start, start + ZOOM_SIDE

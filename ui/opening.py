"""Opening another page set up for a head: the session's note of what the next page applies
before its widgets are drawn (``ui.page.setup`` reads it), then the switch."""

from __future__ import annotations

import streamlit as st

from mhsa.heads import KIND_LETTERS, parse_layer_head_label
from ui.core import Query
from ui.views import importance

__all__ = ["OPENING", "atlas_button", "open_head", "open_in_atlas", "open_text_head"]

#: session key: what the next page applies before its widgets are drawn
OPENING = "_mhsa_opening"


def open_head(query: Query, block: int, head: int) -> None:
    """Open the ``head`` of the ``block``-th attention block (as importance tables number them)
    on the Heads page: its layer and head selected, and for an encoder-decoder the sidebar's
    attention set to the head's (applied by ``setup`` on the next page, before its widgets)."""
    kind, layer = importance.knock_out_kind(query, block)
    opening: dict[str, object] = {"layer": layer, "head": head}
    if kind != "self":
        opening["kind"] = kind
    st.session_state[OPENING] = opening
    st.switch_page("pages/1_Heads.py")


def open_in_atlas(head: str) -> None:
    """Open ``head`` (a label) on the Head atlas page."""
    st.session_state[OPENING] = {"atlas_head": head}
    st.switch_page("pages/14_Head_atlas.py")


def atlas_button(head: str, key: str) -> None:
    """A head picker's way to the Head atlas page: "Open L3H4 in the atlas" (none for a
    cross-attention head, which no atlas covers: its queries and keys are two texts)."""
    if head.startswith("C"):
        return
    if st.button(f"Open {head} in the atlas (the head over a whole corpus)", key=key):
        open_in_atlas(head)


def open_text_head(text: str, label: str) -> None:
    """Open ``text`` on the Heads page with the head of ``label`` selected (an atlas's example
    in its own sentence; ``E0H1`` / ``D0H1``: an encoder-decoder's attention set to it)."""
    layer_name, head = parse_layer_head_label(label)
    opening: dict[str, object] = {"text": text, "layer": int(layer_name[1:]), "head": head}
    kind = {letter: kind for kind, letter in KIND_LETTERS.items()}[layer_name[0]]
    if kind != "self":  # the decoder reads the text itself, teacher-forced, as in the atlas
        opening |= {"kind": kind, "target_text": "", "generate": 0}
    st.session_state[OPENING] = opening
    st.switch_page("pages/1_Heads.py")

"""Drawn sections of the Head atlas page about parts of speech (exBERT's linguistic view), kept
out of the page so that it stays under its line budget: the histograms of the tags of a head's
top pairs and of a search's matches, and the search's tag boxes. Values come from
``ui.views.atlas_tags``, figures from ``mhsa.plots``."""

from __future__ import annotations

import pandas as pd
import streamlit as st

import mhsa
from mhsa import plots
from ui import page
from ui.state import Param, choice, md_escape
from ui.views import atlas_tags as views

__all__ = ["PARAMS", "tag_histograms", "tag_search_boxes"]

#: the link parameters of the search's tag boxes ("": any tag)
PARAMS = {
    "atlas_qtag": Param("", choice(*views.TAG_CHOICES)),
    "atlas_ktag": Param("", choice(*views.TAG_CHOICES)),
}


def tag_histograms(
    atlas: mhsa.atlas.Atlas, head: str, frame: pd.DataFrame, name: str, what: str
) -> None:
    """exBERT's histograms of the tags of ``frame``'s queries and keys, a chart and its
    numbers (``name``: the section's key, ``"top"`` or ``"search"``; ``what``: the examples
    in words); on an atlas without tags a notice, once (under the top pairs)."""
    if not atlas.has_tags:
        if name == "top":
            st.info(views.NO_TAGS, icon=":material/info:")
        return
    if frame.empty:
        return
    counts = views.tag_counts(atlas, frame, head)
    left, right = st.columns([3, 2])
    with left:
        title = f"{head}: parts of speech of {what}' queries and keys ({len(frame)})"
        page.figure(
            plots.tag_histogram_figure(counts, title=title),
            f"atlas-tags-{name}",
            key=f"atlas-tags-{name}",
        )
    with right:
        page.table(
            views.tag_table(counts),
            f"atlas-tags-{name}-{head}",
            label="Download the tag counts (.csv)",
            height=300,
        )


def tag_search_boxes(atlas: mhsa.atlas.Atlas) -> tuple[str | None, str | None]:
    """The search's query-tag and key-tag boxes (state keys ``atlas_qtag``, ``atlas_ktag``)
    and their values (None: any tag); an atlas without tags shows none, and a link's tags are
    dropped with a notice."""
    state = st.session_state
    if not atlas.has_tags:
        if state["atlas_qtag"] or state["atlas_ktag"]:
            st.warning(
                md_escape(
                    "This atlas has no part-of-speech tags: the link's tags are not searched."
                ),
                icon=":material/warning:",
            )
            state["atlas_qtag"] = state["atlas_ktag"] = ""
        return None, None
    a, b = st.columns(2)
    for column, key, name in ((a, "atlas_qtag", "Query tag"), (b, "atlas_ktag", "Key tag")):
        column.selectbox(name, views.TAG_CHOICES, key=key, format_func=views.tag_choice_label)
    return state["atlas_qtag"] or None, state["atlas_ktag"] or None

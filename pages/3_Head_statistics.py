"""Head statistics: what kind of head each one is, for one sentence or a small corpus."""

from __future__ import annotations

import functools

import streamlit as st

import mhsa
from mhsa import plots
from mhsa.analysis import stats as head_analysis
from mhsa.analysis.stats import stat_label
from ui import core, page
from ui.state import Param, choice
from ui.views import statistics
from ui.views.roles import ROLE_DETECTORS

COLUMNS = [*head_analysis.STAT_COLUMNS, *ROLE_DETECTORS]
PARAMS = {
    "stat": Param("entropy", choice(*COLUMNS)),
    "values": Param("weights", choice(*core.VALUES)),
}

with page.run("Head statistics", PARAMS, kinds=True) as query:
    query = page.values_switch(query)
    queries = page.corpus_queries(
        query, "Average over several sentences (one per line; empty = the sidebar's sentence)"
    )
    result = page.load(queries[0])
    if result is None:
        page.stop()
    try:
        if len(queries) == 1:
            table = statistics.head_stats_and_roles(queries)
        else:  # a corpus is heavy work: it waits its turn, and the sentence is shown meanwhile
            table = page.heavy(
                "corpus-stats",
                ("stats", queries),
                functools.partial(statistics.corpus_stats, queries),
                f"Statistics of {len(queries)} sentences",
            )
            if table is None:
                queries = (query,)
                st.caption("Meanwhile: the sidebar's sentence alone.")
                table = statistics.head_stats_and_roles(queries)
    except mhsa.MHSAError as e:
        page.error(e)
        page.stop()
    st.caption(
        f"{len(queries)} sentence(s). Roles: "
        + "; ".join(
            f"{role} {share:g}+" for _, (role, share) in head_analysis.ROLE_THRESHOLDS.items()
        )
        + "; else broad (entropy ≥ 80% of log n) or mixed, each with the queries it rests "
        + f"on (none called on fewer than {head_analysis.MIN_QUERIES}). Positional (Voita et "
        + "al. 2019): the largest weight at one offset for 90% of the queries that can take "
        + "it. "
        + ", ".join(ROLE_DETECTORS).capitalize()
        + ": TransformerLens's detection scores on the tokens (the Head roles page)."
        + (
            " Cross attention: the decoder's tokens over the sentence's, so statistics of "
            "positions (distance, self, previous, next, positional) are empty."
            if query.kind == "cross"
            else ""
        )
        + (
            f" The detection scores are the encoder's (empty for the {query.kind})."
            if query.kind != "encoder"
            else ""
        )
        + (
            " Weighted by value norm: each weight times the norm of the vector the head "
            "carries from that key (Kobayashi et al. 2020), each query's row scaled to sum "
            "1 before the statistics (the detection scores stay on the weights)."
            if query.norms
            else ""
        )
    )
    with st.expander("How these differ from Clark et al. 2019"):
        st.markdown(head_analysis.CLARK_DIFFERENCES)
    # roles and positional calls as claims with their support (mhsa.analysis.claims)
    shown = head_analysis.with_support(table)
    page.table(shown, "head-stats", label="Download table (.csv)", height=420)
    st.selectbox("Statistic as a layers x heads map", COLUMNS, key="stat", format_func=stat_label)
    page.figure(
        plots.stat_grid(table, st.session_state["stat"]),
        f"stat-{st.session_state['stat']}",
        key="stat-grid",
    )

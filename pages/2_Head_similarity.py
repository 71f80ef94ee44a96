"""Head similarity: which heads behave alike, as a matrix ordered by clusters and as a map."""

from __future__ import annotations

import streamlit as st

from mhsa import plots
from mhsa.analysis.stats import with_support
from ui import page
from ui.state import Param, bounded_int, choice, clamp
from ui.views.similarity import head_clusters, head_map, head_similarity
from ui.views.statistics import head_stats

PARAMS = {
    "metric": Param("js", choice("js", "cosine")),
    "clusters": Param(6, bounded_int(1, 72), old_keys=("k",)),
    "color": Param("layer", choice("layer", "cluster")),
}
METRICS = {
    "js": "JS divergence (Clark et al.)",
    "cosine": "cosine similarity",
}

with page.run("Head similarity", PARAMS, kinds=True) as query:
    result = page.load(query)
    if result is None:
        page.stop()
    heads = result.num_layers * result.num_heads
    left, mid, right = st.columns(3)
    left.selectbox("Metric", list(METRICS), key="metric", format_func=METRICS.get)
    clamp("clusters", 1, min(heads, 24))  # a link may ask for more than the slider offers
    mid.slider("Clusters", 1, min(heads, 24), key="clusters")
    right.radio("Colour the map by", ["layer", "cluster"], key="color", horizontal=True)
    queries = (query,)
    similarity = head_similarity(queries, st.session_state["metric"])
    clusters = head_clusters(queries, st.session_state["metric"], st.session_state["clusters"])
    page.figure(plots.similarity_figure(similarity, clusters.order), "head-similarity", key="sim")
    st.caption(
        "Heads are ordered by hierarchical clustering (average linkage), so similar "
        "heads sit side by side."
    )
    # computed after the first figure is sent: the browser loads plotly meanwhile
    stats = head_stats(queries)
    positions = head_map(queries, st.session_state["metric"])
    colour = clusters.labels if st.session_state["color"] == "cluster" else None
    page.figure(
        # each role on hover with the queries it rests on
        plots.head_map_figure(positions, color=colour, roles=with_support(stats)["role"]),
        "head-map",
        key="map",
    )

"""Compare: two sentences side by side for the same head, and how the head statistics differ."""

from __future__ import annotations

import streamlit as st

from mhsa import plots
from mhsa.analysis.stats import stats_difference
from ui import page
from ui.state import Param, index_param, text_param
from ui.views import long_inputs
from ui.views.examples import unknown_line
from ui.views.statistics import head_stats

PARAMS = {
    "text2": Param("The dog sat on the log.", text_param),
    "layer": Param(0, index_param),
    "head": Param(0, index_param),
}

with page.run("Compare two sentences", PARAMS, kinds=True) as query:
    st.text_area("Second sentence", key="text2", height=70)
    unknown_line(query.model, query.device, st.session_state["text2"], "The second sentence")
    other = query._replace(text=st.session_state["text2"])
    first = page.load(query)
    second = page.load(other, primary=False)
    if first is None or second is None:
        page.stop()
    long_inputs.focused_head(first)  # the link holds the model's numbers
    c1, c2 = st.columns(2)
    layer, head = long_inputs.focus_inputs(first, c1, c2)  # positions (the same in both)
    left, right = st.columns(2)
    with left:
        page.figure(plots.head_heatmap(first, layer, head), "compare-first", key="cmp-a")
    with right:
        page.figure(
            plots.head_heatmap(second, layer, head), "compare-second", key="cmp-b", decorate=False
        )
    first_stats, second_stats = head_stats((query,)), head_stats((other,))
    diff = stats_difference(first_stats, second_stats)
    st.subheader("Statistics: second minus first")
    page.table(diff, "head-stats-diff", label="Download differences (.csv)", height=380)

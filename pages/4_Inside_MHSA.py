"""Inside MHSA: the classroom walk-through of our module on the sentence, one step at a time."""

from __future__ import annotations

import numpy as np
import streamlit as st

from mhsa import plots
from mhsa.attention import OBSERVATION_POINTS
from ui import data, page
from ui.state import Param, bounded_int, clamp, flag

LAST_STEP = len(OBSERVATION_POINTS) - 1  # the most steps a trace can have, minus one
PARAMS = {
    "step": Param(0, bounded_int(0, LAST_STEP)),
    "source": Param("pretrained", lambda raw: {"pretrained": raw, "fresh": raw}[raw]),
    "mlayer": Param(0, bounded_int(0, 1023)),
    "dm": Param(64, bounded_int(4, 1024)),
    "nh": Param(4, bounded_int(1, 64)),
    "causal": Param(False, flag),
    "mhead": Param(0, bounded_int(0, 63)),
    "present": Param(False, flag),
}
PRESENTATION_CSS = """<style>
[data-testid="stMain"] p, [data-testid="stMain"] label, [data-testid="stMain"] li,
[data-testid="stMain"] input { font-size: 1.4rem !important; }
[data-testid="stMain"] h1, [data-testid="stMain"] h1 * { font-size: 3.4rem !important; }
[data-testid="stMain"] h3, [data-testid="stMain"] h3 * { font-size: 2.4rem !important; }
[data-testid="stMain"] pre, [data-testid="stMain"] code { font-size: 1.8rem !important; }
</style>"""


def _move(delta: int) -> None:
    st.session_state["step"] = min(max(st.session_state["step"] + delta, 0), LAST_STEP)


query = page.setup("Inside MHSA", PARAMS)
if st.session_state["present"]:
    st.markdown(PRESENTATION_CSS, unsafe_allow_html=True)  # constant CSS, no user text
top = st.columns([2, 1, 1, 1.3, 1.5])
top[0].radio(
    "Weights",
    ["pretrained", "fresh"],
    key="source",
    horizontal=True,
    format_func={
        "pretrained": "from a pretrained layer",
        "fresh": "freshly initialised (xavier)",
    }.get,
)
fresh = st.session_state["source"] == "fresh"
model = None
try:
    model = data.loaded_model(query.model, query.device)
except Exception as e:
    page.error(e)
if model is not None:
    layers = model.facts()["layers"] or 1
    if fresh:
        top[1].number_input("d_model", 4, 1024, step=4, key="dm")
        top[2].number_input("heads", 1, 64, key="nh")
    else:
        clamp("mlayer", 0, layers - 1)
        top[1].number_input("Layer", 0, layers - 1, key="mlayer")
    top[3].toggle("Causal mask", key="causal")
    top[4].toggle("Presentation mode", key="present")
    try:
        walk = data.classroom(
            query._replace(words=False),
            None if fresh else st.session_state["mlayer"],
            st.session_state["dm"],
            st.session_state["nh"],
            st.session_state["causal"],
        )
    except Exception as e:
        page.error(e)
        walk = None
    if walk is not None and walk.truncated_tokens:
        st.warning(
            f"The classroom view shows the first {len(walk.tokens)} tokens: "
            f"{walk.truncated_tokens} tokens were dropped to keep every step legible.",
            icon="✂️",
        )
    if walk is not None:
        step_no = clamp("step", 0, len(walk.steps) - 1)
        nav = st.columns([1, 1, 6])
        nav[0].button("◀ Previous", on_click=_move, args=(-1,), disabled=step_no == 0)
        nav[1].button("Next ▶", on_click=_move, args=(1,), disabled=step_no == len(walk.steps) - 1)
        step = walk.steps[step_no]
        nav[2].progress(
            (step_no + 1) / len(walk.steps),
            text=f"Step {step_no + 1} of {len(walk.steps)}: {step.name}",
        )
        gqa = (
            f", {walk.num_kv_heads} key/value heads (grouped-query attention: each serves "
            f"{walk.groups} query heads)"
            if walk.groups > 1
            else ""
        )
        rope = ", rotary positions on Q and K" if walk.rotary else ""
        st.caption(
            f"Weights: {page.md_escape(walk.source)}; d_model {walk.d_model}, "
            f"{walk.num_heads} heads{gqa}, d_head {walk.d_head}{rope}"
        )
        st.subheader(step.name)
        st.code(step.formula, language=None)
        st.markdown(f"shape **{step.shape}**")
        value = step.value[0]  # drop the batch axis
        head = clamp("mhead", 0, walk.num_heads - 1)
        if value.ndim == 3:  # per-head: pick the head
            st.number_input("Head", 0, walk.num_heads - 1, key="mhead")
            head = st.session_state["mhead"]
            if value.shape[0] == walk.num_kv_heads != walk.num_heads:  # K or V of GQA
                st.info(
                    f"Grouped-query attention: query head {head} reads key/value head "
                    f"{walk.kv_head(head)}, shared by query heads "
                    f"{walk.kv_head(head) * walk.groups} to "
                    f"{walk.kv_head(head) * walk.groups + walk.groups - 1}.",
                    icon="🔗",
                )
                head = walk.kv_head(head)
            value = value[head]
        tokens = walk.tokens
        square = value.shape == (len(tokens), len(tokens))
        cols = tokens if square else [f"d{i}" for i in range(value.shape[1])]
        shown = np.where(np.isinf(value), np.nan, value)  # -inf (masked) shows as blank
        fig = plots.matrix_heatmap(
            shown,
            tokens,
            cols,
            title=f"{step.name} {step.shape}",
            row_title="token",
            col_title="key" if square else "dimension",
            zmin=0.0 if step.name == "probabilities" else None,
            colorscale="Blues" if step.name == "probabilities" else "RdBu",
            value_name="value",
        )
        if st.session_state["present"]:
            fig.update_layout(font={"size": 18})
        page.figure(fig, f"step-{step_no}-{step.name.replace(' ', '-')}", key="step-fig")
        with st.expander("All steps and their shapes"):
            st.table(
                {
                    "step": [s.name for s in walk.steps],
                    "shape": [str(s.shape) for s in walk.steps],
                    "formula": [s.formula for s in walk.steps],
                }
            )
page.finish()

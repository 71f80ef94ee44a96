"""Heads: every head at a glance, one head large, and where one token attends in every head."""

from __future__ import annotations

import streamlit as st

import mhsa
from mhsa import plots
from mhsa.causal.targets import TARGET_SPECS
from mhsa.heads import head_label, kind_head_label
from ui import core, explain_section, head_weights, page
from ui.core import Query
from ui.state import Param, bounded_int, choice, clamp, heads_param, index_param
from ui.views import importance, long_inputs

PARAMS = {
    "layer": Param(0, index_param),
    "head": Param(0, index_param),
    "token": Param(0, index_param),
    "view": Param("head", choice("head", "mean-heads", "mean-layers")),
    "off": Param([], heads_param),
    "topk": Param(5, bounded_int(1, 20)),
    "values": Param("weights", choice(*core.VALUES)),
    "zoom": Param(0, bounded_int(0, 100_000)),
}
LONG_INPUT = 64  # beyond this many tokens the top-k list shows by itself
VIEWS = {
    "head": "one head",
    "mean-heads": "mean over the heads of the layer",
    "mean-layers": "mean over the layers for this head",
}


def _select_from_grid() -> None:
    """A click on a thumbnail's marker selects that head."""
    clicked = page.clicked_head("grid")
    if clicked is not None:
        st.session_state["layer"], st.session_state["head"] = clicked


def _toggle_off(name: str) -> None:
    off = list(st.session_state["off"])
    st.session_state["off"] = heads_param(
        ",".join([h for h in off if h != name] if name in off else [*off, name])
    )


def _knock_outs(query: Query, layer: int, head: int) -> None:
    """Heads switched off: the shown attention of every layer after the knock-out beside the
    intact one (an encoder-decoder's: the sidebar's kind), and how much the output moved."""
    st.subheader("Knock-outs")
    labels = importance.knock_out_labels(query)
    kind = query.kind if "self" not in labels else "self"
    off = _heads_switched_off(labels, kind, kind_head_label(kind, layer, head))
    if not off:
        st.caption(
            "Pick heads to switch off (here, or with the button after clicking a head above): "
            "the sentence then runs through our module with those heads' outputs set to 0, and "
            "every layer above shows how its attention changed."
        )
        return
    try:
        ablation = importance.ablation(query, tuple(off), None)
    except mhsa.MHSAError as e:
        page.error(e)
        return
    _output_change(ablation, encoder_decoder=kind != "self")
    shown = query.kind if kind != "self" else "encoder"
    _knock_out_figures(ablation.intact.of_kind(shown), ablation.ablated.of_kind(shown), layer, head)


def _heads_switched_off(labels: dict[str, list[str]], kind: str, selected: str) -> list[str]:
    """The pick of heads to switch off among the ``kind``'s heads (``labels``: the model's
    heads by kind; heads of another kind already off stay off and listed; heads this model
    lacks dropped with a notice), and a button that switches the ``selected`` head off or back
    on. Returns the heads picked."""
    known = {label for kind_labels in labels.values() for label in kind_labels}
    off = [h for h in st.session_state["off"] if h in known]
    if off != st.session_state["off"]:
        st.warning(
            "Heads this model does not have were left out of the knock-out.",
            icon=":material/warning:",
        )
        st.session_state["off"] = off
    options = labels[kind] + [h for h in off if h not in labels[kind]]
    st.multiselect("Heads switched off", options, key="off", placeholder="none: the intact model")
    st.button(
        f"Switch {selected} {'back on' if selected in off else 'off'}",
        on_click=_toggle_off,
        args=(selected,),
    )
    return st.session_state["off"]


def _output_change(ablation: mhsa.causal.Ablation, *, encoder_decoder: bool) -> None:
    """How far the knock-out moved the target, and what the target is."""
    target = TARGET_SPECS[ablation.target]
    cols = st.columns(3)
    cols[0].metric("Output change", f"{ablation.change:.4g}", help=target.description)
    if ablation.target != "embedding":
        cols[1].metric(f"{ablation.target} intact", f"{ablation.intact_value:.4g}")
        cols[2].metric(f"{ablation.target} after", f"{ablation.ablated_value:.4g}")
    what = (
        "the decoder's loss of the target (the sidebar's target text, the generated target, "
        "or the sentence itself) given the sentence"
        if encoder_decoder
        else target.description
    )
    st.caption(
        f"Target: {ablation.target} ({what}). Knock-outs run through our module "
        " with the model's own weights, whatever the engine in the sidebar."
    )


def _knock_out_figures(
    intact: mhsa.AttentionResult, ablated: mhsa.AttentionResult, layer: int, head: int
) -> None:
    """Every head intact beside knocked out, each layer's change, the selected head both
    ways (one attention of an encoder-decoder: ``intact.kind``)."""
    name = head_label(layer, head)
    before, after = st.columns(2)
    with before:
        page.figure(plots.head_grid(intact, selected=(layer, head)), "intact", key="ko-in")
    with after:
        page.figure(plots.head_grid(ablated, selected=(layer, head)), "knocked-out", key="ko-out")
    page.figure(plots.layer_change_figure(intact, ablated), "layer-change", key="ko-layers")
    before, after = st.columns(2)
    with before:
        page.figure(plots.head_heatmap(intact, layer, head), f"{name}-intact", key="ko-h1")
    with after:
        fig = plots.head_heatmap(ablated, layer, head)
        what = "" if ablated.kind is None else f", {ablated.kind} attention"
        fig.update_layout(title={"text": f"Layer {layer}, head {head}{what}, after the knock-out"})
        page.figure(fig, f"{name}-knocked-out", key="ko-h2")


with page.run("Heads", PARAMS, kinds=True) as query:
    query, result = page.switched_result(query)
    result = core.shown(result)
    values = plots.WEIGHTED_BY_NORM if query.norms else plots.WEIGHTS
    layer, head = long_inputs.focused_head(result)  # positions; the link holds the model's
    token = clamp("token", 0, result.num_queries - 1)
    # the layer and head boxes before the grid: the first stops of Tab on the page, not after
    # the grid's mode bar (a click on the grid sets them too)
    left, mid, right = st.columns([1, 1, 2])
    layer, head = long_inputs.focus_inputs(result, left, mid)
    right.radio("Show", list(VIEWS), key="view", format_func=VIEWS.get, horizontal=True)
    page.figure(
        plots.head_grid(result, selected=(layer, head)),
        "all-heads",
        key="grid",
        on_select=_select_from_grid,
        selection_mode="points",
    )
    view = st.session_state["view"]
    name = result.label(layer, head)
    window = long_inputs.zoom_window(result) if view == "head" else None
    if view == "head":
        fig = plots.head_heatmap(result, layer, head, values=values)
        if window is not None:
            plots.mark_window(fig, result, *window)
    elif view == "mean-heads":
        fig = plots.mean_heatmap(result, layer=layer, values=values)
    else:
        fig = plots.mean_heatmap(result, head=head, values=values)
    if view != "head":
        page.figure(fig, f"{name}-{view}", key="head-large")
    else:  # a click on a cell opens "Why here?" on it
        clicks = {"on_select": lambda: head_weights.select_cell("head-large")}
        fig = plots.clickable_cells(fig)
        page.figure(fig, f"{name}-{view}", key="head-large", selection_mode="points", **clicks)
        head_weights.why_here_panel(query, result, result.layers[layer], result.heads[head])
    at = (result.layers[layer], result.heads[head])  # an encoder-decoder's: E0H1, D0H1, C0H1
    atlas_head = name if result.kind is None else kind_head_label(result.kind, *at)
    page.atlas_button(atlas_head, "to-atlas")
    explain_section.head_line(query.model, atlas_head)  # its explanation, where one is saved
    if window is not None:
        page.figure(
            plots.head_zoom(result, layer, head, *window, values=values),
            f"{name}-t{window[0]}-{window[1] - 1}",
            key="head-zoom",
        )
    if st.toggle(
        "Where each token attends most in this head (a list for inputs too long to read as a "
        "heatmap)",
        value=result.num_queries > LONG_INPUT,
        key=f"topk-shown-{result.num_queries > LONG_INPUT}",  # on by itself for long inputs
    ):
        st.number_input("Top", 1, 20, key="topk")
        page.table(
            mhsa.analysis.top_attended(result, layer, head, st.session_state["topk"]),
            f"{page.file_stem()}-{name}-top",
            label="Download the list (.csv)",
        )
    st.subheader("Token focus")
    st.selectbox(
        "Token" if result.query_tokens is None else "Decoder token",
        range(result.num_queries),
        key="token",
        format_func=lambda i: f"{i}: {result.queries[i]}",
    )
    focus = plots.token_focus(result, st.session_state["token"], values=values)
    page.figure(focus, "token-focus", key="focus")
    if query.norms:
        st.caption(
            "Every figure above shows each weight times the norm of the vector the head carries "
            "from that key (Kobayashi et al. 2020); the knock-outs below show the weights."
        )
    _knock_outs(query, result.layers[layer], result.heads[head])  # the model's numbers

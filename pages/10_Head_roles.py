"""Head roles: what heads do (TransformerLens's detectors), sinks, composition and weights."""

from __future__ import annotations

import streamlit as st

import mhsa
from mhsa import plots
from ui import core, explain_section, head_weights, page
from ui.core import Query
from ui.state import Param, bounded_int, choice, flag, head_label_param, text_param
from ui.views import repeats
from ui.views import roles as role_views

DETECTORS = [*role_views.ROLE_DETECTORS, role_views.CUSTOM_ROLE]
PARAMS = {
    "detector": Param(DETECTORS[0], choice(*DETECTORS)),
    "rule": Param(role_views.CUSTOM_RULES[0], choice(*role_views.CUSTOM_RULES)),
    "rule_k": Param(1, bounded_int(1, role_views.MAX_RULE_K)),
    "rule_rows": Param("", text_param),
    "error_measure": Param("mul", choice(*role_views.ERROR_MEASURES)),
    "exclude_bos": Param(False, flag),
    "exclude_current": Param(False, flag),
    "random_tokens": Param(False, flag),
    "role_head": Param("", head_label_param),
}
TOP_HEADS = 3


def _options() -> role_views.RoleOptions:
    """The detection settings: error measure and the exclusions."""
    left, mid, right = st.columns(3)
    left.radio("Error measure", role_views.ERROR_MEASURES, key="error_measure", horizontal=True)
    mid.toggle("Exclude BOS (the first token)", key="exclude_bos")
    right.toggle("Exclude the current token", key="exclude_current")
    keys = ("error_measure", "exclude_bos", "exclude_current")
    return role_views.RoleOptions(*(st.session_state[key] for key in keys))


def _random_tokens_button() -> None:
    """The repeated-random-tokens induction test, on or back to the sentence."""
    on = st.session_state["random_tokens"]
    label = "Back to the sentence" if on else "Repeat random tokens (induction test)"
    if st.button(label, key="random-tokens-button"):
        st.session_state["random_tokens"] = not on
        st.rerun()


def _detection_maps(
    query: Query, options: role_views.RoleOptions, *, random_test: bool
) -> tuple[role_views.RoleTable | None, role_views.RoleTable | None]:
    """One layers x heads map per detector; the induction map on repeated random tokens when
    that test is on (and ``random_test``: the model takes it). Returns the sentence's scores
    and the random test's (each None when not run, after showing what went wrong)."""
    roles = page.or_error(role_views.head_roles, query, options)
    random = random_test and st.session_state["random_tokens"]
    induction = page.or_error(role_views.random_induction, query) if random else None
    maps = [
        (f"{name.capitalize()} score", roles.scores, name)
        for name in role_views.ROLE_DETECTORS
        if roles is not None and not (name == "induction" and induction is not None)
    ]
    if induction is not None:
        maps.append(("Induction score, repeated random tokens", induction.scores, "induction"))
    if maps:
        title = f"Detection scores (error measure {options.error_measure})"
        page.figure(plots.role_maps(maps, title=title), "role-maps", key="role-maps")
    if induction is not None:
        st.caption(role_views.RANDOM_NOTE)
    return roles, induction


def _custom_rule() -> tuple[str, int, str]:
    """The custom pattern's rule, its k and its typed rows."""
    state = st.session_state
    left, right = st.columns([2, 1])
    left.selectbox("Rule", role_views.CUSTOM_RULES, key="rule")
    if state["rule"] in role_views.RULES_WITH_K:
        right.number_input("k", 1, role_views.MAX_RULE_K, key="rule_k")
    if state["rule"] == role_views.TYPED_RULE:
        st.text_area(
            "Pattern rows (one row per query token, numbers separated by spaces)",
            key="rule_rows",
            height=120,
        )
    return state["rule"], int(state["rule_k"]), state["rule_rows"]


def _top_heads(
    query: Query,
    options: role_views.RoleOptions,
    roles: role_views.RoleTable | None,
    induction: role_views.RoleTable | None,
) -> None:
    """The chosen detector's best heads, their attention beside the detection pattern; on the
    repeated random tokens when that test is on and the detector is induction (the figures
    show the input the scores came from)."""
    st.subheader("Top heads")
    st.selectbox("Detector", DETECTORS, key="detector")
    detector = st.session_state["detector"]
    if detector == "induction" and induction is not None:
        _top_heads_on_repeats(query, induction)
        return
    try:
        if detector == role_views.CUSTOM_ROLE:
            rule, k, rows = _custom_rule()
            table = role_views.custom_role(query, rule, k, rows, options)
            panel = [("Custom pattern score", table.scores, detector)]
            title = f"Custom pattern (error measure {options.error_measure})"
            page.figure(plots.role_maps(panel, title=title), "role-custom", key="role-custom")
        elif roles is None:
            return
        else:
            table = roles
    except mhsa.MHSAError as e:
        page.error(e)
        return
    tokens = role_views.token_attention(query)
    best = role_views.top_heads(table.scores, detector, TOP_HEADS, say=st.caption)
    columns = st.columns(1 + len(best))
    with columns[0]:
        page.figure(
            plots.detection_pattern_figure(
                table.patterns[detector], tokens.tokens, detector, columns=len(columns)
            ),
            "detection-pattern",
            key="detection-pattern",
            decorate=not query.words,  # token figures: the found token is a word's number
        )
    for column, (layer, head, _) in zip(columns[1:], best, strict=True):
        with column:
            page.figure(
                # the scores name the model's heads: positions in a partial result
                plots.head_heatmap(tokens, *tokens.index_of(layer, head), columns=len(columns)),
                f"L{layer}H{head}-{detector.replace(' ', '-')}",
                key=f"top-head-{layer}-{head}",
                decorate=not query.words,
            )
            st.caption(role_views.top_head_caption(table.scores, detector, layer, head))


def _top_heads_on_repeats(query: Query, induction: role_views.RoleTable) -> None:
    """The induction test's best heads on its first repeated random sequence, beside that
    sequence's induction pattern."""
    repeated = page.or_error(repeats.repeated_sequence, query)
    if repeated is None:
        return
    st.caption(role_views.REPEATED_NOTE)
    best = role_views.top_heads(induction.scores, "induction", TOP_HEADS, say=st.caption)
    columns = st.columns(1 + len(best))
    tokens = repeated.result.tokens
    with columns[0]:
        page.figure(
            plots.detection_pattern_figure(
                repeated.pattern, tokens, "induction", columns=len(columns)
            ),
            "detection-pattern-repeated",
            key="detection-pattern",
            decorate=False,
        )
    for column, (layer, head, _) in zip(columns[1:], best, strict=True):
        with column:
            page.figure(
                plots.head_heatmap(repeated.result, layer, head, columns=len(columns)),
                f"L{layer}H{head}-induction-repeated",
                key=f"top-head-{layer}-{head}",
                decorate=False,
            )
            caption = role_views.top_head_caption(induction.scores, "induction", layer, head)
            st.caption(f"{caption} (repeated random tokens)")


def _sinks(query: Query, *, value_norms: bool = True) -> None:
    """The share of sinking heads and where they sink (``value_norms``: and what the sinks
    carry, where the model's value norms are computed)."""
    st.subheader("Attention sinks")
    sinks = page.or_error(role_views.attention_sinks, query)
    if sinks is None:
        return
    st.metric(f"Heads that sink (mean attention received > {sinks.threshold:g})", sinks.shown)
    st.caption(sinks.note())  # constant text and numbers: nothing to escape
    page.figure(
        plots.sink_map(sinks.received, sinks.heads, sinks.tokens, threshold=sinks.threshold),
        "attention-sinks",
        key="sinks",
    )
    if not value_norms:
        st.caption("What the sinks carry (value norms) is not computed for encoder-decoders yet.")
        return
    carried = page.or_error(role_views.sink_value_norms, query)
    if carried is None:
        return
    st.caption(role_views.SINK_NORMS_NOTE)
    page.table(carried, "sink-value-norms", label="Download the sinks' value norms (.csv)")


def _composition(query: Query) -> None:
    """Q/K/V composition between heads, and a chosen head's strongest inputs."""
    st.subheader("Head composition")
    composition = page.or_error(role_views.head_composition, query)
    if composition is None:
        return
    columns = st.columns(len(composition.kinds))
    for column, kind in zip(columns, composition.kinds, strict=True):
        with column:
            figure = plots.composition_figure(composition.scores[kind], kind, columns=len(columns))
            page.figure(figure, f"composition-{kind}", key=f"composition-{kind}")
    labels = composition.later_heads
    state = st.session_state
    if state["role_head"] not in labels:  # none yet, or one this model lacks: as clamp does
        state["role_head"] = labels[-1]
    st.selectbox("Head", labels, key="role_head")
    page.atlas_button(state["role_head"], key="role-to-atlas")
    explain_section.head_line(query.model, state["role_head"])  # where one is saved
    page.table(
        role_views.strongest_inputs(query, state["role_head"]),
        f"inputs-{state['role_head']}",
        label="Download its inputs (.csv)",
        height=240,
    )


with page.run("Head roles", PARAMS, kinds=True) as query:
    st.caption(role_views.INTRO)
    with st.expander("What these scores mean"):
        st.markdown(role_views.EXPLANATION)
    result = page.load(query)
    if result is None:
        page.stop()
    seq2seq = core.is_encoder_decoder(query.model, query.device)
    if query.kind == "cross":
        st.info(role_views.CROSS_NOTE, icon=":material/info:")
    else:
        st.subheader("Detected heads")
        if seq2seq:
            st.caption(f"The {query.kind}'s self-attention, over its own tokens.")
        options = _options()
        if not seq2seq:  # the random-token test runs one stack on random ids
            _random_tokens_button()
        roles, induction = _detection_maps(query, options, random_test=not seq2seq)
        _top_heads(query, options, roles, induction)
        _sinks(query, value_norms=not seq2seq)
    if seq2seq:
        st.subheader("Head composition")
        st.info(role_views.COMPOSITION_NOTE, icon=":material/info:")
    else:
        _composition(query)
        head_weights.weights_section(query)

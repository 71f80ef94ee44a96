"""The page lifecycle, what every page does: ``run`` (page config, state from the URL, the
sidebar; at the end the URL, the figures' download), the current result, safe messages, figures
with their downloads. The sidebar is ``ui.sidebar``, heavy jobs ``ui.heavy`` (``heavy`` and
``queue_place`` are re-exported here: pages call ``page.heavy``).

A page body runs inside ``with page.run(title, PARAMS) as query:`` and stops early with
``page.stop()`` (after an ``st.info`` say), which still finishes the page::

    with page.run("Rollout", PARAMS) as query:
        result = page.load(query)
        if result is None:
            page.stop()
        ...
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

import mhsa
from mhsa import plots
from ui import core, exports, runtime
from ui.core import LIMITS, Query
from ui.heavy import heavy, queue_place
from ui.navigation import FAVICON
from ui.opening import OPENING as _OPENING
from ui.opening import atlas_button, open_head, open_in_atlas, open_text_head
from ui.sidebar import EXPORT_FORMATS, KIND_LABELS, attention_kind, sidebar
from ui.state import (
    GLOBAL_PARAMS,
    MAX_LINK_VALUE_BYTES,
    Param,
    add_notice,
    error,
    md_escape,
    show_notices,
    sync_url,
    use_params,
)
from ui.views import examples, long_inputs

__all__ = [
    "EXPORT_FORMATS",
    "KIND_LABELS",
    "Stop",
    "answer_inputs",
    "atlas_button",
    "attention_kind",
    "clicked_head",
    "corpus_queries",
    "error",
    "figure",
    "file_stem",
    "finish",
    "frame",
    "heavy",
    "heavy_or_stop",
    "link_params",
    "load",
    "md_escape",
    "open_head",
    "open_in_atlas",
    "open_text_head",
    "or_error",
    "patch_texts",
    "queue_place",
    "run",
    "setup",
    "shown_kind",
    "stop",
    "table",
    "values_switch",
]

T = TypeVar("T")

#: session key of the figures drawn in this run: (file stem, figure)
_FIGURES = "_mhsa_figures"
#: session keys of this run's file stem (``file_stem``), the attention the page shows
#: (``shown_kind``), the page's link parameters (``link_params``), the found token and where
#: the generated text starts (figures box and mark them)
_FILE_STEM = "_mhsa_file_stem"
_KIND = "_mhsa_kind"
_PARAMS = "_mhsa_params"
_FOUND = "_mhsa_found"
_GENERATED_FROM = "_mhsa_generated_from"


PRESENTATION_CSS = """<style>
[data-testid="stMain"] p, [data-testid="stMain"] label, [data-testid="stMain"] li,
[data-testid="stMain"] input { font-size: 1.4rem !important; }
[data-testid="stMain"] h1, [data-testid="stMain"] h1 * { font-size: 3.4rem !important; }
[data-testid="stMain"] h3, [data-testid="stMain"] h3 * { font-size: 2.4rem !important; }
[data-testid="stMain"] pre, [data-testid="stMain"] code { font-size: 1.8rem !important; }
[data-testid="stCaptionContainer"], [data-testid="stCaptionContainer"] * {
  font-size: 1.3rem !important; }
[data-testid="stSidebar"] p, [data-testid="stSidebar"] label, [data-testid="stSidebar"] input,
[data-testid="stSidebar"] textarea, [data-testid="stSidebar"] li {
  font-size: 1.3rem !important; }
button p, button div { white-space: normal !important; overflow: visible !important;
  text-overflow: clip !important; overflow-wrap: anywhere; }
button { height: auto !important; }
[data-testid="stTable"] th, [data-testid="stTable"] td { font-size: 1.3rem !important; }
</style>"""


#: What the theme cannot set (WCAG 2.1 AA, docs/accessibility.md): captions at
#: ``CAPTION_COLOR`` and full opacity (Streamlit draws them at 0.6 opacity: #828180 on white,
#: 3.88:1, under the 4.5:1 of 1.4.3; this colour is at least 4.5:1 on the page's white and on
#: the sidebar's grey, tests/test_palette.py), and the skip link (page_script.js) out of sight
#: until it has the focus.
CAPTION_COLOR = "#5c5d66"
A11Y_CSS = (
    '[data-testid="stCaptionContainer"], [data-testid="stCaptionContainer"] *,'
    ' [data-testid="stWidgetLabel"] [data-testid="stCaptionContainer"],'
    f" .stTooltipIcon, small {{ color: {CAPTION_COLOR} !important; }}"
    ' [data-testid="stCaptionContainer"] { opacity: 1 !important; }'  # Streamlit's is 0.6
    " #mhsa-skip { position: fixed; left: 0.5rem; top: -4rem; z-index: 1000100;"
    " padding: 0.5rem 1rem; background: #ffffff; color: #0b5cad; border: 2px solid #0b5cad;"
    " border-radius: 0.25rem; font-weight: 600; }"
    " #mhsa-skip:focus { top: 0.5rem; }"
)


def _use_the_navigation() -> None:
    """Streamlit runs an app that has a ``pages/`` folder the old way (every file a page, the
    entry point called "app") until ``app.py`` has called ``st.navigation`` once in the
    process: a first visitor arriving by a page's own link would get the old navigation.
    Leave that mode and rerun, which runs ``app.py`` and its navigation to the same page."""
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


def plotly_chunk() -> Path | None:
    """Streamlit's plotly chunk (its file name carries a hash that changes with Streamlit's
    version), or None when there is not exactly one."""
    chunks = sorted(
        (Path(st.__file__).parent / "static" / "static" / "js").glob("PlotlyChart.*.js")
    )
    return chunks[0] if len(chunks) == 1 else None


def _page_script() -> str:
    """``page_script.js`` in a script tag, told the file name of Streamlit's plotly chunk
    (none found: no preload, and the script's status says so)."""
    chunk = plotly_chunk()
    script = Path(__file__).with_name("page_script.js").read_text(encoding="utf-8")
    script = script.replace("PLOTLY_CHUNK", json.dumps(chunk and chunk.name))
    hide = '[data-testid="stElementContainer"]:has(#mhsa-page-script) { display: none; }'
    return f'<script id="mhsa-page-script">{script}</script><style>{hide}{A11Y_CSS}</style>'


#: see page_script.js: faster first drawings of large figures
PAGE_SCRIPT = _page_script()


def setup(title: str, params: dict[str, Param] | None = None, *, kinds: bool = False) -> Query:
    """Page config, state from the URL, the sidebar. Returns the settings of the result.
    ``kinds``: the page draws any of an encoder-decoder's attentions (the sidebar's choice);
    else its query asks for the encoder's, and the page says so when another is chosen."""
    _use_the_navigation()
    st.session_state.update(st.session_state.pop(_OPENING, {}))  # before any widget is drawn
    st.set_page_config(page_title=f"{title} · MHSA Explorer", page_icon=FAVICON, layout="wide")
    all_params = GLOBAL_PARAMS | (params or {})
    use_params(all_params)
    st.html(PAGE_SCRIPT, unsafe_allow_javascript=True)
    if st.session_state.get("presentation"):
        st.markdown(PRESENTATION_CSS, unsafe_allow_html=True)  # constant CSS, no user text
    st.title(title)
    examples.fit_sentence_to_model()  # before the sidebar's widgets: it may set the sentence
    show_notices()
    query = sidebar()
    st.session_state[_FILE_STEM] = exports.file_stem(query)  # of the sidebar's choice
    if query.kind != "encoder" and not kinds:
        st.caption(
            f"This page shows the encoder's attention; the {query.kind} attention is on "
            "Heads, Line view, Compare, Head similarity and Head statistics."
        )
        query = query._replace(kind="encoder")
    st.session_state[_KIND] = query.kind
    st.session_state[_PARAMS] = all_params
    st.session_state[_FIGURES] = []  # this run's figures (``figure``), downloaded by ``finish``
    return query


class Stop(Exception):
    """Raised by ``stop``: the page body ends here, and ``run`` finishes the page."""


def stop() -> NoReturn:
    """End the page body now (inside ``run``, which still finishes the page): a guard for what
    the page cannot show, after saying why (``st.info``), instead of nesting the rest."""
    raise Stop


def or_error(compute: Callable[..., T], *args: Any) -> T | None:
    """``compute(*args)``, or None after showing what went wrong (the page goes on)."""
    try:
        return compute(*args)
    except mhsa.MHSAError as e:
        error(e)
        return None


def heavy_or_stop(
    name: str, key: tuple, compute: Callable[[Any], Any], label: str, unit: str = "steps"
) -> Any:
    """``heavy``'s result, or the page ends (``stop``): after showing a library error
    (``error``), or while the job is queued or cancelled (``heavy`` returned None)."""
    try:
        value = heavy(name, key, compute, label, unit=unit)
    except mhsa.MHSAError as e:
        error(e)
        stop()
    if value is None:
        stop()
    return value


def example_buttons(
    buttons: dict[str, dict[str, Any]],
    on_click: Callable[[dict[str, Any]], None],
    model: str,
    params: Mapping[str, Any],
) -> None:
    """A patching page's one-click examples (``buttons``) in a row; first, a model with an
    example of its own there opens on it rather than on the page's English defaults
    (``examples.own_pair_first``)."""
    defaults = {key: params[key].default for key in ("clean", "corrupted")}
    examples.own_pair_first(model, buttons, defaults)
    for column, (name, values) in zip(st.columns(len(buttons)), buttons.items(), strict=True):
        column.button(name, on_click=on_click, args=(values,))


def patch_texts(clean_label: str, query: Any, *, answers: bool) -> None:
    """The clean and corrupted text areas of a patching page (session keys ``clean`` and
    ``corrupted``), each with its count of tokens unknown to the model, and, with ``answers``,
    the answer and wrong-answer boxes (``answer``, ``wrong``) under them."""
    left, right = st.columns(2)
    left.text_area(clean_label, key="clean", height=90)
    right.text_area("Corrupted text (as many tokens as the clean one)", key="corrupted", height=90)
    for key, what in (("clean", "The clean text"), ("corrupted", "The corrupted text")):
        examples.unknown_line(query.model, query.device, st.session_state[key], what)
    if answers:
        answer_inputs()


def described_choice(label: str, options: Mapping[str, str], key: str, *, where: Any = st) -> None:
    """A horizontal radio (in ``where``: the page or a column) over the names of ``options``,
    its help each name in bold with its description (``PATCH_TARGETS``, ``EDGE_METHODS``)."""
    where.radio(
        label,
        list(options),
        key=key,
        horizontal=True,
        help=" ".join(f"**{k}**: {v}." for k, v in options.items()),
    )


def answer_inputs() -> None:
    """The answer and wrong-answer boxes of a logit-difference metric (``answer``, ``wrong``)."""
    left, right = st.columns(2)
    left.text_input("Answer (one token after a space)", key="answer")
    right.text_input("Wrong answer (one token after a space)", key="wrong")


def encoder_target_inputs(key: str) -> str:
    """An encoder's metric picker (``mhsa.causal.PATCH_TARGETS``, session key ``key``) and, for
    "similarity", the second sentence's box (``pair``); returns the target chosen."""
    described_choice("Metric", mhsa.causal.PATCH_TARGETS, key)
    if st.session_state[key] == "similarity":
        st.text_input("Second sentence (compared with each run)", key="pair")
    return st.session_state[key]


@contextlib.contextmanager
def run(
    title: str, params: dict[str, Param] | None = None, *, kinds: bool = False
) -> Iterator[Query]:
    """The page's lifecycle: ``setup`` (yields the sidebar's ``Query``), the body, then
    ``finish`` in a ``finally``, also when the body ends early (``stop``) or fails. Not after
    Streamlit's own control flow (``st.rerun``, ``st.switch_page``, ``st.stop``: base
    exceptions, not errors), which starts the page afresh."""
    query = setup(title, params, kinds=kinds)
    try:
        yield query
    except Stop:
        pass
    finally:
        raised = sys.exc_info()[1]
        if raised is None or isinstance(raised, Exception):
            finish()


def file_stem() -> str:
    """The start of this run's saved files' names (``ui.exports.file_stem`` of the sidebar's
    query), ``"mhsa"`` before any page has set it up."""
    return st.session_state.get(_FILE_STEM, "mhsa")


def shown_kind() -> str:
    """The attention of an encoder-decoder this page shows (``encoder``, ``decoder`` or
    ``cross``; ``encoder`` for every other model), as ``setup`` settled it."""
    return st.session_state.get(_KIND, "encoder")


def link_params() -> dict[str, Param]:
    """The link parameters of this page: the shared ones and the page's own."""
    return st.session_state.get(_PARAMS, GLOBAL_PARAMS)


def finish() -> None:
    """Mirror the final selections into the URL (call at the end of a page), say which value
    is too long to travel in a link, and offer the page's figures as one download."""
    _download_figures()
    runtime.collect_now_and_then()
    too_long = sync_url(link_params())
    if too_long:
        with st.sidebar:
            st.caption(
                f"Not in the link (too long to share by link, over "
                f"{MAX_LINK_VALUE_BYTES:,} bytes encoded): {', '.join(too_long)}. "
                "Share the text itself alongside the link."
            )


def _download_figures() -> None:
    """One sidebar button for every figure of the page: each as standalone HTML and its data
    as CSV, in a zip built only when clicked (one control per page instead of two under each
    figure, which crowded the page; measured, they did not slow it)."""
    figures = st.session_state.pop(_FIGURES, None)  # the button's callable keeps them
    if not figures:
        return
    stem = file_stem()
    with st.sidebar:
        st.download_button(
            f"Download the {len(figures)} figure{'s' * (len(figures) > 1)} (HTML + CSV, .zip)",
            data=lambda: exports.figures_zip(figures),
            file_name=f"{stem}-figures.zip",
            mime="application/zip",
            on_click="ignore",
            key="figures-zip",
            help="Each figure of this page as an interactive HTML file and the numbers it "
            "draws as CSV; plotly.js once in the zip, so the files open offline.",
        )


def _back_to_the_default_model(e: mhsa.ModelLoadError) -> NoReturn:
    """A model that does not load is not kept (in the sidebar, the link, every page): the
    page opens again on the default model, saying why under its title."""
    add_notice(f"{e} The pages show the default model instead.")
    st.session_state[_OPENING] = {**st.session_state.get(_OPENING, {}), "model": "default"}
    st.rerun()


def walkthrough_mode_note(kind: str, *, cross: bool) -> str | None:
    """What Inside MHSA walks through, in the words of its mode: cross attention (the
    decoder's queries, the encoder's keys and values), or the encoder's self-attention while
    the sidebar is on an encoder-decoder's other attention (and where that one is drawn);
    None for a layer's self-attention with nothing else chosen (nothing to say)."""
    if cross:
        return (
            "This page walks through cross attention: the decoder's tokens ask (queries), the "
            "sentence's tokens answer (keys and values)."
        )
    if kind != "encoder":
        return (
            f"This page walks through the encoder's self-attention; the {kind} attention "
            "chosen in the sidebar is on Heads, Line view, Compare, Head similarity and Head "
            "statistics (or turn on cross-attention above)."
        )
    return None


def truncation_message(result: mhsa.AttentionResult, server_limit: int) -> str:
    """The cut that happened, with the one limit that made it: this server's token limit, or
    the model's own (a toy model reads 64 tokens at most)."""
    cause = (
        f"this server's limit of {server_limit} tokens"
        if result.num_tokens >= server_limit and not result.is_partial
        else f"the most {result.model} reads"
    )
    return (
        f"The text was cut to {result.num_tokens} tokens, {cause}: the last "
        f"{result.truncated_tokens} tokens were dropped."
    )


def load(query: Query, *, primary: bool = True) -> mhsa.AttentionResult | None:
    """The result for ``query``, or None after showing what went wrong (the page goes on).
    ``primary``: the page's own sentence (the token search and the generated part refer to
    it); False for another sentence on the same page."""
    try:
        result = core.attention(query)
    except mhsa.ModelLoadError as e:
        if primary and query.model != "default":
            _back_to_the_default_model(e)
        error(e)
        return None
    except mhsa.MHSAError as e:
        error(e)
        long_inputs.ask_when_over_budget(e)
        return None
    if result.truncated_tokens:
        hint = " " + long_inputs.HINT if long_inputs.selection_reads_more(result, query) else ""
        st.warning(
            md_escape(truncation_message(result, LIMITS.max_tokens)) + hint,
            icon=":material/content_cut:",
        )
    if primary:
        examples.unknown_notice(query.model, query.device, query.text)
        with st.sidebar:
            st.caption(f"Running on **{md_escape(result.device)}**")
        if result.kind is None:
            _find(result)
            st.session_state[_GENERATED_FROM] = result.generated_from
        else:  # the search and the generated text are the sentence's: the encoder's view
            st.session_state[_FOUND] = st.session_state[_GENERATED_FROM] = None
    return result


def _find(result: mhsa.AttentionResult) -> None:
    """Resolve the sidebar's "Find a token" on this result: the match picked (several: a
    choice), selected on the pages that select a token, boxed in every figure of tokens."""
    state = st.session_state
    found = None
    matches = mhsa.engine.find_tokens(result.tokens, state["find"])
    with st.sidebar:
        if state["find"].strip() and not matches:
            st.caption("No token matches the search.")
        elif len(matches) > 1:
            st.selectbox(
                f"{len(matches)} matches",
                matches,
                key="match",
                format_func=lambda i: f"#{i} {result.tokens[i]}",
            )
            found = state["match"] if state.get("match") in matches else matches[0]
        elif matches:
            found = matches[0]
    if found is not None and state.get(_FOUND) != found:
        state["token"] = found  # the Heads page's token focus and the line view's token
        state["line_token"] = found
    state[_FOUND] = found


def table(
    frame: pd.DataFrame,
    name: str,
    *,
    label: str,
    height: int = 400,
    shown: int | None = None,
    column_config: dict[str, Any] | None = None,
) -> None:
    """A sortable table with its CSV download (in presentation mode an HTML table in a
    scrolling box, whose text is enlarged with the page's). ``shown``: the browser gets only
    the first ``shown`` rows (a caption says so); the CSV has every row, written when it is
    downloaded (Streamlit's deferred ``data``), not on every rerun. ``column_config``: as
    ``st.dataframe``'s (how columns are written; the CSV keeps the full values)."""
    if shown is not None and len(frame) > shown:
        st.caption(f"The first {shown:,} of {len(frame):,} rows; the CSV has them all.")
        frame_shown = frame.head(shown)
    else:
        frame_shown = frame
    if st.session_state.get("presentation"):
        # the data grid draws on a canvas that page styles cannot enlarge: in presentation
        # mode the rows are an HTML table, whose cells PRESENTATION_CSS sizes like the text
        with st.container(height=height + 200):
            st.table(_html_table(frame_shown, "name"))
    else:
        st.dataframe(frame_shown, width="stretch", height=height, column_config=column_config)
    st.download_button(
        label,
        lambda: frame.to_csv(index_label="name"),
        file_name=f"{name}.csv",
        mime="text/csv",
    )


def _html_table(frame: pd.DataFrame, index_name: str, *, hide_index: bool = False) -> Any:
    """``frame`` for ``st.table``: its index named ``index_name`` when it has no name (an
    empty header cell names nothing to a screen reader: axe-core's empty-table-header), or
    hidden."""
    if hide_index:
        return frame.style.hide(axis="index")
    return frame if frame.index.name is not None else frame.rename_axis(index_name)


def frame(data: pd.DataFrame, *, hide_index: bool = False, **kwargs: Any) -> None:
    """A table of a page (no download: ``table`` has one): Streamlit's data grid, or in
    presentation mode an HTML table whose text ``PRESENTATION_CSS`` enlarges with the page's
    (the grid draws on a canvas that page styles cannot reach). ``kwargs`` go to
    ``st.dataframe`` (the grid's widths and column formats)."""
    if st.session_state.get("presentation"):
        st.table(_html_table(pd.DataFrame(data), "row", hide_index=hide_index))
    else:
        st.dataframe(data, hide_index=hide_index, **kwargs)


def figure(
    fig: go.Figure,
    name: str,
    *,
    key: str | None = None,
    decorate: bool = True,
    download: bool = True,
    **kwargs: Any,
) -> Any:
    """A plotly chart whose camera button saves exactly what is on screen as PNG (4x) or SVG
    (the sidebar's choice); the page's zip (``finish``) holds it as standalone HTML and its
    data as CSV. Its ``alt`` (a screen reader's name of the chart) is ``plots.alt_text``'s
    sentence unless given. File names say the sentence (hash), the model and ``name`` (which
    says the layer and head). Margins fit the labels (``plots.fit_margins``).
    ``decorate``: box the found token and mark the generated text (figures of the page's
    sentence; off for figures of another one). ``download``: in the page's zip (off for a
    figure redrawn every second while a job runs)."""
    stem = f"{file_stem()}-{name}"
    fmt = st.session_state.get("export", "png")
    config = {
        "toImageButtonOptions": {
            "format": fmt if fmt in EXPORT_FORMATS else "png",
            "filename": stem,
            "scale": 4,
        },
        "displaylogo": False,
        # four buttons a figure, not eight to twelve: fewer Tab stops before the next control
        # (pan, box and lasso select stay on the mouse; zooming by button works by keyboard)
        "modeBarButtons": [["toImage", "zoomIn2d", "zoomOut2d", "resetScale2d"]],
    }
    found = st.session_state.get(_FOUND)
    generated_from = st.session_state.get(_GENERATED_FROM)
    if decorate and (found is not None or generated_from is not None):
        plots.decorate(fig, found=found, generated_from=generated_from)  # figures are per run
    if st.session_state.get("presentation"):
        plots.enlarge_fonts(fig)  # every tick, title, colour bar and hover: at least 20 px
    fig.update_layout(template=plots.TEMPLATE)  # real colours, none for the browser to fill in
    plots.fit_margins(fig)  # one drawing in the browser, not a second for automargin
    # the chart's text alternative (WCAG 1.1.1): one sentence from its numbers, which the
    # figure function stored or ``alt_text`` makes from its data; its numbers are in the
    # page's zip of figures (CSV), a table a screen reader reads
    kwargs.setdefault("alt", plots.alt_text(fig))
    event = st.plotly_chart(fig, key=key, config=config, **kwargs)
    if download:
        st.session_state.setdefault(_FIGURES, []).append((stem, fig))  # for the page's zip
    return event


def clicked_head(chart_key: str) -> tuple[int, int] | None:
    """The head (layer, head) whose marker was clicked on the head grid drawn under
    ``chart_key`` (``plots.head_grid``: trace 1's markers carry ``[layer, head]``, positions,
    then the model's own layer and head, which are returned when present), or None."""
    for point in st.session_state[chart_key].selection.get("points", []):
        data = point.get("customdata")
        if point.get("curve_number") == 1 and data is not None:
            values = list(data.values()) if isinstance(data, dict) else list(data)
            real = values[2:4] if len(values) >= 4 else values[:2]
            return int(real[0]), int(real[1])
    return None


def values_switch(query: Query) -> Query:
    """The "weights / weighted by value norm" switch (link key ``values``) of the pages that
    offer it; returns ``query`` asking for value norms when it is on (the encoder's attention
    only: another kind shows the weights, and says so)."""
    if query.kind != "encoder":
        st.caption(f"Weights: value norms are computed for the encoder, not the {query.kind}.")
        return query
    st.radio(
        "Values",
        list(core.VALUES),
        key="values",
        format_func=core.VALUES.get,
        horizontal=True,
        help="Weighted by value norm (Kobayashi et al. 2020): each weight times the norm of "
        "the vector the head carries from that key, ||(x W_V + b_V) W_O||: a large weight on a "
        "vector of small norm moves the output little.",
    )
    return query._replace(norms=st.session_state["values"] == "norm")


def corpus_queries(query: Query, label: str) -> tuple[Query, ...]:
    """The corpus box (``label`` says what a line holds on this page): one query per
    non-empty line, cut to this server's corpus limit with a notice; empty: ``query`` alone.
    The box keeps its text across the pages that have one."""
    corpus_text = st.text_area(label, key="corpus", height=100)
    lines = [line.strip() for line in (corpus_text or "").splitlines() if line.strip()]
    if len(lines) > LIMITS.max_corpus:
        st.warning(
            f"Only the first {LIMITS.max_corpus} of {len(lines)} sentences are used "
            f"(this server's corpus limit).",
            icon=":material/content_cut:",
        )
        lines = lines[: LIMITS.max_corpus]
    return tuple(query._replace(text=line) for line in lines) or (query,)


def switched_result(query: Query) -> tuple[Query, mhsa.AttentionResult]:
    """The opening of the pages with the values switch (Heads, Line view): ``values_switch``,
    then the result, the page stopping (after ``load`` said why) when there is none."""
    query = values_switch(query)
    result = load(query)
    if result is None:
        stop()
    return query, result


#: a text's tokens listed in the "as many tokens" warning up to this many
SHOWN_TOKENS = 32


def matched_tokens(
    tokens_of: Callable[[Query, str, str], tuple[str, ...]],
    query: Query,
    corrupted: str,
    why: str,
) -> list[tuple[str, ...]]:
    """The clean (``query.text``) and corrupted texts' tokens by ``tokens_of`` (Patching,
    Circuits: activations replaced position by position). The page stops with the library's
    message when a text cannot be read, or with a warning (``why``, then both texts' counts)
    when their lengths differ."""
    try:
        tokens = [
            tokens_of(query, query.text, "clean text"),
            tokens_of(query, corrupted, "corrupted text"),
        ]
    except mhsa.MHSAError as e:
        error(e)
        stop()
    if len(tokens[0]) != len(tokens[1]):
        shown = [
            f"{len(t)} tokens" + (f" {list(t)}" if len(t) <= SHOWN_TOKENS else "") for t in tokens
        ]
        st.warning(
            md_escape(
                f"{why}: the corrupted text needs as many tokens as the clean one. Clean: "
                f"{shown[0]}; corrupted: {shown[1]}. Edit one of them."
            ),
            icon=":material/content_cut:",
        )
        stop()
    return tokens

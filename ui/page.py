"""What every page does: page config, the shared sidebar, the current result, safe messages,
figures with their downloads."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

import mhsa
from mhsa import plots
from mhsa.jobs import Job, JobQueue, JobState
from ui import service
from ui.service import LIMITS, Query
from ui.state import (
    GLOBAL_PARAMS,
    MAX_LINK_VALUE_BYTES,
    Param,
    md_escape,
    show_notices,
    sync_url,
    use_params,
)
from ui.views import examples

__all__ = [
    "KIND_LABELS",
    "attention_kind",
    "clicked_head",
    "corpus_queries",
    "error",
    "figure",
    "finish",
    "heavy",
    "load",
    "md_escape",
    "open_head",
    "queue_place",
    "setup",
    "table",
    "values_switch",
]

#: how the camera button of every figure saves it (client-side: plotly.js draws the image of
#: exactly what is on screen, zoom and hidden traces included)
EXPORT_FORMATS = {"png": "PNG, 4x resolution", "svg": "SVG (vector, for papers)"}

#: session key of the figures drawn in this run: (file stem, figure)
_FIGURES = "_mhsa_figures"
#: session key of the selections a page opens another page with (``open_head``)
_OPENING = "_mhsa_opening"

#: an encoder-decoder's attentions, as the sidebar names them (link key ``kind``)
KIND_LABELS = {
    "encoder": "encoder (self-attention over the sentence)",
    "decoder": "decoder (causal self-attention over the target)",
    "cross": "cross (decoder tokens attend to the sentence's)",
}


PRESENTATION_CSS = """<style>
[data-testid="stMain"] p, [data-testid="stMain"] label, [data-testid="stMain"] li,
[data-testid="stMain"] input { font-size: 1.4rem !important; }
[data-testid="stMain"] h1, [data-testid="stMain"] h1 * { font-size: 3.4rem !important; }
[data-testid="stMain"] h3, [data-testid="stMain"] h3 * { font-size: 2.4rem !important; }
[data-testid="stMain"] pre, [data-testid="stMain"] code { font-size: 1.8rem !important; }
</style>"""


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
    return f'<script id="mhsa-page-script">{script}</script><style>{hide}</style>'


#: see page_script.js: faster first drawings of large figures
PAGE_SCRIPT = _page_script()


def setup(title: str, params: dict[str, Param] | None = None, *, kinds: bool = False) -> Query:
    """Page config, state from the URL, the sidebar. Returns the settings of the result.
    ``kinds``: the page draws any of an encoder-decoder's attentions (the sidebar's choice);
    else its query asks for the encoder's, and the page says so when another is chosen."""
    _use_the_navigation()
    st.session_state.update(st.session_state.pop(_OPENING, {}))  # before any widget is drawn
    st.set_page_config(page_title=f"{title} · MHSA Explorer", page_icon="🔍", layout="wide")
    all_params = GLOBAL_PARAMS | (params or {})
    use_params(all_params)
    st.html(PAGE_SCRIPT, unsafe_allow_javascript=True)
    if st.session_state.get("presentation"):
        st.markdown(PRESENTATION_CSS, unsafe_allow_html=True)  # constant CSS, no user text
    st.title(title)
    examples.fit_sentence_to_model()  # before the sidebar's widgets: it may set the sentence
    show_notices()
    query = _sidebar()
    if query.kind != "encoder" and not kinds:
        st.caption(
            f"This page shows the encoder's attention; the {query.kind} attention is on "
            "Heads, Line view, Compare, Head similarity and Head statistics."
        )
        query = query._replace(kind="encoder")
    st.session_state["_mhsa_kind"] = query.kind
    st.session_state["_mhsa_params"] = all_params
    st.session_state[_FIGURES] = []  # this run's figures (``figure``), downloaded by ``finish``
    return query


def open_head(query: Query, block: int, head: int) -> None:
    """Open the ``head`` of the ``block``-th attention block (as importance tables number them)
    on the Heads page: its layer and head selected, and for an encoder-decoder the sidebar's
    attention set to the head's (applied by ``setup`` on the next page, before its widgets)."""
    kind, layer = service.knock_out_kind(query, block)
    opening: dict[str, object] = {"layer": layer, "head": head}
    if kind != "self":
        opening["kind"] = kind
    st.session_state[_OPENING] = opening
    st.switch_page("pages/1_Heads.py")


def finish() -> None:
    """Mirror the final selections into the URL (call at the end of a page), say which value
    is too long to travel in a link, and offer the page's figures as one download."""
    _download_figures()
    service.collect_now_and_then()
    too_long = sync_url(st.session_state.get("_mhsa_params", GLOBAL_PARAMS))
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
    stem = st.session_state.get("_mhsa_file_stem", "mhsa")
    with st.sidebar:
        st.download_button(
            f"Download the {len(figures)} figure{'s' * (len(figures) > 1)} (HTML + CSV, .zip)",
            data=lambda: service.figures_zip(figures),
            file_name=f"{stem}-figures.zip",
            mime="application/zip",
            on_click="ignore",
            key="figures-zip",
            help="Each figure of this page as an interactive HTML file and the numbers it "
            "draws as CSV; plotly.js once in the zip, so the files open offline.",
        )


def _sidebar_model() -> str:
    """The model the sidebar names ("default" when the box is blank)."""
    return st.session_state["model"].strip() or "default"


def _sidebar() -> Query:
    """The shared sidebar: what to compute, then how to show it. Returns the settings of the
    result."""
    with st.sidebar:
        st.header("Settings")
        _what_to_compute()
        _generation()
        _encoder_decoder()
        _how_to_show()
    return _sidebar_query()


def _what_to_compute() -> None:
    """Sentence, model, engine (and the seed of untrained weights), device, whole words."""
    st.text_area(
        "Sentence",
        key="text",
        max_chars=LIMITS.max_chars,
        height=100,
        help="Press Ctrl+Enter (or click outside) to apply.",
    )
    st.text_input(
        "Model",
        key="model",
        help="'default' is the embedded all-MiniLM-L6-v2 (works offline); toy:induction, "
        "toy:reverse-seq2seq, ... are the shipped toy models. Or a transformers model id, or "
        "a local folder.",
    )
    examples.example_picker(_sidebar_model())
    st.radio(
        "Engine",
        mhsa.ENGINES,
        key="engine",
        format_func=lambda name: mhsa.ENGINE_SPECS[name].label,
        help="  \n".join(
            f"**{spec.label}**: {spec.description}." for spec in mhsa.ENGINE_SPECS.values()
        ),
    )
    if mhsa.ENGINE_SPECS[st.session_state["engine"]].seeded:
        st.number_input("Seed of the untrained weights", min_value=0, step=1, key="seed")
    st.selectbox("Device", mhsa.DEVICES, key="device")
    st.toggle("Whole words (merge sub-word tokens)", key="words")


def _generation() -> None:
    """Tokens to generate after the sentence (an encoder-decoder: the target), offered only
    for a model with a next-token head."""
    if not service.can_generate(_sidebar_model(), st.session_state["device"]):
        return
    if service.is_encoder_decoder(_sidebar_model(), st.session_state["device"]):
        label = "Generate the target (tokens; 0: type it)"
        what = (
            "This encoder-decoder writes the target for the sentence (greedy, or sampled "
            "from the seed): the decoder's tokens are exactly the ids it chose, its start "
            "token first."
        )
    else:
        label = "Generate tokens after the sentence"
        what = (
            "This model has a next-token head: it continues the sentence (greedy, or "
            "sampled from the seed), and every page shows attention over the sentence and "
            "what it wrote, the generated part behind a dashed green line."
        )
    st.number_input(label, 0, mhsa.MAX_NEW_TOKENS, key="generate", help=what)
    if st.session_state["generate"]:
        st.toggle("Sample (seeded) instead of greedy", key="sample")


def _encoder_decoder() -> None:
    """An encoder-decoder's target text (unless generated) and which of its attentions the
    pages draw (``attention_kind``)."""
    if not service.is_encoder_decoder(_sidebar_model(), st.session_state["device"]):
        return
    if not st.session_state["generate"]:
        st.text_area(
            "Target (decoder) text",
            key="target_text",
            max_chars=LIMITS.max_chars,
            height=70,
            help="What the decoder reads (a translation, a summary ...). Empty: the sentence "
            "itself. Or set the number above to let the model write it.",
        )
    attention_kind()


def attention_kind() -> str:
    """The attention of an encoder-decoder that the pages draw (link key ``kind``): the
    encoder's, the decoder's, or the cross attention (decoder tokens attending to the
    encoder's). Over whole words only the encoder's exists, and the choice says so."""
    if st.session_state["words"]:
        st.caption("Whole words: the encoder's attention only (turn them off for the others).")
        return "encoder"
    st.radio(
        "Attention",
        list(KIND_LABELS),
        key="kind",
        format_func=KIND_LABELS.get,
        help="An encoder-decoder has three: the encoder's self-attention, the decoder's "
        "causal self-attention, and cross attention, where the decoder's queries meet the "
        "encoder's keys and values (rows: decoder tokens; columns: the sentence's tokens).",
    )
    return st.session_state["kind"]


def _how_to_show() -> None:
    """The token search, presentation mode, the format figures save in."""
    st.text_input(
        "Find a token",
        key="find",
        max_chars=200,
        help="Selects the first matching token (case-insensitive, ## and Ġ ignored) and "
        "boxes it in red in every figure of tokens.",
    )
    st.toggle("Presentation mode (large text, for a projector)", key="presentation")
    st.radio(
        "Figures save as",
        list(EXPORT_FORMATS),
        key="export",
        format_func=EXPORT_FORMATS.get,
        horizontal=True,
        help="The camera button on every figure saves what is on screen in this format.",
    )


def _sidebar_query() -> Query:
    """The sidebar's settings as a ``Query`` (and the file stem of this run's downloads)."""
    state = st.session_state
    model = _sidebar_model()
    generate = int(state["generate"]) if service.can_generate(model, state["device"]) else 0
    seq2seq = service.is_encoder_decoder(model, state["device"])
    query = Query(
        state["text"],
        model,
        state["engine"],
        state["device"],
        int(state["seed"]),
        bool(state["words"]),
        generate,
        bool(state["sample"]),
        target=state["target_text"] if seq2seq and not generate else "",
        kind=state["kind"] if seq2seq and not state["words"] else "encoder",
    )
    state["_mhsa_file_stem"] = service.file_stem(query)
    return query


def error(e: Exception) -> None:
    st.error(md_escape(str(e)), icon="🚫")


def load(query: Query, *, primary: bool = True) -> mhsa.AttentionResult | None:
    """The result for ``query``, or None after showing what went wrong (the page goes on).
    ``primary``: the page's own sentence (the token search and the generated part refer to
    it); False for another sentence on the same page."""
    try:
        result = service.attention(query)
    except mhsa.MHSAError as e:
        error(e)
        return None
    if result.truncated_tokens:
        st.warning(
            f"The text was cut to {result.num_tokens} tokens: {result.truncated_tokens} tokens "
            f"were dropped (this server's limit is {LIMITS.max_tokens} tokens).",
            icon="✂️",
        )
    if primary:
        examples.unknown_notice(query.model, query.device, query.text)
        with st.sidebar:
            st.caption(f"Running on **{md_escape(result.device)}**")
        if result.kind is None:
            _find(result)
            st.session_state["_mhsa_generated_from"] = result.generated_from
        else:  # the search and the generated text are the sentence's: the encoder's view
            st.session_state["_mhsa_found"] = st.session_state["_mhsa_generated_from"] = None
    return result


def _find(result: mhsa.AttentionResult) -> None:
    """Resolve the sidebar's "Find a token" on this result: the match picked (several: a
    choice), selected on the pages that select a token, boxed in every figure of tokens."""
    state = st.session_state
    found = None
    matches = mhsa.find_tokens(result.tokens, state["find"])
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
    if found is not None and state.get("_mhsa_found") != found:
        state["token"] = found  # the Heads page's token focus and the line view's token
        state["line_token"] = found
    state["_mhsa_found"] = found


def table(frame: pd.DataFrame, name: str, *, label: str, height: int = 400) -> None:
    """A sortable table with its CSV download."""
    st.dataframe(frame, width="stretch", height=height)
    st.download_button(
        label, frame.to_csv(index_label="name"), file_name=f"{name}.csv", mime="text/csv"
    )


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
    data as CSV. File names say the sentence (hash), the model and ``name`` (which says the
    layer and head). Margins fit the labels (``plots.fit_margins``).
    ``decorate``: box the found token and mark the generated text (figures of the page's
    sentence; off for figures of another one). ``download``: in the page's zip (off for a
    figure redrawn every second while a job runs)."""
    stem = f"{st.session_state.get('_mhsa_file_stem', 'mhsa')}-{name}"
    fmt = st.session_state.get("export", "png")
    config = {
        "toImageButtonOptions": {
            "format": fmt if fmt in EXPORT_FORMATS else "png",
            "filename": stem,
            "scale": 4,
        },
        "displaylogo": False,
    }
    found = st.session_state.get("_mhsa_found")
    generated_from = st.session_state.get("_mhsa_generated_from")
    if decorate and (found is not None or generated_from is not None):
        plots.decorate(fig, found=found, generated_from=generated_from)  # figures are per run
    if st.session_state.get("presentation"):
        fig.update_layout(font={"size": 20}, title_font={"size": 28})
    fig.update_layout(template=plots.TEMPLATE)  # real colours, none for the browser to fill in
    plots.fit_margins(fig)  # one drawing in the browser, not a second for automargin
    event = st.plotly_chart(fig, key=key, config=config, **kwargs)
    if download:
        st.session_state.setdefault(_FIGURES, []).append((stem, fig))  # for the page's zip
    return event


def clicked_head(chart_key: str) -> tuple[int, int] | None:
    """The head (layer, head) whose marker was clicked on the head grid drawn under
    ``chart_key`` (``plots.head_grid``: trace 1's markers carry ``[layer, head]``), or None."""
    for point in st.session_state[chart_key].selection.get("points", []):
        data = point.get("customdata")
        if point.get("curve_number") == 1 and data is not None:
            values = list(data.values()) if isinstance(data, dict) else list(data)
            return int(values[0]), int(values[1])
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
        list(service.VALUES),
        key="values",
        format_func=service.VALUES.get,
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
            icon="✂️",
        )
        lines = lines[: LIMITS.max_corpus]
    return tuple(query._replace(text=line) for line in lines) or (query,)


#: session key of the heavy jobs this session holds a claim on, by the name a page gives each
_JOBS = "_mhsa_jobs"
#: session key of the jobs cancelled here, by name: their key, not run again until asked
_CANCELLED = "_mhsa_cancelled_jobs"


def heavy(
    name: str,
    key: tuple,
    compute: Callable[[service.Progress], Any],
    label: str,
    *,
    on_cancel: Callable[[], None] | None = None,
) -> Any | None:
    """Run ``compute(progress)`` through the server's heavy-job queue (``service.heavy_queue``)
    and return its value, or None while it waits its turn or once cancelled.

    The value comes from the shared cache when a finished job put it there under ``key``. A job
    that waits shows how many jobs are ahead of it, checks again every second in a fragment
    (the rest of the page is drawn meanwhile) and can be cancelled; a running job shows its
    progress and this run waits for it (the page's later elements need its value). These
    controls are cleared once the job has finished. ``name``
    says which of the page's jobs this is: a new ``key`` under the same name withdraws the
    session's claim on the old job. Its error, if it failed, is raised here.
    """
    hit = service.cached(key)
    if hit is not None:
        return hit
    cancelled: dict[str, tuple] = st.session_state.setdefault(_CANCELLED, {})
    if cancelled.get(name) == key:
        st.info(f"{label}: cancelled.", icon="⏹️")
        st.button("Run it again", key=f"again-{name}", on_click=cancelled.pop, args=(name,))
        return None
    try:
        queue = service.heavy_queue()
    except ValueError as e:  # a bad MHSA_MAX_HEAVY (ui.serve refuses it at start)
        error(e)
        return None
    job = _claim(queue, name, key, compute, label)
    cancel = {"on_click": _cancel, "args": (queue, name, job, key, on_cancel)}
    controls = st.empty()  # the queue's place or progress, and Cancel: only while it is pending
    with controls.container():
        if job.state is JobState.WAITING:
            st.button("Cancel", key=f"cancel-{name}", **cancel)
            _waiting(queue, job)
            return None
        if not job.finished:
            st.button("Cancel", key=f"cancel-{name}", **cancel)
            _follow(job, label)
    controls.empty()  # finished: no Cancel button left beside the result
    st.session_state[_JOBS].pop(name, None)
    if job.state is JobState.FAILED:
        raise job.error
    return job.result if job.state is JobState.DONE else None


def _claim(
    queue: JobQueue, name: str, key: tuple, compute: Callable[[service.Progress], Any], label: str
) -> Job:
    """The session's job called ``name`` for ``key``: the one it holds, else a new one in the
    queue (a job for another key under that name is withdrawn first)."""
    jobs: dict[str, Job] = st.session_state.setdefault(_JOBS, {})
    job = jobs.get(name)
    if job is not None and job.key != key:
        queue.cancel(job)
        job = None
    if job is None or job.state is JobState.CANCELLED:
        job = jobs[name] = queue.submit(
            key, functools.partial(service.compute_and_keep, key, compute), label
        )
    return job


def _cancel(
    queue: JobQueue, name: str, job: Job, key: tuple, on_cancel: Callable[[], None] | None
) -> None:
    """The Cancel button: withdraw the session's claim on the job; then the page's
    ``on_cancel``, or else the key is remembered as cancelled (not run again until asked)."""
    queue.cancel(st.session_state.setdefault(_JOBS, {}).pop(name, job))
    if on_cancel:
        on_cancel()
    else:
        st.session_state.setdefault(_CANCELLED, {})[name] = key


def _follow(job: Job, label: str) -> None:
    """A progress bar for a running job, until it ends (the page's later elements need its
    value)."""
    bar = st.progress(0.0, text=f"{label}…")
    while not job.wait(0.25):  # each update lets Streamlit stop this run for a newer one
        done, total = job.done_steps, job.total_steps
        text = f"{label}: {done} of {total} steps" if total else f"{label}…"
        bar.progress(min(1.0, done / max(total, 1)), text=text)
    bar.empty()


@st.fragment(run_every=1.0)
def _waiting(queue: JobQueue, job: Job) -> None:
    """A waiting job's place in the queue, checked every second; the whole page runs again
    once the job has its turn."""
    if job.state is not JobState.WAITING:
        st.rerun()
    queue_place(job, queue)


def queue_place(job: Job, queue: JobQueue | None = None) -> None:
    """How many heavy jobs are ahead of a waiting one (``queue``: the server's heavy queue)."""
    queue = queue or service.heavy_queue()
    ahead = queue.ahead(job)
    running, _ = queue.counts()
    st.info(
        f"{job.label} waits its turn: {ahead} heavy job{'s' if ahead != 1 else ''} ahead of "
        f"you ({running} running; this server runs {queue.limit} at a time). It starts by "
        "itself; the rest of the page works meanwhile.",
        icon="⏳",
    )

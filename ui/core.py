"""The core of the service layer between the pages (``ui``/``pages``) and the engine
(``mhsa``): the sidebar's settings (a ``Query``), models loaded once per process, the attention
result of a query, the process's shared cache, and the glue of the heavy-job queue. Each
feature's own values live in ``ui/views/<feature>.py`` and build on these.

Models load once per process; attention results live in one process-wide cache bounded in
bytes, shared read-only by every session (no copy per rerun); small derived analyses live in
Streamlit's data cache.

Cached functions take the settings (a small tuple of strings), never the large arrays, so that
Streamlit hashes a few bytes per call rather than the attention itself.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple, TypeVar

import streamlit as st

import mhsa
from mhsa.corpus.jobs import JobQueue, max_heavy_from_env
from mhsa.engine.cache import ResultCache
from mhsa.engine.models.limits import Limits
from ui.runtime import freeze_long_lived_objects, page_work

__all__ = [
    "LIMITS",
    "VALUES",
    "Progress",
    "Query",
    "as_distributions",
    "attention",
    "cached",
    "can_generate",
    "compute_and_keep",
    "computed_attention",
    "generation",
    "heavy_queue",
    "is_encoder_decoder",
    "loaded_model",
    "model_facts",
    "model_input",
    "result_cache",
    "shared",
    "shown",
    "shown_rows",
]

LIMITS = Limits.from_env()
T = TypeVar("T")
#: a heavy job's progress: (steps done, steps in all); raising from it cancels the job
Progress = Callable[[int, int], None]


class Query(NamedTuple):
    """What identifies one attention result."""

    text: str
    model: str = "default"
    engine: str = "transformers"
    device: str = "auto"
    seed: int = 0
    words: bool = False
    generate: int = 0  # tokens a causal LM writes after the text (0: none)
    sample: bool = False  # sampled from ``seed`` instead of greedy
    norms: bool = False  # also the weights weighted by value norm (``attend(norms=True)``)
    target: str = ""  # an encoder-decoder's decoder text ("": the text itself)
    kind: str = "encoder"  # which attention of an encoder-decoder (``mhsa.engine.ATTENTION_KINDS``)
    layers: str = ""  # long inputs: only these layers ("2", "0-3"; "": all)
    heads: str = ""  # and these heads of each ("0-7"; "": all)


#: what the Heads, Line view and Head statistics pages show (their link key ``values``)
VALUES = {"weights": "attention weights", "norm": "weighted by value norm"}


@st.cache_resource(max_entries=LIMITS.model_cache, show_spinner="Loading the model…")
def loaded_model(name: str, device: str) -> mhsa.engine.LoadedModel:
    """One model object per (name, device), shared by every session of the process."""
    Limits.from_env().check_model(name)  # read at call time: the operator's current policy
    model = mhsa.load_model(name, device=device, max_parameters=LIMITS.max_parameters)
    freeze_long_lived_objects()
    return model


@st.cache_resource
def result_cache() -> ResultCache:
    """The process's attention results (``MHSA_RESULT_CACHE_MB``), shared by every session."""
    return ResultCache(Limits.from_env().result_cache_mb * 2**20)


def model_facts(model: str, device: str) -> dict:
    """Layers, heads, d_model, ... of a model (loading it once)."""
    return loaded_model(model, device).facts()


def can_generate(model: str, device: str) -> bool:
    """The model loads and has a next-token head, a causal LM's or an encoder-decoder's
    (false for anything that fails to load: the page says why when it loads the result)."""
    try:
        return loaded_model(model, device).lm_head in ("causal", "seq2seq")
    except Exception:
        return False


def is_encoder_decoder(model: str, device: str) -> bool:
    """The model loads and is an encoder-decoder (T5, BART, Marian: a target text, and
    encoder, decoder and cross attention); false for anything that fails to load."""
    try:
        return loaded_model(model, device).is_encoder_decoder
    except Exception:
        return False


def generation(query: Query) -> mhsa.engine.Generation:
    """What the model writes after the query's text (an encoder-decoder: its target), as the
    ids it chose; one generation whichever attention is shown."""
    return _generated(query._replace(kind="encoder", target=""))


@st.cache_data(max_entries=LIMITS.result_cache, show_spinner="Generating…")
def _generated(query: Query) -> mhsa.engine.Generation:
    """``generation``, computed."""
    return mhsa.engine.generate_ids(
        query.text,
        model=loaded_model(query.model, query.device),
        max_new_tokens=query.generate,
        sample=query.sample,
        seed=query.seed,
    )


def model_input(query: Query) -> str | mhsa.engine.Generation:
    """What the library runs for ``query``: its sentence, or when it asks for generated tokens
    the ids the model chose (never its text tokenized again)."""
    return generation(query) if query.generate else query.text


def computed_attention(query: Query) -> mhsa.AttentionResult:
    """The attention result for ``query``, computed now (no cache)."""
    if len(query.text) > LIMITS.max_chars:
        raise mhsa.InputError(
            f"The text has {len(query.text):,} characters; this server accepts at most "
            f"{LIMITS.max_chars:,}. Shorten it."
        )
    lm = loaded_model(query.model, query.device)
    how: dict[str, Any] = {
        "model": lm,
        "engine": query.engine,
        "max_tokens": LIMITS.max_tokens,
        "seed": query.seed,
        "verify": mhsa.engine.ENGINE_SPECS[query.engine].verifiable,
        "norms": query.norms,
    }
    if query.generate:  # over the ids the model chose, not its text tokenized again
        result = mhsa.engine.attend_generated(generation(query), **how)
    elif query.layers or query.heads:  # long inputs: the selection, up to the model's limit
        how["max_tokens"] = lm.max_positions
        result = mhsa.attend(
            query.text,
            text_pair=query.target or None,
            layers=query.layers or None,
            heads=query.heads or None,
            max_attention_mb=LIMITS.max_attention_mb,
            **how,
        )
    else:
        result = mhsa.attend(
            query.text,
            text_pair=query.target or None,
            max_attention_mb=LIMITS.max_attention_mb,
            **how,
        )
    result = result.to_words() if query.words else result
    return result.of_kind(query.kind)


def attention(query: Query) -> mhsa.AttentionResult:
    """The attention result for these settings (tokens or whole words; the encoder's, the
    decoder's or the cross attention of an encoder-decoder, ``Query.kind``): the one shared,
    read-only object from the result cache, computed on a miss (one computation for every
    kind). The ``mhsa`` engine is verified against the model's own forward once, here, and the
    figures travel in the result."""
    whole = query._replace(kind="encoder")

    def compute() -> mhsa.AttentionResult:
        with page_work():
            return computed_attention(whole)

    return shared(whole, compute, "Computing attention…").of_kind(query.kind)


def shown(result: mhsa.AttentionResult) -> mhsa.AttentionResult:
    """What a page draws of ``result``: its weights, or, for a result with value norms
    (``Query.norms``), the weights weighted by value norm in their place (no copy)."""
    return result if result.norms is None else mhsa.engine.norms_as_attention(result)


def as_distributions(result: mhsa.AttentionResult) -> mhsa.AttentionResult:
    """``result`` for statistics defined on distributions: the weights, or the weights weighted
    by value norm with each query's row scaled to sum 1."""
    if result.norms is None:
        return result
    return mhsa.engine.norms_as_attention(result, rows_sum_to_one=True)


def shown_rows(query: Query) -> mhsa.AttentionResult:
    """``shown`` with each query's row scaled to sum 1 when the query asks for value norms
    (a line's opacity is its share of the row), shared in the result cache."""
    if not query.norms:
        return attention(query)
    return shared(("rows", query), lambda: as_distributions(attention(query)))


def shared(key: Hashable, compute: Callable[[], T], spinner: str | None = None) -> T:
    """The value the process's shared cache holds under ``key``; on a miss ``compute()``'s,
    computed under a ``spinner`` message when given and kept there for every session."""
    cache = result_cache()
    hit = cache.get(key)
    if hit is not None:
        return hit
    with st.spinner(spinner) if spinner else contextlib.nullcontext():
        return cache.put(key, compute())


# --- heavy work: the queue's glue -----------------------------------------------------------
@functools.cache
def heavy_queue() -> JobQueue:
    """The process's one queue of heavy jobs (``MHSA_MAX_HEAVY`` at once); page views never
    enter it."""
    return JobQueue(max_heavy_from_env())


def cached(key: tuple) -> object | None:
    """A heavy job's value from the shared cache, if it is there."""
    return result_cache().get(key)


def compute_and_keep(key: tuple, compute: Callable[[Progress], T], progress: Progress) -> T:
    """A heavy job's body: ``compute(progress)``, kept in the shared cache under ``key`` (where
    ``cached`` finds it, whichever session asks next)."""
    return result_cache().put(key, compute(progress))

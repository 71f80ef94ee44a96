"""The Information flow page's values: the flow's contributions and routes
(``mhsa.causal.flow``), direct logit attribution per head and the logit lens
(``mhsa.causal.attribution``)
of the sentence, each kept in the shared cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import mhsa
from mhsa.causal import attribution, flow
from ui.core import Progress, Query, generation, loaded_model, shared
from ui.runtime import page_work

__all__ = [
    "FLOW_MAX_TOKENS",
    "flow_contributions",
    "flow_graph",
    "flow_key",
    "flow_text",
    "head_attribution",
    "logit_lens",
    "predicted_words",
]

T = TypeVar("T")

#: tokens the Information flow page reads (the flow's terms grow with the square of the length)
FLOW_MAX_TOKENS = 128


def flow_text(query: Query) -> str | mhsa.engine.Generation:
    """What the Information flow page decomposes: the sentence, or the sentence and what the
    model wrote as the ids it chose."""
    return generation(query) if query.generate else query.text


def flow_key(query: Query) -> tuple:
    """The shared cache's key of the flow contributions of ``query``'s text."""
    return ("flow", query.model, query.device, flow_text(query))


def flow_contributions(query: Query, progress: Progress | None = None) -> flow.FlowContributions:
    """``mhsa.causal.flow.flow_contributions`` of the query's text (a heavy job's body: the caller
    keeps it with ``compute_and_keep``)."""
    if progress is not None:
        progress(0, 1)
    return flow.flow_contributions(
        flow_text(query),
        model=loaded_model(query.model, query.device),
        max_tokens=FLOW_MAX_TOKENS,
    )


def flow_graph(
    contributions: flow.FlowContributions, threshold_percent: int, renormalize: bool, output: int
) -> flow.FlowGraph:
    """The routes to token ``output`` through contributions over ``threshold_percent`` / 100."""
    return flow.flow_graph(
        contributions,
        threshold=threshold_percent / 100,
        renormalize=renormalize,
        outputs=(output,),
    )


def _with_answers(
    name: str, compute: Callable[..., T], query: Query, answer: str | None, wrong: str | None
) -> T:
    """``compute(text, model=, answer=, wrong=, max_tokens=)`` of the query's text, kept in the
    shared cache under ``name`` and the inputs."""
    text = flow_text(query)

    def run() -> T:
        with page_work():
            return compute(
                text,
                model=loaded_model(query.model, query.device),
                answer=answer,
                wrong=wrong,
                max_tokens=FLOW_MAX_TOKENS,
            )

    return shared((name, query.model, query.device, text, answer, wrong), run)


def head_attribution(query: Query, answer: str, wrong: str) -> attribution.HeadAttribution:
    """``mhsa.causal.attribution.head_attribution`` of the query's text, kept in the shared
    cache."""
    return _with_answers("dla", attribution.head_attribution, query, answer, wrong)


def logit_lens(query: Query, answer: str | None, wrong: str | None) -> attribution.LogitLens:
    """``mhsa.causal.attribution.logit_lens`` of the query's text, kept in the shared cache."""
    return _with_answers("lens", attribution.logit_lens, query, answer, wrong)


def predicted_words(query: Query) -> tuple[str, ...]:
    """The model's top two predictions after the query's text, as words (candidate answers)."""
    return attribution.predicted_words(logit_lens(query, None, None))

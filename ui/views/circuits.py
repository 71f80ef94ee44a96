"""The Circuits page's values: every edge's score (``mhsa.circuits.edge_attribution``), the
faithfulness curve with the chosen circuit size (``mhsa.circuits.faithfulness_curve``), one edge
path-patched (``mhsa.circuits.path_patch``) and the heads Head roles names; each kept in the shared
cache."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import pandas as pd

import mhsa
from mhsa.circuits import top_edges
from mhsa.engine.encoding import check_text, encode
from ui.core import LIMITS, Progress, Query, loaded_model, shared

__all__ = [
    "CIRCUIT_EXAMPLES",
    "EDGES_SHOWN",
    "MAX_DRAWN",
    "MAX_EXACT_EDGES",
    "CircuitSettings",
    "CircuitView",
    "circuit_graph",
    "circuit_problem",
    "circuit_tokens",
    "circuit_view",
    "edge_table",
    "induction_heads",
    "path_patched",
]

#: the circuit figure draws at most this many edges (the table and the curve take any n)
MAX_DRAWN = 150
#: "exact" runs every edge alone (32 per pass): offered up to this many edges
MAX_EXACT_EDGES = 5000

#: the page's one-click examples: their settings (the sidebar's model among them)
CIRCUIT_EXAMPLES: dict[str, dict[str, Any]] = {
    "toy:induction (a repeat, and the repeat broken)": {
        "model": "toy:induction",
        "engine": "transformers",
        "clean": "ba ke mo di fu lo ni pa su te ba ke mo di fu",
        "corrupted": "ba ke mo di ra lo ni pa su te ba ke mo di fu",
        "answer": "lo",
        "wrong": "ba",
        "circuit_method": "eap-ig",
        "circuit_n": 20,
    },
    "toy:reverse (a causal LM: which symbol comes next)": {
        "model": "toy:reverse",
        "engine": "transformers",
        "clean": "ba ke mo di fu [SEP] fu di",
        "corrupted": "ba ke ra di fu [SEP] fu di",
        "answer": "mo",
        "wrong": "ra",
        "circuit_method": "eap-ig",
        "circuit_n": 20,
    },
    "MiniLM (the embedding target)": {
        "model": "default",
        "clean": "The cat sat on the mat.",
        "corrupted": "The dog sat on the mat.",
        "circuit_target": "embedding",
        "circuit_method": "eap-ig",
        "circuit_steps": 5,
        "circuit_n": 20,
    },
}


class CircuitSettings(NamedTuple):
    """What the Circuits page asks besides its clean text (a query's text) and the model:
    ``answer`` and ``wrong`` for causal LMs, ``target`` (and ``pair``, the second sentence of
    "similarity") for encoders (``mhsa.causal.PATCH_TARGETS``; "" for causal LMs)."""

    corrupted: str
    answer: str
    wrong: str
    method: str
    steps: int
    target: str = ""
    pair: str = ""


@dataclasses.dataclass(frozen=True)
class CircuitView:
    """Every edge's score and the faithfulness curve (MIB's sizes and the chosen ``n``)."""

    scores: pd.DataFrame
    curve: mhsa.circuits.FaithfulnessCurve
    n: int

    @property
    def circuit(self) -> pd.DataFrame:
        """The top ``n`` edges by |score|."""
        return top_edges(self.scores, self.n)

    @property
    def faithfulness(self) -> float:
        """f of the top ``n`` edges."""
        points = self.curve.points
        return float(points[~points["mib"]]["faithfulness"].iloc[0])


def circuit_problem(query: Query) -> str | None:
    """Why circuits cannot run on the query's model (which tools need what), or None."""

    def compute() -> str:
        try:
            mhsa.circuits.circuit_graph(loaded_model(query.model, query.device))
        except mhsa.UnsupportedModelError as e:
            return str(e)
        return ""

    return shared(("circuit-problem", query.model, query.device), compute) or None


def circuit_graph(query: Query) -> mhsa.circuits.CircuitGraph:
    """The query's model's circuit graph (call after ``circuit_problem`` said None)."""
    return shared(
        ("circuit-graph", query.model, query.device),
        lambda: mhsa.circuits.circuit_graph(loaded_model(query.model, query.device)),
    )


def circuit_tokens(query: Query, text: str, what: str) -> tuple[str, ...]:
    """The tokens the model sees for ``text`` (the page compares the two texts' first).

    Raises:
        InputError: an empty text (named as ``what``).
    """

    def compute() -> tuple[str, ...]:
        lm = loaded_model(query.model, query.device)
        with lm.lock:
            return encode(lm, check_text(text, what), None, LIMITS.max_tokens).tokens.strings

    return shared(("circuit-tokens", query.model, query.device, text), compute)


def _arguments(query: Query, settings: CircuitSettings) -> dict[str, Any]:
    metric: dict[str, Any] = {"answer": settings.answer or None, "wrong": settings.wrong or None}
    if settings.target:
        pair = settings.pair if settings.target == "similarity" else None
        metric = {"target": settings.target, "text_pair": pair}
    return {
        "model": loaded_model(query.model, query.device),
        **metric,
        "max_tokens": LIMITS.max_tokens,
    }


def circuit_view(
    query: Query, settings: CircuitSettings, n: int, progress: Progress | None = None
) -> CircuitView:
    """The scores of every edge of ``query.text`` (clean) against ``settings.corrupted`` and
    the faithfulness curve with the top ``n`` marked (a heavy job's body)."""
    base = ("circuit", query.text, query.model, query.device, settings)
    clean, corrupted = query.text, settings.corrupted
    scores = shared(
        (*base, "scores"),
        lambda: mhsa.circuits.edge_attribution(
            clean,
            corrupted,
            method=settings.method,
            steps=settings.steps,
            progress=progress,
            **_arguments(query, settings),
        ),
    )
    curve = shared(
        (*base, "curve", n),
        lambda: mhsa.circuits.faithfulness_curve(
            clean, corrupted, scores, extra=(n,), **_arguments(query, settings)
        ),
    )
    return CircuitView(scores, curve, n)


def path_patched(
    query: Query, settings: CircuitSettings, edge: tuple[str, str, str]
) -> mhsa.circuits.PathPatch:
    """One edge path-patched (``mhsa.circuits.path_patch``), kept in the shared cache."""
    key = ("circuit-edge", query.text, query.model, query.device, settings, edge)
    return shared(
        key,
        lambda: mhsa.circuits.path_patch(
            query.text, settings.corrupted, *edge, **_arguments(query, settings)
        ),
    )


#: the edges the page's table sends to the browser (largest |score| first); the CSV has all
EDGES_SHOWN = 500


def edge_table(scores: pd.DataFrame, output: str = "logits") -> pd.DataFrame:
    """Every edge, largest |score| first, with its rank (1 = the largest) and its support
    (``-score``: above 0 when the edge carries the clean answer, as the graph colours it):
    the CSV. ``output``: what the graph calls its ``logits`` node (an encoder's: the last
    hidden state), the name the table uses too."""
    table = top_edges(scores, len(scores)).reset_index(drop=True)
    table.insert(0, "rank", range(1, len(table) + 1))
    table["support"] = -table["score"]
    table["target"] = table["target"].replace("logits", output)
    return table


def induction_heads(query: Query) -> tuple[str, str]:
    """The heads Head roles names: the best previous-token head on the clean text and the best
    induction head on repeated random tokens (``mhsa.detect_heads``)."""

    def compute() -> tuple[str, str]:
        lm = loaded_model(query.model, query.device)
        previous = mhsa.detect_heads(query.text, "previous token", model=lm)["score"].idxmax()
        induction = mhsa.detect_heads(None, "induction", model=lm)["score"].idxmax()
        return str(previous), str(induction)

    return shared(("circuit-roles", query.model, query.device, query.text), compute)

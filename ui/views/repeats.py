"""The Head roles page's repeated-random-tokens test as figures: the sequence the test ran on
(the first of its ten), so that the top heads' maps and the detection pattern show the input
the scores came from (``mhsa.analysis.repeats.repeated_tokens``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import mhsa
from mhsa.analysis.repeats import repeated_tokens
from mhsa.analysis.roles import detection_pattern
from ui import core
from ui.core import Query

__all__ = ["RepeatedTokens", "repeated_sequence"]


@dataclass(frozen=True)
class RepeatedTokens:
    """The test's first sequence: its attention result and its induction pattern ``[n, n]``."""

    result: mhsa.AttentionResult
    pattern: np.ndarray


def repeated_sequence(query: Query) -> RepeatedTokens:
    """The random-token test's first sequence for the sidebar's model, engine and seed (the
    seed ``ui.views.roles.random_induction`` scores with), computed once per process."""
    key = ("repeated-sequence", query.model, query.device, query.engine, query.seed)
    cache = core.result_cache()
    hit = cache.get(key)
    if hit is not None:
        return hit
    lm = core.loaded_model(query.model, query.device)
    result, ids = repeated_tokens(lm, engine=query.engine, seed=query.seed)
    return cache.put(key, RepeatedTokens(result, detection_pattern("induction", ids)))

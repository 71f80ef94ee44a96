"""Statistics and similarity of long inputs layer by layer: the peak is one layer's attention.

Each selected layer of each text goes, as soon as the pass has computed it, into the corpus
accumulators (``HeadStatsAccumulator``, ``HeadSimilarityAccumulator``) of its layer, and is
dropped (``mhsa.engine.extract.attend_layers``). The numbers equal ``head_stats`` and
``head_similarity`` of the whole result's same heads (``tests/test_partial.py``).

Similarity is computed within each layer: comparing heads of two layers would hold both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypedDict, Unpack

import pandas as pd

from mhsa.analysis.similarity import HeadSimilarityAccumulator
from mhsa.analysis.stats import HeadStatsAccumulator
from mhsa.engine.extract import attend_layers
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.result import AttentionResult

__all__ = ["streamed_head_similarity", "streamed_head_stats"]


class StreamOptions(TypedDict, total=False):
    """What the streamed analyses pass on to ``attend_layers``: as for ``attend`` (its
    defaults: every layer and head, the model's own attention, float32, no token limit)."""

    engine: str
    layers: str | int | Sequence[int] | None
    heads: str | int | Sequence[int] | None
    attention_dtype: str
    max_tokens: int | None


def _texts(texts: str | Sequence[str]) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


def _per_layer(
    texts: str | Sequence[str],
    new_accumulator: Callable[[], Any],
    *,
    model: str | LoadedModel,
    **options: Unpack[StreamOptions],
) -> dict[int, Any]:
    """Each selected layer of each text added, as ``attend_layers`` computes it, to its
    layer's accumulator (made by ``new_accumulator`` on the layer's first result)."""
    lm = resolve_model(model)
    per_layer: dict[int, Any] = {}

    def add(layer: AttentionResult) -> None:
        acc = per_layer.get(layer.layers[0])
        if acc is None:
            acc = per_layer[layer.layers[0]] = new_accumulator()
        acc.add(layer)

    for text in _texts(texts):
        attend_layers(text, add, model=lm, **options)
    return per_layer


def streamed_head_stats(
    texts: str | Sequence[str],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    word_level: bool = False,
    **options: Unpack[StreamOptions],
) -> pd.DataFrame:
    """``head_stats`` of the selected layers and heads over one text or several, computed one
    layer at a time (``attend_layers``): the same table, rows ``L{layer}H{head}`` of the
    model's layers, layer-major.

    Args:
        texts: a text or texts.
        model: as for ``attend``.
        word_level: merge sub-word tokens into words first (``AttentionResult.to_words``).
        **options: ``engine``, ``layers``, ``heads``, ``attention_dtype``, ``max_tokens``: as
            for ``attend`` (``StreamOptions``).

    Raises:
        InputError, ModelLoadError, UnsupportedModelError: as ``attend``.
    """
    accumulator = partial(HeadStatsAccumulator, word_level=word_level)
    per_layer = _per_layer(texts, accumulator, model=model, **options)
    return pd.concat([per_layer[layer].frame() for layer in sorted(per_layer)])


def streamed_head_similarity(
    texts: str | Sequence[str],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    metric: str = "js",
    **options: Unpack[StreamOptions],
) -> dict[int, pd.DataFrame]:
    """``head_similarity`` of each selected layer's heads, averaged over the texts, computed one
    layer at a time: per layer (the model's number), its heads x heads frame labelled
    ``L{layer}H{head}``. ``model`` and ``options`` (``StreamOptions``) as for
    ``streamed_head_stats``.

    Raises:
        InputError, ModelLoadError, UnsupportedModelError: as ``attend``; ValueError: an
            unknown metric.
    """
    lm = resolve_model(model)
    HeadSimilarityAccumulator(metric)  # an unknown metric fails before any model runs
    per_layer = _per_layer(texts, lambda: HeadSimilarityAccumulator(metric), model=lm, **options)
    return {layer: per_layer[layer].frame() for layer in sorted(per_layer)}

"""The Head importance page's values, and the Heads page's knock-outs: which heads matter
(``mhsa.causal.head_importance``, ``mhsa.causal.pruning_curve``, ``mhsa.ablate``) over a sentence or
a corpus, and the statistics importance is set against."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pandas as pd

import mhsa
from mhsa.heads import kind_head_label
from ui.core import (
    LIMITS,
    Progress,
    Query,
    attention,
    is_encoder_decoder,
    loaded_model,
    model_input,
    shared,
)
from ui.views.statistics import first_sentence_stats

__all__ = [
    "ablation",
    "importance",
    "importance_and_pruning",
    "importance_stats",
    "knock_out_kind",
    "knock_out_labels",
    "pruning",
]


def importance_stats(queries: tuple[Query, ...]) -> pd.DataFrame:
    """The statistics importance is set against: ``first_sentence_stats``, or for an
    encoder-decoder every attention's (its encoder's, decoder's and cross attention's heads,
    indexed by their knock-out labels ``E0H1``, ``D0H1``, ``C0H1``)."""
    first = queries[0]
    if not is_encoder_decoder(first.model, first.device):
        return first_sentence_stats(queries)
    frames = []
    for kind in mhsa.engine.ATTENTION_KINDS:
        stats = first_sentence_stats(tuple(q._replace(kind=kind, words=False) for q in queries))
        labels = [
            kind_head_label(kind, li, h)
            for li, h in zip(stats["layer"], stats["head"], strict=True)
        ]
        frames.append(stats.set_axis(labels))
    return pd.concat(frames)


def knock_out_kind(query: Query, block: int) -> tuple[str, int]:
    """The attention (``self``, or an encoder-decoder's ``encoder``, ``decoder``, ``cross``)
    and the layer within it of the ``block``-th attention block, as importance tables number
    them (an encoder-decoder's encoder layers, then decoder, then cross)."""
    for kind, labels in knock_out_labels(query._replace(words=False)).items():
        layers = len({label.rsplit("H", 1)[0] for label in labels})
        if block < layers:
            return kind, block
        block -= layers
    raise mhsa.InputError("No such attention block in this model.")


def _importance_key(queries: tuple[Query, ...]) -> tuple[tuple[object, ...], ...]:
    """What importance depends on: texts (an encoder-decoder's target too), model, device (not
    the engine: knock-outs always run through our module with the model's weights; not whole
    words: computed on tokens; not the attention shown: every kind's heads are measured)."""
    return tuple((model_input(q), q.target, q.model, q.device) for q in queries)


def _scored_input(query: Query) -> object:
    """What importance scores for ``query``: its input (``model_input``), and an
    encoder-decoder's target beside the sentence (the decoder's loss of it): a corpus line's
    ``source || target``, else the sidebar's typed target (none: the sentence itself)."""
    text = model_input(query)
    if not isinstance(text, str) or not is_encoder_decoder(query.model, query.device):
        return text
    source, bar, target = text.partition("||")
    if bar and source.strip() and target.strip():
        return source.strip(), target.strip()
    return (text, query.target) if query.target else text


def _items(queries: tuple[Query, ...], pair: str, target: str | None) -> list[object]:
    """Sentences (an encoder-decoder's with its target: ``_scored_input``), or for
    ``similarity`` pairs: ``A || B`` on a corpus line, else the page's second sentence."""
    if target != "similarity":
        return [_scored_input(q) for q in queries]
    items: list[object] = []
    for q in queries:
        first, bar, second = q.text.partition("||")
        items.append((first.strip(), second.strip()) if bar and second.strip() else (q.text, pair))
    return items


def knock_out_labels(query: Query) -> dict[str, list[str]]:
    """The heads a knock-out can name for ``query``'s model, by the attention they belong to:
    ``{"self": ["L0H0", ...]}``, or an encoder-decoder's ``encoder``, ``decoder`` and ``cross``
    heads (``E0H0``, ``D0H0``, ``C0H0``; over whole words the encoder's alone), read from the
    cached result's shapes."""
    whole = attention(query._replace(kind="encoder"))
    if not is_encoder_decoder(query.model, query.device):
        return {"self": whole.head_labels()}
    kinds = mhsa.engine.ATTENTION_KINDS if whole.is_encoder_decoder else ("encoder",)
    return {
        kind: [
            kind_head_label(kind, layer, head)
            for layer in range(shape.num_layers)
            for head in range(shape.num_heads)
        ]
        for kind in kinds
        for shape in (whole.of_kind(kind),)
    }


def ablation(query: Query, off: tuple[str, ...], target: str | None) -> mhsa.causal.Ablation:
    """The sentence with the heads in ``off`` switched off, beside the intact model (shared
    process-wide, bounded by the result cache's bytes)."""
    key = ("ablation", _importance_key((query,)), off, target, query.words)

    def compute() -> mhsa.causal.Ablation:
        ablation = mhsa.ablate(
            model_input(query),
            off,
            model=loaded_model(query.model, query.device),
            target=target,
            text_pair=query.target or None,  # an encoder-decoder's typed target
            max_tokens=LIMITS.max_tokens,
        )
        if not query.words:
            return ablation
        return dataclasses.replace(
            ablation, intact=ablation.intact.to_words(), ablated=ablation.ablated.to_words()
        )

    return shared(key, compute, "Switching heads off…")


def _over_sentences(
    compute: Callable[..., pd.DataFrame],
    queries: tuple[Query, ...],
    pair: str,
    target: str | None,
    progress: Progress | None,
    **options: Any,
) -> pd.DataFrame:
    """``compute`` (``mhsa.causal.head_importance``, ``mhsa.causal.pruning_curve``) over the
    sentences, on the first query's model, within the app's token limit."""
    first = queries[0]
    return compute(
        _items(queries, pair, target),
        model=loaded_model(first.model, first.device),
        target=target,
        max_tokens=LIMITS.max_tokens,
        progress=progress,
        **options,
    )


def importance(
    queries: tuple[Query, ...],
    method: str,
    target: str | None,
    pair: str,
    normalize: bool,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """``mhsa.causal.head_importance`` over the sentences, kept in the shared cache; ``progress``
    sees each step (raising from it cancels: nothing half-done is kept)."""
    key = ("importance", _importance_key(queries), method, target, pair, normalize)
    return shared(
        key,
        lambda: _over_sentences(
            mhsa.causal.head_importance,
            queries,
            pair,
            target,
            progress,
            method=method,
            normalize=normalize,
        ),
    )


def pruning(
    queries: tuple[Query, ...],
    method: str,
    target: str | None,
    pair: str,
    seed: int,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """``mhsa.causal.pruning_curve`` (importance order from ``importance``, computed once) with its
    seeded random baseline, kept in the shared cache."""
    key = ("pruning", _importance_key(queries), method, target, pair, seed)

    def compute() -> pd.DataFrame:
        table = importance(queries, method, target, pair, False, progress)
        return _over_sentences(
            mhsa.causal.pruning_curve, queries, pair, target, progress, seed=seed, importance=table
        )

    return shared(key, compute)


def importance_and_pruning(
    queries: tuple[Query, ...],
    method: str,
    target: str | None,
    pair: str,
    normalize: bool,
    seed: int,
    progress: Progress | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``importance`` and ``pruning`` in one heavy job (the curve needs the importance)."""
    table = importance(queries, method, target, pair, normalize, progress)
    return table, pruning(queries, method, target, pair, seed, progress)

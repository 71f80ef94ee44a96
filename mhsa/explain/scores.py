"""How well a program's pattern P explains a head's attention A, over one text or several.

Every score reads every query but the first (a causal model's first query can see one key only,
and an encoder's [CLS] row is the same in every text): for a text of n tokens, queries 1 to
n - 1. ``A`` and ``P`` are ``[n, n]`` arrays (rows: queries, columns: keys) or sequences of them,
one per text; a row of P that is all zero (the program gives that query no key,
``mhsa.explain.programs``) counts as a miss in each score.

- ``soft_iou``: sum over queries and keys of ``min(A, P)`` divided by the sum of ``max(A, P)``,
  per text, averaged over texts (the soft IoU of Hayes, Li and Andreas 2026, "Explaining
  Attention with Program Synthesis": 1 when the patterns are equal, 0 when they share no weight).
- ``accuracy``: the share of queries, pooled over the texts, whose most-attended key (the first
  at a tie) is one the program gives weight to (Clark et al. 2019, "What Does BERT Look At?",
  section 5: a head "predicts" the key it attends to most).
- ``auc``: the ROC-AUC of P as a classifier of the head's strongest pairs against weak random
  ones, as OpenAI's Transformer Debugger scores an explanation of a head
  (``neuron_explainer/explanations/attention_head_scoring.py``,
  ``AttentionHeadOneAtATimeScorer.score_explanation``): a pair is (query, key); pairs are ranked
  by the attention write norm ``A[q, k] * ||f_h(x_k)||`` (Kobayashi et al. 2020, the atlas's
  "norm"); the positives are the ``pairs`` strongest, the negatives ``pairs`` drawn at random
  from those whose write norm is below ``threshold`` (a tenth) of the largest; each pair's
  score is its weight in P; ``sklearn.metrics.roc_auc_score``. TDB draws 5 of each and asks a
  language model to predict each pair; a program predicts exactly and costs nothing to ask,
  so 50 of each are drawn by default (from a seeded generator: the same pairs every time).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mhsa.errors import InputError

__all__ = ["AUC_PAIRS", "LOW_THRESHOLD", "accuracy", "auc", "soft_iou"]

#: positives and negatives ``auc`` draws by default
AUC_PAIRS = 50
#: negatives are pairs whose write norm is below this share of the largest (TDB's
#: ``low_activation_threshold``)
LOW_THRESHOLD = 0.1

Arrays = np.ndarray | Sequence[np.ndarray]


def _texts(a: Arrays, what: str) -> list[np.ndarray]:
    items = [a] if isinstance(a, np.ndarray) and a.ndim == 2 else list(a)
    out = []
    for x in items:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != x.shape[1]:
            raise InputError(f"{what} must be square [n, n] arrays, got shape {x.shape}.")
        out.append(x)
    return out


def _pairs(a: Arrays, p: Arrays) -> list[tuple[np.ndarray, np.ndarray]]:
    """The texts' (A, P) without their first query; texts of one token left out."""
    attention, pattern = _texts(a, "The attention"), _texts(p, "The pattern")
    if len(attention) != len(pattern):
        raise InputError(f"{len(attention)} attention arrays for {len(pattern)} patterns.")
    out = []
    for x, y in zip(attention, pattern, strict=True):
        if x.shape != y.shape:
            raise InputError(f"An attention of shape {x.shape} against a pattern of {y.shape}.")
        if len(x) > 1:
            out.append((x[1:], y[1:]))
    return out


def soft_iou(a: Arrays, p: Arrays) -> float:
    """Soft IoU of A and P per text (``sum min / sum max`` over every query but the first and
    every key), averaged over the texts; NaN when no text has two tokens."""
    values = []
    for x, y in _pairs(a, p):
        top = np.maximum(x, y).sum()
        values.append(np.minimum(x, y).sum() / top if top > 0 else 1.0)
    return float(np.mean(values)) if values else float("nan")


def accuracy(a: Arrays, p: Arrays) -> float:
    """The share of queries (every query but the first, pooled over the texts) whose
    most-attended key under A has weight in P; NaN when there is no such query."""
    hits = total = 0
    for x, y in _pairs(a, p):
        best = x.argmax(1)
        hits += int((y[np.arange(len(y)), best] > 0).sum())
        total += len(y)
    return hits / total if total else float("nan")


def auc(
    a: Arrays,
    p: Arrays,
    norms: np.ndarray | Sequence[np.ndarray],
    *,
    causal: bool = False,
    pairs: int = AUC_PAIRS,
    threshold: float = LOW_THRESHOLD,
    seed: int = 0,
) -> float:
    """TDB's ROC-AUC of P's weights as a classifier of the head's top pairs by write norm
    against random pairs under ``threshold`` of its largest (see the module docstring).

    Args:
        a: the head's attention, ``[n, n]`` per text.
        p: the program's pattern, the same shapes.
        norms: per text, ``[n]``: each key's value-vector norm after the head's slice of
            ``W_O`` (``mhsa.engine.runs.norms.value_norms``); the write norm of (q, k) is
            ``A[q, k] * norms[k]``.
        causal: queries see keys at or before them only (the pairs drawn are visible ones).
        pairs: positives, and negatives, drawn.
        threshold: negatives have a write norm below this share of the largest.
        seed: the negatives' random draw.

    Returns:
        The area under the ROC curve, NaN when there are no negatives or no positives (a head
        whose every pair is strong, or texts with one token).
    """
    from sklearn.metrics import roc_auc_score

    texts = _pairs(a, p)
    norm_list = [
        np.asarray(v, dtype=np.float64)
        for v in ([norms] if isinstance(norms, np.ndarray) and norms.ndim == 1 else norms)
    ]
    kept = [v for v in norm_list if len(v) > 1]
    if len(kept) != len(texts) or any(
        len(v) != x.shape[1] for v, (x, _) in zip(kept, texts, strict=True)
    ):
        raise InputError("auc needs one norm per key of every text, as many texts as patterns.")
    writes, scores = [], []
    for (x, y), v in zip(texts, kept, strict=True):
        n = x.shape[1]
        visible = np.tril(np.ones((n, n), bool), 1)[:-1] if causal else np.ones((n - 1, n), bool)
        writes.append((x * v[None, :])[visible])
        scores.append(y[visible])
    if not writes:
        return float("nan")
    write, score = np.concatenate(writes), np.concatenate(scores)
    order = np.lexsort((np.arange(len(write)), -write))  # strongest first, ties by position
    top = order[: min(pairs, len(write))]
    low = np.flatnonzero(write < threshold * write.max())
    low = np.setdiff1d(low, top)
    if len(top) == 0 or len(low) == 0:
        return float("nan")
    chosen = np.random.default_rng(seed).choice(low, size=min(pairs, len(low)), replace=False)
    labels = np.r_[np.ones(len(top)), np.zeros(len(chosen))]
    return float(roc_auc_score(labels, np.r_[score[top], score[chosen]]))

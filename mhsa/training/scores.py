"""Previous-token and induction scores of every head, from attention weights and token ids.

Both are averages over the *repeated positions*: the query positions i whose token occurred
earlier in the same sequence (j(i) = its latest earlier position; special tokens and padding
never count). On an induction sequence these are exactly the positions of the repeated half; on
copy, reverse and sort, those of the output.

- previous-token score of a head: the mean attention from i to i - 1;
- induction score of a head: the mean attention from i to j(i) + 1, the token after the earlier
  occurrence of the current token (TransformerLens's induction score on repeated tokens: the
  stripe ``seq_len - 1`` below the diagonal of a repeated random sequence).

Pooled over a batch, every repeated position of every sequence weighs the same.

An encoder-decoder task (``reverse-seq2seq``) is scored on its cross attention instead:

- anti-diagonal score of a cross-attention head: the mean attention from each scored decoder
  position to the encoder position of the symbol it must write. The encoder reads
  ``[BOS] s_1 .. s_L`` (``s_j`` at position j) and the decoder ``[BOS] t_1 .. t_L`` with
  ``t_i = s_{L+1-i}``; decoder position k (0 to L - 1) predicts ``t_{k+1} = s_{L-k}``, so the
  score averages the weights at (k, L - k): the anti-diagonal of the ``(L + 1) x (L + 1)`` cross
  attention, its last row (k = L, after ``t_L``, not scored) aside. Pooled over a batch, every
  scored decoder position weighs the same.

These are the training's own yardsticks, averaged over the positions a task scores. The Head
roles page and ``mhsa.analysis.roles`` use TransformerLens's definitions instead (``detect_heads``:
the
attention on the pattern over *all* attention of the text, so the first half of a repeated
sequence, where no induction is possible, lowers it; ``induction_scores``: the demo's repeated
random tokens): the same heads stand out, with smaller numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mhsa.training.tasks import FIRST_SYMBOL

__all__ = ["HeadScores", "anti_diagonal_scores", "earlier_occurrence", "head_scores"]


def earlier_occurrence(ids: np.ndarray) -> np.ndarray:
    """For each position of ``ids`` ``[T]``, the latest earlier position holding the same
    symbol, or -1 (no earlier occurrence, or a special token)."""
    last: dict[int, int] = {}
    out = np.full(len(ids), -1, dtype=np.int64)
    for i, token in enumerate(int(t) for t in ids):
        if token < FIRST_SYMBOL:
            continue
        out[i] = last.get(token, -1)
        last[token] = i
    return out


@dataclass(frozen=True)
class HeadScores:
    """Every head's scores, float32 ``[layers, heads]``; ``anti_diagonal`` only for an
    encoder-decoder task (its cross-attention heads), else None."""

    previous_token: np.ndarray
    induction: np.ndarray
    anti_diagonal: np.ndarray | None = None


def head_scores(attention: np.ndarray, ids: np.ndarray) -> HeadScores:
    """Previous-token and induction scores of every head (module docstring: definitions).

    Args:
        attention: ``[B, layers, heads, T, T]`` (or ``[layers, heads, T, T]`` for one sequence).
        ids: the token ids ``[B, T]`` (or ``[T]``).

    Returns:
        ``HeadScores``; zeros when no position repeats an earlier symbol.
    """
    if attention.ndim == 4:
        attention, ids = attention[None], np.asarray(ids)[None]
    layers, heads = attention.shape[1:3]
    previous = np.zeros((layers, heads), dtype=np.float64)
    induction = np.zeros((layers, heads), dtype=np.float64)
    count = 0
    for row, seq in enumerate(ids):
        earlier = earlier_occurrence(seq)
        query = np.flatnonzero(earlier >= 0)  # the repeated positions
        if query.size == 0:
            continue
        a = attention[row]  # (layers, heads, T, T)
        previous += a[:, :, query, query - 1].sum(axis=-1)
        induction += a[:, :, query, earlier[query] + 1].sum(axis=-1)
        count += query.size
    scale = 1.0 / max(count, 1)
    return HeadScores((previous * scale).astype(np.float32), (induction * scale).astype(np.float32))


def anti_diagonal_scores(cross: np.ndarray, lengths: np.ndarray | int) -> np.ndarray:
    """Every cross-attention head's anti-diagonal score (module docstring: the alignment).

    Args:
        cross: cross attention ``[B, layers, heads, T_dec, T_enc]`` (or ``[layers, heads,
            T_dec, T_enc]`` for one sequence), decoder ``[BOS] t_1 .. t_L`` against encoder
            ``[BOS] s_1 .. s_L``, right-padded.
        lengths: the number L of symbols of each sequence ``[B]`` (or one int).

    Returns:
        float32 ``[layers, heads]``.
    """
    if cross.ndim == 4:
        cross = cross[None]
    lengths = np.atleast_1d(np.asarray(lengths))
    total = np.zeros(cross.shape[1:3], dtype=np.float64)
    for a, n in zip(cross, lengths.tolist(), strict=True):
        k = np.arange(n)
        total += a[:, :, k, n - k].sum(axis=-1)  # decoder k predicts s_{n-k}, at encoder n - k
    return (total / max(int(lengths.sum()), 1)).astype(np.float32)

"""Head analysis: per-head statistics and roles, attention rollout, each token's strongest keys.

Pure functions of ``AttentionResult``s. Definitions follow Clark et al. 2019, "What Does BERT Look
At?" (statistics), Voita et al. 2019 (confidence, positional heads) and Abnar & Zuidema 2020
(rollout). Head similarity, the map of heads and their clusters are in ``mhsa.analysis.similarity``
(re-exported here).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from mhsa.analysis.blocks import as_results, rows_per_block
from mhsa.analysis.claims import positional_claim, role_claim, role_claims

# re-exported: they lived here, and callers still find them here
from mhsa.analysis.similarity import (
    HeadClusters,
    HeadSimilarityAccumulator,
    head_clusters,
    head_map,
    head_similarity,
    js_divergences,
)
from mhsa.engine.result import AttentionResult
from mhsa.heads import head_label

__all__ = [
    "CLARK_DIFFERENCES",
    "MIN_QUERIES",
    "POSITIONAL_SHARE",
    "ROLE_THRESHOLDS",
    "STAT_COLUMNS",
    "STAT_SPECS",
    "TOO_FEW",
    "HeadClusters",
    "HeadSimilarityAccumulator",
    "HeadStatsAccumulator",
    "StatSpec",
    "attention_rollout",
    "head_clusters",
    "head_map",
    "head_similarity",
    "head_stats",
    "js_divergences",
    "positional_claims",
    "stat_label",
    "stats_difference",
    "top_attended",
    "with_support",
]


@dataclass(frozen=True)
class StatSpec:
    """One per-head statistic of ``head_stats`` (Clark et al. 2019; ``confidence``: Voita et
    al. 2019).

    Attributes:
        name: its column in ``head_stats``, in the CSV export and in links.
        label: its short name for people.
        description: what it measures, for people.
    """

    name: str
    label: str
    description: str


#: Every per-head statistic by name, in the order of ``head_stats``' columns.
STAT_SPECS: Mapping[str, StatSpec] = {
    spec.name: spec
    for spec in (
        StatSpec(
            "entropy",
            label="entropy",
            description="entropy of each query row (smoothed as 0.9999 A + 0.0001/n), averaged "
            "over rows; log n for a uniform head",
        ),
        StatSpec(
            "mean_distance",
            label="mean distance",
            description="attention-weighted |i - j|, averaged over query rows",
        ),
        StatSpec(
            "confidence",
            label="confidence",
            description="mean over query rows of the largest weight (Voita et al. 2019)",
        ),
        StatSpec(
            "to_first",
            label="to the first token",
            description="mean over query rows of the weight on the first token ([CLS]/BOS)",
        ),
        StatSpec(
            "to_sep",
            label="to separators",
            description="mean over query rows of the weight on the other special tokens "
            "([SEP]/EOS)",
        ),
        StatSpec(
            "to_punct",
            label="to punctuation",
            description="mean over query rows of the weight on punctuation tokens",
        ),
        StatSpec(
            "to_self",
            label="to itself",
            description="mean over query rows of the weight on the query token itself",
        ),
        StatSpec(
            "to_prev",
            label="to the previous token",
            description="mean over query rows 1..n-1 of the weight on the previous token",
        ),
        StatSpec(
            "to_next",
            label="to the next token",
            description="mean over query rows 0..n-2 of the weight on the next token",
        ),
    )
}
#: The statistics' names, in the order of ``head_stats``' columns.
STAT_COLUMNS = tuple(STAT_SPECS)


def stat_label(column: str) -> str:
    """A column's name for people: the statistic's label with its column name after it
    (``to separators (to_sep)``); any other column (a detector's) as it is."""
    spec = STAT_SPECS.get(column)
    return f"{spec.label} ({column})" if spec is not None else column


#: Role thresholds: Clark et al. used 0.5 for previous/next token heads and 0.6 for heads on
#: [CLS], [SEP] and punctuation; we use 0.5 for "self" too. A head is "broad" when its entropy is
#: at least 80% of the uniform entropy log(n) and no kind of key takes the share above. Keyed by
#: the statistic (``STAT_SPECS``) that decides each role, in the order the roles are tried.
ROLE_THRESHOLDS: dict[str, tuple[str, float]] = {
    "to_prev": ("previous token", 0.5),
    "to_next": ("next token", 0.5),
    "to_self": ("self", 0.5),
    "to_first": ("first token", 0.6),
    "to_sep": ("separator", 0.6),
    "to_punct": ("punctuation", 0.6),
}
BROAD_ENTROPY_RATIO = 0.8
#: Voita et al. 2019: a head is positional when its largest weight sits at one fixed relative
#: offset for at least 90% of the tokens. Offsets from -POSITIONAL_WINDOW to +POSITIONAL_WINDOW
#: are counted; in a sentence, an offset counts only where at least POSITIONAL_SHARE of its
#: tokens and at least MIN_QUERIES of them can take it (a query i with a key at i + d): in a
#: 9-token sentence offset -8 is one query's, and that one query says nothing of a head.
POSITIONAL_SHARE = 0.9
POSITIONAL_WINDOW = 8
#: the fewest query rows a role or a positional offset is called on (below: no call, and the
#: table says so)
MIN_QUERIES = 3
_OFFSETS = np.arange(-POSITIONAL_WINDOW, POSITIONAL_WINDOW + 1)

#: Where our definitions differ from Clark et al.'s code (markdown, shown on the statistics page).
CLARK_DIFFERENCES = """\
- Previous/next-token shares are averaged over the n-1 query rows that have such a neighbour
  (Clark et al. average over all n rows).
- Punctuation is any token made only of Unicode punctuation characters (theirs: a fixed list of
  ASCII marks).
- Over a corpus every statistic, the Jensen-Shannon matrix included, is the mean over sentences
  (their `head_distances.py` sums); a statistic undefined for a sentence (a one-token sentence has
  no previous token) is left out of its mean.
- Jensen-Shannon is the divergence summed over query rows, as theirs; scipy's `jensenshannon`
  "distance" is the square root of one row's divergence.
"""

_ENTROPY_SMOOTHING = 1e-4  # Clark et al.: 0.9999 A + 0.0001 / n


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A float tensor sharing ``a``'s memory, a read-only array's too (results are frozen and
    these functions only read them: a copy of a long sentence's attention is fresh memory,
    page faults, on every call)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(a))


def _stats_many(
    attention: np.ndarray,
    special: Sequence[Sequence[bool]],
    punctuation: Sequence[Sequence[bool]],
    *,
    positional: bool = True,
) -> np.ndarray:
    """Per sentence of k of the same length: the statistics, log n and the positional shares.

    ``attention`` is ``[k, L, H, m, n]`` (m query rows over n keys), the key flags ``[k][n]``;
    returns ``[k, L * H, columns]`` (sentences of a corpus batch share lengths: one set of
    array operations for all of them): the statistics in ``STAT_SPECS`` order, log n, then the
    share of each offset in the window. ``positional=False`` (queries and keys are different
    texts: cross-attention, decoder over encoder) leaves every statistic of positions
    (distance, self, previous, next, the offsets) NaN: position i of one text and position j of
    another are no distance apart.

    The elementwise work stays in the attention's own precision and every sum is taken in
    float64: a corpus batch holds a lot of float32 attention, and passes over a float64 copy of
    it made the statistics memory-bound.
    """
    a = _tensor(attention)  # (k, L, H, m, n)
    k, m, n = a.shape[0], a.shape[-2], a.shape[-1]
    f64 = torch.float64
    if positional:
        entropy, mean_distance = _entropy_and_distance(a.reshape(-1, n * n), n)
    else:
        entropy = _entropy_and_distance(a.reshape(-1, m * n), n, rows=m)[0]
        mean_distance = torch.full((len(entropy),), torch.nan, dtype=f64)
    stats = {
        "entropy": entropy,
        "mean_distance": mean_distance,
        "confidence": a.amax(-1).mean(-1, dtype=f64),  # Voita et al.: mean of each row's largest
        **_shares_by_key(a, special, punctuation, positional=positional),
    }
    if positional:
        hits, rows = _offset_hits(a.argmax(-1).numpy())
    else:
        hits = rows = [np.full(a.shape[:3], np.nan)] * len(_OFFSETS)
    columns = [
        *(stats[name] for name in STAT_SPECS),
        torch.full(a.shape[:3], float(np.log(n)), dtype=f64),
        torch.full(a.shape[:3], float(m), dtype=f64),  # query rows
        torch.full(a.shape[:3], float(m - 1) if positional and m > 1 else np.nan, dtype=f64),
        *hits,
        *rows,
    ]
    return np.stack([np.asarray(c).reshape(k, -1) for c in columns], axis=2)


def _entropy_and_distance(
    flat: torch.Tensor, n: int, *, rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, ``flat`` holding one ``rows x n`` head a row (``rows``: n unless given): the
    entropy of its query rows (smoothed as Clark et al.) and its attention-weighted distance
    ``|i - j|``, each averaged over query rows, float64.

    Means over query rows of per-row sums are whole sums / rows; a few heads at a time, so that
    the temporaries are reused rather than fresh memory (page faults) on every call.
    """
    f64 = torch.float64
    rows = n if rows is None else rows
    idx = torch.arange(n)
    # 16-bit attention (``attend(attention_dtype=...)``): each block upcast to float32, the
    # elementwise work as for float32 attention
    work = torch.float32 if flat.dtype in (torch.float16, torch.bfloat16) else flat.dtype
    distance = (torch.arange(rows)[:, None] - idx[None, :]).abs().reshape(-1).to(work)
    entropy = torch.empty(len(flat), dtype=f64)
    mean_distance = torch.empty(len(flat), dtype=f64)
    step = rows_per_block(rows * n)
    for i in range(0, len(flat), step):
        heads = flat[i : i + step].to(work)  # (step, rows * n)
        smoothed = heads * (1 - _ENTROPY_SMOOTHING)
        smoothed += _ENTROPY_SMOOTHING / n
        entropy[i : i + step] = -smoothed.log().mul_(smoothed).sum(-1, dtype=f64) / rows
        mean_distance[i : i + step] = (heads * distance).sum(-1, dtype=f64) / rows
    return entropy, mean_distance


def _shares_by_key(
    a: torch.Tensor,
    special: Sequence[Sequence[bool]],
    punctuation: Sequence[Sequence[bool]],
    *,
    positional: bool = True,
) -> dict[str, torch.Tensor]:
    """The mean over query rows of the weight on each kind of key (``to_first`` .. ``to_next``
    of ``STAT_SPECS``), per sentence and head of ``a`` ``[k, L, H, m, n]``, float64; without
    ``positional``, self/previous/next are NaN (queries and keys are different texts)."""
    k, m, n = a.shape[0], a.shape[-2], a.shape[-1]
    f64 = torch.float64
    received = a.sum(-2, dtype=f64).reshape(k, -1, n) / m  # (k, L*H, n): mean over rows of A[:, j]
    sep = torch.tensor(special, dtype=f64).reshape(k, n, 1)
    sep[:, 0] = 0.0  # [SEP]/EOS: special tokens other than the first one
    punct = torch.tensor(punctuation, dtype=f64).reshape(k, n, 1)
    nan = torch.full(a.shape[:3], torch.nan, dtype=f64)
    shares = {
        "to_first": received[..., 0],
        "to_sep": received @ sep,
        "to_punct": received @ punct,
    }
    if not positional:
        return shares | {"to_self": nan, "to_prev": nan, "to_next": nan}
    diag = torch.diagonal(a, dim1=-2, dim2=-1)  # (k, L, H, n)
    prev = torch.diagonal(a, offset=-1, dim1=-2, dim2=-1)  # A[i, i-1], (k, L, H, n-1)
    nxt = torch.diagonal(a, offset=1, dim1=-2, dim2=-1)  # A[i, i+1]
    return shares | {
        "to_self": diag.mean(-1, dtype=f64),
        "to_prev": prev.mean(-1, dtype=f64) if n > 1 else nan,
        "to_next": nxt.mean(-1, dtype=f64) if n > 1 else nan,
    }


def _offset_hits(argmax: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per offset d in the window, ``[..., L, H]``: how many query rows i whose key i + d exists
    have their largest weight there, and how many rows have that key; both NaN where the offset
    does not count in this sentence (fewer than ``POSITIONAL_SHARE`` of its n tokens, or fewer
    than ``MIN_QUERIES``, can take it). ``argmax`` holds each query row's key of largest
    weight, ``[..., n]``."""
    n = argmax.shape[-1]
    argmax_offset = argmax - np.arange(n)  # (..., n)
    hits, counts = [], []
    nan = np.full(argmax.shape[:-1], np.nan)
    for d in _OFFSETS:
        rows = n - abs(int(d))
        if rows < MIN_QUERIES or rows < POSITIONAL_SHARE * n:
            hits.append(nan)
            counts.append(nan)
            continue
        valid = slice(max(0, -d), n - max(0, d))  # rows i with 0 <= i + d < n
        hits.append((argmax_offset[..., valid] == d).sum(-1).astype(float))
        counts.append(np.full(argmax.shape[:-1], float(rows)))
    return hits, counts


#: the roles whose share is over the query rows that have a neighbour (n - 1 a sentence)
_ADJACENT_ROLES = {ROLE_THRESHOLDS["to_prev"][0], ROLE_THRESHOLDS["to_next"][0]}
#: the role of a head whose sentences hold fewer than ``MIN_QUERIES`` query rows in all
TOO_FEW = "too few tokens"


def _roles(frame: pd.DataFrame, log_n: np.ndarray) -> list[str]:
    roles = []
    for (_, row), uniform in zip(frame.iterrows(), log_n, strict=False):
        best, best_share = None, 0.0
        for column, (role, threshold) in ROLE_THRESHOLDS.items():
            share = row[column]
            if share >= threshold and share > best_share:
                best, best_share = role, share
        if best is None:
            broad = uniform > 0 and row["entropy"] >= BROAD_ENTROPY_RATIO * uniform
            best = "broad" if broad else "mixed"
        roles.append(best)
    return roles


class HeadStatsAccumulator:
    """Running mean of per-head statistics over a corpus, keeping no attention arrays.

    A statistic undefined for a sentence (NaN: ``to_prev``/``to_next`` of a one-token sentence)
    is left out of that statistic's mean, so the mean does not depend on the sentences' order.
    """

    def __init__(self, *, word_level: bool = False) -> None:
        self.word_level = word_level
        self.count = 0
        self._sum: np.ndarray | None = None
        self._defined: np.ndarray | None = None  # per entry: sentences where it is defined
        self._shape: tuple[int, int] | None = None
        self._ids: tuple[list[int], list[int]] | None = None  # the model's layers and heads

    def add(self, result: AttentionResult) -> None:
        self.add_many([result])

    def add_many(self, results: Sequence[AttentionResult]) -> None:
        """``add`` for several results; those of the same length are computed together (the
        same numbers, fewer array operations: a corpus batch holds sentences of equal length)."""
        if self.word_level:
            results = [r.to_words() for r in results]
        by_length: dict[tuple[tuple[int, ...], bool], list[AttentionResult]] = {}
        for r in results:  # cross-attention (queries other than the keys) apart
            by_length.setdefault((r.attention.shape, r.query_tokens is None), []).append(r)
        for (shape, positional), group in by_length.items():
            if self._shape is not None and shape[:2] != self._shape:
                raise ValueError(
                    f"Result has {shape[:2]} layers x heads, earlier ones {self._shape}"
                )
            self._shape = shape[:2]
            self._check_ids((group[0].layers, group[0].heads))
            stacked = (
                group[0].attention[None]  # a view: no copy of one sentence
                if len(group) == 1
                else np.stack([r.attention for r in group])
            )
            self._add_stats(
                _stats_many(
                    stacked,
                    [r.special for r in group],
                    [r.punctuation for r in group],
                    positional=positional,
                )
            )

    def _check_ids(self, ids: tuple[list[int], list[int]] | None) -> None:
        """Every result holds the same layers and heads of the model (a partial result's are
        ``layer_ids``/``head_ids``)."""
        if ids is None:
            return
        if self._ids is not None and ids != self._ids:
            raise ValueError(
                f"Result holds layers {ids[0]} x heads {ids[1]}, earlier ones "
                f"{self._ids[0]} x {self._ids[1]}"
            )
        self._ids = ids

    def _add_stats(self, stats: np.ndarray) -> None:
        """Sentences' statistics ``[k, L * H, columns]`` into the running sums."""
        defined = ~np.isnan(stats)
        if self._sum is None or self._defined is None:
            self._sum = np.zeros(stats.shape[1:])
            self._defined = np.zeros(stats.shape[1:], dtype=int)
        self._sum += np.where(defined, stats, 0.0).sum(0)
        self._defined += defined.sum(0)
        self.count += len(stats)

    def merge(self, other: HeadStatsAccumulator) -> HeadStatsAccumulator:
        """Add another accumulator's sentences to this one (a shard computed elsewhere) and
        return self. Sums and counts add, so merging is associative and order-independent (up
        to float rounding of the sums)."""
        if not isinstance(other, HeadStatsAccumulator):
            raise TypeError(f"Cannot merge {type(other).__name__} into HeadStatsAccumulator.")
        if other.word_level != self.word_level:
            raise ValueError("Cannot merge word-level statistics with token-level ones.")
        if other._sum is None or other._defined is None:
            return self
        if self._shape is not None and other._shape != self._shape:
            raise ValueError(f"Shard has {other._shape} layers x heads, this one {self._shape}")
        if self._sum is None or self._defined is None:
            self._sum, self._defined = other._sum.copy(), other._defined.copy()
        else:
            self._sum = self._sum + other._sum
            self._defined = self._defined + other._defined
        self._check_ids(other._ids)
        self._shape = other._shape
        self.count += other.count
        return self

    def frame(self) -> pd.DataFrame:
        if self._sum is None or self._defined is None or self._shape is None:
            raise ValueError("No results were added.")
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(self._defined > 0, self._sum / self._defined, np.nan)
        layers, heads = self._shape
        layer_ids, head_ids = self._ids or (list(range(layers)), list(range(heads)))
        k = len(STAT_COLUMNS)
        frame = pd.DataFrame(mean[:, :k], columns=list(STAT_COLUMNS))
        frame.insert(0, "head", np.tile(np.asarray(head_ids, dtype=int), layers))
        frame.insert(0, "layer", np.repeat(np.asarray(layer_ids, dtype=int), heads))
        summed = np.where(self._defined > 0, self._sum, np.nan)  # sums over sentences
        rows, adjacent = np.nan_to_num(summed[:, k + 1]), np.nan_to_num(summed[:, k + 2])
        roles = _roles(frame, mean[:, k])
        support = np.array(
            [adjacent[i] if role in _ADJACENT_ROLES else rows[i] for i, role in enumerate(roles)]
        )
        claims = [
            role_claim(role, s, r, minimum=MIN_QUERIES)
            for role, s, r in zip(roles, support, rows, strict=True)
        ]
        frame["role"] = [role if c.made else TOO_FEW for role, c in zip(roles, claims, strict=True)]
        frame["role_queries"] = support.astype(int)
        frame["query_rows"] = rows.astype(int)
        w = len(_OFFSETS)
        hits, counts = summed[:, k + 3 : k + 3 + w], summed[:, k + 3 + w :]  # (L * H, offsets)
        with np.errstate(invalid="ignore", divide="ignore"):
            shares = hits / counts  # pooled over the sentences where the offset counts
        defined = ~np.isnan(shares).all(1)
        best = np.nanargmax(np.where(np.isnan(shares), -1.0, shares), axis=1)
        at = np.arange(len(best))
        frame["positional_offset"] = np.where(defined, _OFFSETS[best], 0)
        frame["positional_share"] = np.where(defined, shares[at, best], np.nan)
        frame["positional_queries"] = np.where(defined, counts[at, best], 0).astype(int)
        frame["positional_hits"] = np.where(defined, hits[at, best], 0).astype(int)
        frame["positional"] = frame["positional_share"] >= POSITIONAL_SHARE
        frame.index = [
            head_label(li, h) for li, h in zip(frame["layer"], frame["head"], strict=False)
        ]
        return frame


def head_stats(
    results: AttentionResult | Iterable[AttentionResult], *, word_level: bool = False
) -> pd.DataFrame:
    """One row per (layer, head): how the head spreads its attention, averaged over sentences.

    Columns (``STAT_SPECS`` names and describes the statistics): ``layer``, ``head``;
    ``entropy`` (of each query row, smoothed as 0.9999 A + 0.0001/n, averaged over rows; log n
    for a uniform head); ``mean_distance`` (attention-weighted |i - j|); ``confidence`` (Voita
    et al. 2019: mean over rows of the largest weight); the mean over query rows of the
    attention mass on the first token (``to_first``, [CLS]/BOS), on the other special tokens
    (``to_sep``, [SEP]/EOS), on punctuation (``to_punct``), on itself (``to_self``), on the
    previous token (``to_prev``, rows 1..n-1) and on the next one (``to_next``, rows 0..n-2);
    and ``role``.

    Where these differ from Clark et al.'s code: the previous/next-token shares are averaged
    over the n-1 query rows that have such a neighbour (theirs over all n rows); punctuation is
    every token made only of Unicode punctuation characters (theirs a fixed list of ASCII
    marks); and over a corpus every statistic, the Jensen-Shannon matrix included, is the mean
    over sentences, where their ``head_distances.py`` sums. A statistic undefined for a
    sentence (a one-token sentence has no previous token) is left out of its mean.

    ``role`` is the behaviour whose share passes its threshold in ``ROLE_THRESHOLDS`` (0.5 for
    previous/next/self, 0.6 for first/separator/punctuation; the largest wins), else "broad" when
    the entropy is at least 80% of log n, else "mixed"; ``role_queries`` is its support, the
    query rows its share is a mean over (all sentences'), of ``query_rows`` (every query row of
    every sentence). Below ``MIN_QUERIES`` (3) rows no
    role is called: ``role`` is "too few tokens".

    Voita et al. 2019's positional heads ("the head points to a specific relative position at
    least 90% of the time"): ``positional_offset`` is the relative offset d (-8..8) at which the
    head's largest weight sits most often, ``positional_share`` the share of query rows whose
    largest weight is there among the rows that have a token at i + d, ``positional_hits`` of
    ``positional_queries`` (the support), and ``positional`` says whether that share is at least
    0.9 (their threshold; they found offsets -1 and +1). An offset counts only in sentences
    where at least 90% of the n tokens, and at least ``MIN_QUERIES``, can take it (n - |d|
    >= 0.9 n: a 9-token sentence has none but 0, a 10-token one also -1 and +1); over a corpus
    hits and rows are pooled over those sentences. No offset counting: share NaN, support 0,
    not positional.

    Cross-attention (``AttentionResult.of_kind("cross")``: decoder queries over encoder keys)
    is measured per query row over the keys the same way; the statistics of positions
    (``mean_distance``, ``to_self``, ``to_prev``, ``to_next``, the positional shares) are NaN
    there, a position in one text being no distance from a position in another.

    Args:
        results: one result, or a corpus of results from the same model.
        word_level: merge sub-word tokens into words first.
    """
    acc = HeadStatsAccumulator(word_level=word_level)
    for r in as_results(results):
        acc.add(r)
    return acc.frame()


def stats_difference(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """Two ``head_stats`` tables compared head by head: ``Δ column`` (second minus first) for
    every numeric statistic; roles and positional calls as claims with their support
    (``role_claims``, ``positional_claims``: ``previous token: 8 of 9 queries``, ``positional
    -1: 8 of 8 queries``) side by side."""

    numeric = [c for c in STAT_COLUMNS if c in first.columns] + ["positional_share"]
    diff = (second[numeric] - first[numeric]).add_prefix("Δ ")
    diff.insert(0, "role 1", role_claims(first, minimum=MIN_QUERIES))
    diff.insert(1, "role 2", role_claims(second, minimum=MIN_QUERIES))
    diff.insert(2, "positional 1", positional_claims(first))
    diff.insert(3, "positional 2", positional_claims(second))
    return diff


def positional_claims(stats: pd.DataFrame) -> pd.Series:
    """Every head's ``claims.positional_claim`` text from a ``head_stats`` table: ``positional
    -1: 8 of 8 queries``, ``not positional: ...`` or ``too few tokens to call a positional
    head: ...`` (Voita et al. 2019's 90% of the tokens, on at least ``MIN_QUERIES`` rows)."""
    return pd.Series(
        [
            positional_claim(
                offset, hits, queries, share=POSITIONAL_SHARE, minimum=MIN_QUERIES
            ).text
            for offset, hits, queries in zip(
                stats["positional_offset"],
                stats["positional_hits"],
                stats["positional_queries"],
                strict=True,
            )
        ],
        index=stats.index,
        name="positional",
    )


def with_support(stats: pd.DataFrame) -> pd.DataFrame:
    """A ``head_stats`` table as a page shows it: its ``role`` and ``positional`` columns as
    claims with their support (``previous token: 8 of 9 queries``; ``positional -1: 8 of 8
    queries``), not a bare name or a bare true beside numbers a reader must pair up."""
    shown = stats.copy()
    shown["role"] = role_claims(stats, minimum=MIN_QUERIES)
    shown["positional"] = positional_claims(stats)
    return shown


# --- rollout --------------------------------------------------------------------------------
def attention_rollout(result: AttentionResult) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020), ``[layers, n, n]``.

    Per layer: average the heads, add the identity (the residual path), renormalise the rows,
    and multiply through the layers: ``R_l = A'_l R_{l-1}``. Row i of ``R_l`` is how much each
    input token flows into position i after layer l. Rows sum to 1.

    Raises:
        InputError: a partial result (``attend(layers=..., heads=...)``) whose layers are not
            0, 1, ... with every head: rollout composes every layer from the input up.
    """
    result.require_layers_from_zero("Attention rollout")
    # summed in float64 without a float64 copy of every head (large for long sentences)
    a = result.attention.mean(axis=1, dtype=np.float64)  # (L, n, n)
    n = a.shape[-1]
    a[:, np.arange(n), np.arange(n)] += 1.0
    a /= a.sum(-1, keepdims=True)
    out = np.empty(a.shape, dtype=np.float32)
    current = np.eye(n)
    for layer in range(a.shape[0]):
        current = a[layer] @ current
        out[layer] = current
    return out


def top_attended(result: AttentionResult, layer: int, head: int, k: int = 5) -> pd.DataFrame:
    """Where each token attends most in one head (``layer``, ``head``: positions in
    ``result.attention``; ``result.index_of`` finds a model's head in a partial result), for
    inputs too long for a heatmap: one row
    per query token (index ``#i token``), columns ``1``..``k`` naming the key token and its
    weight (``"mat #6 0.412"``), strongest first."""
    a = result.attention[layer, head]
    k = max(1, min(k, a.shape[1]))
    order = np.argsort(-a, axis=1, kind="stable")[:, :k]
    tokens = result.tokens
    return pd.DataFrame(
        [[f"{tokens[j]} #{j} {a[i, j]:.3f}" for j in row] for i, row in enumerate(order)],
        index=[f"#{i} {t}" for i, t in enumerate(result.queries)],
        columns=[str(r + 1) for r in range(k)],
    )

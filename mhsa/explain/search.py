"""The search for the program that best explains a head: exhaustive over the small programs,
greedy over their combinations, on the search texts.

The candidates (``small_programs``): every atom (``offset(d)`` for ``1 <= |d| <= MAX_OFFSET``,
``first``, ``last``, ``self``, the token classes), ``pos(TAG, direction, selection)`` for every
Universal tag present in the texts, and ``when(QTAG, p)`` of each of those with each tag present
among the queries. The fixed baselines (``offset(d)`` for ``|d| <= 3``, ``first``, ``last``,
``self``) are among them, so the chosen program's IoU on the search texts is never below
theirs. Then, greedily, up to ``MAX_FALLBACKS`` times, the best of ``best | c`` and
``c | best`` over every candidate c (``c | best`` finds a narrow program in front of a broad
one: ``when(NOUN, pos(DET, left, nearest)) | first`` from ``first``), and once
``mix(best, c, w)`` for the ``MIX_PARTNERS`` best single candidates and ``w`` in
``MIX_WEIGHTS``; a step is kept when it raises the IoU by at least ``MIN_GAIN`` (a longer
program must earn its length). A query the program gives no key is a miss
(``mhsa.explain.programs``), so a fallback is added only where its keys match the head better
than saying nothing does. The objective is the soft IoU
(``mhsa.explain.scores.soft_iou``); ties go to the smaller program, then the shorter text.

All of it runs on the texts' visible pairs flattened into one array (``PairTable``): a program's
pattern over those pairs is one vector, a head's IoU per text is a sum per text of
``min(A, P)`` (the sum of ``max`` is ``sum A + sum P - sum min``), and ``when`` and ``|`` act
on whole query rows, so their candidates come from the single programs' per-query sums
without computing a pattern again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mhsa.explain.attention import TextAttention
from mhsa.explain.programs import (
    ATOMS,
    DIRECTIONS,
    SELECTIONS,
    UNIVERSAL_TAGS,
    Atom,
    Fallback,
    Mix,
    Offset,
    Pos,
    Program,
    TextFeatures,
    When,
)

__all__ = [
    "BASELINES",
    "MAX_FALLBACKS",
    "MAX_OFFSET",
    "MIN_GAIN",
    "MIX_PARTNERS",
    "MIX_WEIGHTS",
    "Found",
    "PairTable",
    "search_heads",
    "small_programs",
]

#: the largest ``|d|`` of the ``offset(d)`` candidates
MAX_OFFSET = 8
#: the fixed programs a head's accuracy is compared with (Clark et al. 2019's baselines)
BASELINES: tuple[Program, ...] = (
    *(Offset(d) for d in (-1, 1, -2, 2, -3, 3)),
    Atom("first"),
    Atom("last"),
    Atom("self"),
)
#: the fallbacks ``a | b`` the greedy search adds at most
MAX_FALLBACKS = 2
#: the single candidates a mix is tried with, and its weights
MIX_PARTNERS = 6
MIX_WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: the IoU a combination must add to be kept
MIN_GAIN = 0.01


def small_programs(features: Sequence[TextFeatures]) -> list[Program]:
    """The single candidates over these texts: every atom and offset, and where the texts
    have tags, ``pos`` of every tag present (the ``when`` forms are made from them)."""
    programs: list[Program] = [Offset(d) for d in range(-MAX_OFFSET, MAX_OFFSET + 1) if d]
    programs += [Atom(name) for name in ATOMS]
    present = tags_present(features)
    programs += [Pos(t, d, s) for t in present for d in DIRECTIONS for s in SELECTIONS]
    return programs


def tags_present(features: Sequence[TextFeatures]) -> list[str]:
    """The Universal tags some token of the texts has (none without tags), in tagset order."""
    seen = {t for f in features if f.tags is not None for t in f.tags if t is not None}
    return [t for t in UNIVERSAL_TAGS if t in seen]


class PairTable:
    """The texts' visible (query, key) pairs of every query but the first, one array: per
    head its weights ``A [H, P]``; per query where its pairs start, its text and tag."""

    def __init__(self, items: Sequence[TextAttention], heads: Sequence[int]) -> None:
        items = [it for it in items if len(it.features) > 1]
        self.items = items
        self.features = [it.features for it in items]
        heads = list(heads)
        weights, index, rows, best, tags = [], [], [], [], []
        pairs = queries = 0
        self.text_starts = []  # per text, its first query
        for it in items:
            f = it.features
            n = len(f)
            visible = f.visible.copy()
            visible[0] = False
            q, k = np.nonzero(visible)  # row-major: the pairs of one query are consecutive
            local = np.full((n, n), -1, np.int64)
            local[q, k] = np.arange(len(q)) + pairs
            w = it.weights[heads]  # [H, n, n]
            weights.append(w[:, q, k])
            index.append((q, k))
            self.text_starts.append(queries)
            counts = visible.sum(1)[1:]
            rows.append(pairs + np.concatenate([[0], np.cumsum(counts)[:-1]]))
            best.append(local[np.arange(1, n)[None, :], w[:, 1:].argmax(-1)])  # [H, n - 1]
            tags.extend(f.tags[1:] if f.tags is not None else [None] * (n - 1))
            pairs += len(q)
            queries += n - 1
        self.pairs_of_text = index
        self.a = np.concatenate(weights, axis=1).astype(np.float32)  # [H, P]
        self.row_starts = np.concatenate(rows)  # [Q]
        self.text_starts = np.array(self.text_starts)
        self.best = np.concatenate(best, axis=1)  # [H, Q]
        self.query_tags = np.array([t or "" for t in tags])
        self.pair_query = np.repeat(np.arange(queries), np.diff(np.r_[self.row_starts, pairs]))
        self.sum_a = self.per_text(self.per_query(self.a))  # [H, T]

    @property
    def queries(self) -> int:
        return len(self.row_starts)

    def per_query(self, values: np.ndarray) -> np.ndarray:
        """Sums over each query's pairs (the last axis: pairs -> queries)."""
        return np.add.reduceat(values, self.row_starts, axis=-1)

    def per_text(self, values: np.ndarray) -> np.ndarray:
        """Sums over each text's queries (the last axis: queries -> texts)."""
        return np.add.reduceat(values, self.text_starts, axis=-1)

    def dense(self, program: Program) -> np.ndarray:
        """The program's pattern over the pairs, ``[P]`` float32."""
        parts = [
            program.pattern(f)[q, k]
            for f, (q, k) in zip(self.features, self.pairs_of_text, strict=True)
        ]
        return np.concatenate(parts).astype(np.float32)

    def iou(self, mins: np.ndarray, cover: np.ndarray, head: int) -> np.ndarray:
        """Soft IoU averaged over texts, from per-query sums of ``min(A, P)`` ``[..., Q]`` and
        whether P gives the query keys ``[..., Q]`` (rows of P sum to 1 or 0)."""
        num = self.per_text(mins)
        den = self.sum_a[head] + self.per_text(cover.astype(np.float32)) - num
        return np.mean(np.divide(num, den, out=np.ones_like(num), where=den > 0), axis=-1)


@dataclass(frozen=True)
class Found:
    """The search's result for one head: the chosen program and the runners-up, each with its
    IoU and accuracy on the search texts, best first."""

    head: int
    programs: tuple[Program, ...]
    iou: tuple[float, ...]
    accuracy: tuple[float, ...]


@dataclass
class _Candidate:
    program: Program
    dense: np.ndarray  # [P]
    mins: np.ndarray  # [Q]
    cover: np.ndarray  # [Q] bool
    hit: np.ndarray  # [Q] bool
    iou: float


def _order(iou: np.ndarray, sizes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Candidates best first: IoU (to 1e-9), then fewer nodes, then the shorter text."""
    return np.lexsort((lengths, sizes, -np.round(iou, 9)))


def search_heads(
    table: PairTable, heads: Sequence[int], *, top: int = 3, progress: object = None
) -> list[Found]:
    """The best programs of each head (an index into the table's heads) on the table's texts.

    Args:
        table: the search texts' pairs.
        heads: indices into the heads the table was built with.
        top: how many programs to keep per head (the chosen one first).
        progress: a callable called once per head done, or None.
    """
    base = small_programs(table.features)
    dense = np.stack([table.dense(p) for p in base])  # [C, P]
    cover = table.per_query(dense) > 0  # [C, Q]
    tags = [t for t in UNIVERSAL_TAGS if (table.query_tags == t).any()]
    masks = (
        np.stack([table.query_tags == t for t in tags])
        if tags
        else np.zeros((0, cover.shape[1]), bool)
    )
    programs = base + [When(t, p) for t in tags for p in base]
    cover_all = np.concatenate([cover, (masks[:, None] & cover[None]).reshape(-1, cover.shape[1])])
    shape = (np.array([p.size for p in programs]), np.array([len(str(p)) for p in programs]))
    found = []
    for h in heads:
        mins = table.per_query(np.minimum(table.a[h][None], dense))  # [C, Q]
        hit = dense[:, table.best[h]] > 0  # [C, Q]
        mins_all = np.concatenate([mins, (masks[:, None] * mins[None]).reshape(-1, mins.shape[1])])
        hit_all = np.concatenate([hit, (masks[:, None] & hit[None]).reshape(-1, hit.shape[1])])
        found.append(
            _one_head(
                table, h, programs, shape, base, dense, masks, mins_all, cover_all, hit_all, top
            )
        )
        if progress is not None:
            progress()
    return found


def _dense_of(
    i: int, base_count: int, dense: np.ndarray, masks: np.ndarray, table: PairTable
) -> np.ndarray:
    if i < base_count:
        return dense[i]
    t, c = divmod(i - base_count, base_count)
    return dense[c] * masks[t][table.pair_query]


def _one_head(
    table: PairTable,
    h: int,
    programs: list[Program],
    shape: tuple[np.ndarray, np.ndarray],
    base: list[Program],
    dense: np.ndarray,
    masks: np.ndarray,
    mins: np.ndarray,
    cover: np.ndarray,
    hit: np.ndarray,
    top: int,
) -> Found:
    ious = table.iou(mins, cover, h)
    sizes, lengths = shape
    order = _order(ious, sizes, lengths)
    pick = int(order[0])

    def candidate(i: int) -> _Candidate:
        return _Candidate(
            programs[i],
            _dense_of(i, len(base), dense, masks, table),
            mins[i],
            cover[i],
            hit[i],
            float(ious[i]),
        )

    best = candidate(pick)
    kept = [best]
    for _ in range(MAX_FALLBACKS):  # best | c and c | best for every candidate c
        after = table.iou(np.where(best.cover, best.mins, mins), best.cover | cover, h)
        before = table.iou(np.where(cover, mins, best.mins), best.cover | cover, h)
        gains = np.concatenate([after, before])
        size = np.tile(1 + best.program.size + sizes, 2)
        paren = 2 * isinstance(best.program, Fallback)
        length = np.concatenate([lengths + 3, lengths + 3 + paren]) + len(str(best.program))
        j = int(_order(gains, size, length)[0])
        if gains[j] - best.iou < MIN_GAIN:
            break
        c, prefix = j % len(programs), j >= len(programs)
        d = _dense_of(c, len(base), dense, masks, table)
        first, then = (cover[c], best.cover) if prefix else (best.cover, cover[c])
        first_d, then_d = (d, best.dense) if prefix else (best.dense, d)
        first_m, then_m = (mins[c], best.mins) if prefix else (best.mins, mins[c])
        first_h, then_h = (hit[c], best.hit) if prefix else (best.hit, hit[c])
        best = _Candidate(
            Fallback(programs[c], best.program) if prefix else Fallback(best.program, programs[c]),
            np.where(first[table.pair_query], first_d, then_d),
            np.where(first, first_m, then_m),
            first | then,
            np.where(first, first_h, then_h),
            float(gains[j]),
        )
        kept.append(best)
    mixed = _best_mix(table, h, best, [candidate(int(i)) for i in order[:MIX_PARTNERS]])
    if mixed is not None:
        best = mixed
        kept.append(best)
    # runners-up: programs of another pattern on the search texts (``same_word`` is ``self``
    # where every word is one token: only the smaller is kept)
    chosen: list[_Candidate] = []
    patterns: set[bytes] = set()
    for c in [best, *reversed(kept[:-1]), *(candidate(int(i)) for i in order[: 4 * top])]:
        key = c.dense.tobytes()
        if key not in patterns and len(chosen) < top:
            patterns.add(key)
            chosen.append(c)
    q = table.queries
    return Found(
        h,
        tuple(c.program for c in chosen),
        tuple(c.iou for c in chosen),
        tuple(float(c.hit.sum() / q) for c in chosen),
    )


def _best_mix(
    table: PairTable, h: int, best: _Candidate, partners: list[_Candidate]
) -> _Candidate | None:
    """``mix(best, c, w)`` for each partner and weight: the best one if it gains ``MIN_GAIN``."""
    top: _Candidate | None = None
    a = table.a[h]
    for c in partners:
        if str(c.program) == str(best.program):
            continue
        for w in MIX_WEIGHTS:
            d = w * best.dense + (1 - w) * c.dense
            rows = table.per_query(d)
            d = np.divide(
                d, rows[table.pair_query], out=np.zeros_like(d), where=rows[table.pair_query] > 0
            )
            cover = rows > 0
            mins = table.per_query(np.minimum(a, d))
            iou = float(table.iou(mins, cover, h))
            if iou - best.iou >= MIN_GAIN and (top is None or iou > top.iou + 1e-9):
                top = _Candidate(
                    Mix(best.program, c.program, w), d, mins, cover, d[table.best[h]] > 0, iou
                )
    return top

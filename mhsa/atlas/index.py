"""The atlas's context search (exBERT's, Hoover et al. 2020): corpus tokens whose head outputs z
are nearest a chosen token's by cosine similarity.

The heads' outputs are kept in 4 bits per number (``ZCodes``: per head and dimension, 16 even
steps from the corpus's minimum to its maximum, so every stored value is within half a step of
the model's; 1,152 bytes per token for MiniLM's 72 heads of 32 dimensions, against 4,608 in
float16). Over one head or a few, search is exhaustive over the stored values. Over every head
at once (exBERT's concatenation) it is exhaustive too up to ``EXACT_UP_TO`` tokens; above, a
faiss inverted file with product quantisation (``IndexIVFPQ``: 4-bit codes of 6 dimensions
each, 192 bytes a token for MiniLM; ``PROBES`` of its lists searched) proposes ``RERANK``
candidates per result, re-ranked on the stored values (its recall@10 against exhaustive
search: ``bench/bench_atlas.py`` and the tests). 4-bit codes of 6 dimensions, rather than
8-bit codes of 12, train 15x faster at the same size and found more of the true neighbours
(BENCHMARKS.md §21).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EXACT_UP_TO", "ZCodes", "build_index", "exact_neighbours", "search_index"]

#: atlases up to this many tokens are searched exhaustively over every head
EXACT_UP_TO = 50_000
#: candidates the approximate index proposes per result, re-ranked on the stored values
RERANK = 500
#: inverted lists searched per query
PROBES = 64
#: dimensions per product-quantiser code, and its bits
SUB_DIMS, CODE_BITS = 6, 4
#: k-means iterations of the coarse quantiser and of each sub-quantiser (faiss's default: 25)
KMEANS_ITERATIONS = 10
#: rows decoded at a time (memory stays flat)
CHUNK = 16_384
LEVELS = 15  # 4 bits: codes 0..15


@dataclass
class ZCodes:
    """The heads' outputs of every token, 4 bits a number: ``codes [Hs, N, Dh / 2]`` (two
    numbers a byte, the low nibble first), ``lo`` and ``step`` ``[Hs, Dh]``."""

    codes: np.ndarray
    lo: np.ndarray
    step: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.codes.shape[1])

    @staticmethod
    def ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, step)`` from per-dimension minima and maxima."""
        return lo.astype(np.float32), np.maximum((hi - lo) / LEVELS, 1e-12).astype(np.float32)

    @staticmethod
    def encode(z: np.ndarray, lo: np.ndarray, step: np.ndarray) -> np.ndarray:
        """``[Hs, n, Dh]`` values as ``[Hs, n, Dh / 2]`` packed codes."""
        q = np.rint((z.astype(np.float32) - lo[:, None]) / step[:, None])
        q = np.clip(q, 0, LEVELS).astype(np.uint8)
        return q[..., 0::2] | (q[..., 1::2] << 4)

    def decode(self, tokens: np.ndarray | slice, heads: list[int] | None = None) -> np.ndarray:
        """The stored values of ``heads`` (None: all) at ``tokens``: ``[Hs, n, Dh]`` float32."""
        chosen = self.codes[:, tokens] if heads is None else self.codes[heads][:, tokens]
        chosen = np.asarray(chosen)
        lo = self.lo if heads is None else self.lo[heads]
        step = self.step if heads is None else self.step[heads]
        q = np.empty((*chosen.shape[:2], chosen.shape[2] * 2), np.float32)
        q[..., 0::2] = chosen & 15
        q[..., 1::2] = chosen >> 4
        return lo[:, None] + q * step[:, None]

    def rows(self, tokens: np.ndarray | slice, heads: list[int] | None = None) -> np.ndarray:
        """Unit-length concatenations of ``heads``' values at ``tokens``: ``[n, Hs Dh]``."""
        z = self.decode(tokens, heads)
        rows = np.ascontiguousarray(z.transpose(1, 0, 2)).reshape(z.shape[1], -1)
        return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def build_index(z: ZCodes, folder: Path) -> dict[str, Any]:
    """The all-heads index into ``folder/index.faiss`` when the atlas is large; returns its
    description for the manifest."""
    n = z.tokens
    dims = z.codes.shape[0] * z.codes.shape[2] * 2
    if n <= EXACT_UP_TO:
        return {"kind": "exact", "lists": 0, "dims": dims}
    import faiss

    lists = int(min(256, max(16, math.sqrt(n))))
    index = faiss.IndexIVFPQ(
        faiss.IndexFlatIP(dims),
        dims,
        lists,
        _subquantizers(dims),
        CODE_BITS,
        faiss.METRIC_INNER_PRODUCT,
    )
    index.cp.niter = index.pq.cp.niter = KMEANS_ITERATIONS
    rng = np.random.default_rng(0)
    # 40 points a list (faiss asks for 39): the training set, and the build's peak memory,
    # stop growing at 10,240 rows
    index.train(z.rows(np.sort(rng.choice(n, size=min(n, 40 * lists), replace=False))))
    for start in range(0, n, CHUNK):
        index.add(z.rows(slice(start, min(n, start + CHUNK))))
    faiss.write_index(index, str(folder / "index.faiss"))
    return {"kind": "ivfpq", "lists": lists, "dims": dims}


def _subquantizers(dims: int) -> int:
    """PQ sub-vectors of about ``SUB_DIMS`` dimensions (their count a divisor of ``dims``): 384
    of 4 bits, 192 bytes a token, for MiniLM's 2,304."""
    for m in range(max(1, dims // SUB_DIMS), dims + 1):
        if dims % m == 0:
            return m
    return dims


def search_index(
    index: Any, z: ZCodes, query: np.ndarray, k: int, probes: int = PROBES
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest tokens to the unit vector ``query`` over all heads: ``(tokens,
    similarities)``, candidates of the approximate index re-ranked on the stored values."""
    index.nprobe = probes
    _, cand = index.search(query[None].astype(np.float32), k * RERANK)
    cand = np.unique(cand[0][cand[0] >= 0])
    sims = z.rows(cand) @ query
    order = np.lexsort((cand, -sims))[:k]
    return cand[order], sims[order]


def exact_neighbours(
    z: ZCodes, heads: list[int] | None, query: np.ndarray, k: int | None, exclude: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exhaustive cosine search over ``heads``' stored values (None: all): ``(tokens,
    similarities)`` of the ``k`` nearest (None: all), ``exclude`` left out, ties by token."""
    n = z.tokens
    sims = np.empty(n, np.float32)
    for start in range(0, n, CHUNK):
        stop = min(n, start + CHUNK)
        sims[start:stop] = z.rows(slice(start, stop), heads) @ query
    sims[exclude] = -np.inf
    found = np.flatnonzero(np.isfinite(sims))
    if k is not None and k < len(found):
        edge = -np.partition(-sims[found], k - 1)[k - 1]
        found = found[sims[found] >= edge]  # ties at the edge kept: the order decides
    order = found[np.lexsort((found, -sims[found]))][:k]
    return order, sims[order]

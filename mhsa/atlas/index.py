"""The atlas's context search (exBERT's, Hoover et al. 2020): corpus tokens whose head outputs z
are nearest a chosen token's by cosine similarity.

Over every head at once (z of all heads concatenated, exBERT's default) a faiss index answers:
an exact inner-product index (``IndexFlatIP``) for small atlases, an inverted file with product
quantisation (``IndexIVFPQ``) above ``EXACT_UP_TO`` tokens, whose candidates are re-ranked
exactly from the stored z (recall@10 measured against exact search in ``bench/bench_atlas.py``
and the tests). Over one head or a few: exact search over those heads' z, which is small.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EXACT_UP_TO", "build_index", "exact_neighbours", "rows_of", "search_index"]

#: atlases up to this many tokens get the exact index
EXACT_UP_TO = 50_000
#: candidates the approximate index proposes per result, re-ranked exactly
RERANK = 20
#: rows normalised and added at a time (memory stays flat)
CHUNK = 65_536


def rows_of(
    z: np.ndarray, tokens: np.ndarray | slice, heads: list[int] | None = None
) -> np.ndarray:
    """The unit-length concatenation of ``heads``' z (all: None) at ``tokens``: ``[n, Hs Dh]``
    float32, from the head-major ``[Hs, N, Dh]`` array."""
    chosen = z[:, tokens] if heads is None else z[heads][:, tokens]
    rows = np.ascontiguousarray(np.asarray(chosen, dtype=np.float32).transpose(1, 0, 2))
    rows = rows.reshape(rows.shape[0], -1)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


def build_index(z: np.ndarray, folder: Path, kind: str = "auto") -> dict[str, Any]:
    """Build the all-heads index of ``z`` (``[Hs, N, Dh]``) into ``folder/index.faiss``;
    returns its description for the manifest."""
    import faiss

    n = z.shape[1]
    dims = z.shape[0] * z.shape[2]
    if kind == "auto":
        kind = "exact" if n <= EXACT_UP_TO else "ivfpq"
    if kind == "exact":
        index = faiss.IndexFlatIP(dims)
        lists = 0
    else:
        lists = int(min(4096, max(16, 4 * math.sqrt(n))))
        m = _subquantizers(dims)
        index = faiss.IndexIVFPQ(
            faiss.IndexFlatIP(dims), dims, lists, m, 8, faiss.METRIC_INNER_PRODUCT
        )
        rng = np.random.default_rng(0)
        train = np.sort(rng.choice(n, size=min(n, 64 * lists), replace=False))
        index.train(rows_of(z, train))
    for start in range(0, n, CHUNK):
        index.add(rows_of(z, slice(start, min(n, start + CHUNK))))
    faiss.write_index(index, str(folder / "index.faiss"))
    return {"kind": kind, "lists": lists, "dims": dims}


def _subquantizers(dims: int) -> int:
    """PQ sub-vectors of about 8 dimensions each (a divisor of ``dims``)."""
    for m in range(max(1, dims // 8), dims + 1):
        if dims % m == 0:
            return m
    return dims


def search_index(
    index: Any, z: np.ndarray, query: np.ndarray, k: int, probes: int = 32
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest tokens to the unit vector ``query`` over all heads: ``(tokens,
    similarities)``, exact similarities (approximate candidates re-ranked from ``z``)."""
    if hasattr(index, "nprobe"):
        index.nprobe = probes
        _, cand = index.search(query[None].astype(np.float32), k * RERANK)
        cand = np.unique(cand[0][cand[0] >= 0])
        sims = rows_of(z, cand) @ query
        order = np.lexsort((cand, -sims))[:k]
        return cand[order], sims[order]
    sims, cand = index.search(query[None].astype(np.float32), k)
    keep = cand[0] >= 0
    return cand[0][keep], sims[0][keep]


def exact_neighbours(
    z: np.ndarray, heads: list[int] | None, query: np.ndarray, k: int | None, exclude: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine search over ``heads``' z (None: all): ``(tokens, similarities)`` of the
    ``k`` nearest (None: all), ``exclude`` left out, ties by token order."""
    n = z.shape[1]
    sims = np.empty(n, np.float32)
    for start in range(0, n, CHUNK):
        stop = min(n, start + CHUNK)
        sims[start:stop] = rows_of(z, slice(start, stop), heads) @ query
    sims[exclude] = -np.inf
    count = n - 1 if k is None else min(k, n - 1)
    part = (
        np.argpartition(-sims, count - 1)[:count]
        if count < n - 1
        else np.flatnonzero(np.isfinite(sims))
    )
    order = part[np.lexsort((part, -sims[part]))]
    return order, sims[order]

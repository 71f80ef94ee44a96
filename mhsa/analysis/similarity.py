"""How alike heads are: a heads x heads matrix (Jensen-Shannon divergence as in Clark et al.
2019, or cosine similarity), a 2-D map of heads (metric MDS) and a clustering of them.

Pure functions of ``AttentionResult``s and of the matrix they give.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from mhsa.analysis.blocks import as_results, rows_per_block
from mhsa.engine.result import AttentionResult
from mhsa.heads import parse_head_label

__all__ = [
    "HeadClusters",
    "HeadSimilarityAccumulator",
    "head_clusters",
    "head_map",
    "head_similarity",
    "js_divergences",
]

_JS_SMOOTHING = 1e-3  # Clark et al.: 0.999 A + 0.001 / n
_EPS32 = float(torch.finfo(torch.float32).eps)
#: most threads of one JS computation (each holds three blocks of temporaries)
_JS_THREADS = 8


def _smoothed(
    x: np.ndarray, smoothing: float, n: int, *, out: np.ndarray | None = None
) -> np.ndarray:
    """``(1 - s) x + s / n`` (Clark et al.'s smoothing over ``n`` keys) in float32, written
    into ``out`` (a new array by default)."""
    out = np.empty(x.shape, np.float32) if out is None else out
    if smoothing:
        return np.add(np.multiply(x, 1 - smoothing, out=out), smoothing / n, out=out)
    np.copyto(out, x)
    return out


def _js_sums(
    a: np.ndarray, starts: Sequence[int], rows: int, smoothing: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pass 1 of ``js_divergences`` over the blocks of ``rows`` query rows that begin at
    ``starts``: per head ``sum P log P`` and ``sum P``, per pair ``sum S log S`` with
    ``S = P + Q`` (one log per element and pair), float32 within a block, float64 across.
    numpy, not torch: its float32 log is faster than torch's on one core, and its ufuncs
    release the GIL, so that blocks can run on several threads."""
    k, m, n = a.shape  # m query rows over n keys
    part_buf, pair_buf, log_buf = (np.empty((k, rows * n), np.float32) for _ in range(3))
    plogp, psum, slogs = np.zeros(k), np.zeros(k), np.zeros((k, k))
    for r0 in starts:
        width = min(rows, m - r0) * n
        block = a[:, r0 : r0 + width // n].reshape(k, width)
        part = _smoothed(block, smoothing, n, out=part_buf[:, :width])
        psum += part.sum(-1)
        logs = np.log(part, out=log_buf[:, :width])
        plogp += np.multiply(logs, part, out=logs).sum(-1)
        for i in range(k - 1):
            s = np.add(part[i], part[i + 1 :], out=pair_buf[: k - i - 1, :width])
            logs = np.log(s, out=log_buf[: k - i - 1, :width])
            slogs[i, i + 1 :] += np.multiply(logs, s, out=logs).sum(-1)  # pairwise, float32
    return plogp, psum, slogs


def js_divergences(
    a: np.ndarray, *, smoothing: float = 0.0, chunk_elems: int = 2**24, threads: int = 1
) -> np.ndarray:
    """Sum over query rows of the Jensen-Shannon divergence between every pair of heads.

    Args:
        a: ``[heads, m, n]`` attention (m query rows over n keys; m == n but for
            cross-attention).
        smoothing: ``s`` of ``(1 - s) A + s / n`` (Clark et al.), applied here block by block;
            every smoothed entry must be positive.
        chunk_elems: bound on the floats of the pairwise temporaries (memory stays bounded).
        threads: threads that share the blocks of pass 1 (each holds three blocks).

    Two passes, so that accuracy costs no speed:

    1. Every pair, float32, a block of query rows at a time (``_js_pass_one``; partial sums in
       float64): ``JS = (S_P + S_Q) / 2 - sum M log M`` with ``S_P = sum P log P`` per head,
       ``M = (P + Q) / 2`` and ``sum M log M = (sum S log S - log 2 sum S) / 2``,
       ``S = P + Q``: one log per element and pair. The sums are large (about n log n) and
       cancel: the absolute error is at most about ``8 eps32 (|S_P| + |S_Q|)``, 2e-4 at 512
       tokens, ten times the divergence of two near-identical heads.
    2. Every pair below 1000 times that bound (where the error could exceed 1e-3 of the value:
       near-identical heads, rare in real models) is recomputed without cancellation:
       ``sum M (d atanh(d) + log1p(-d^2) / 2)`` with ``d = (Q - P) / (Q + P)``, every term
       non-negative; relative error about 1e-6 against ``scipy.spatial.distance.jensenshannon``.

    Every temporary is a block that stays in the CPU's cache (``mhsa.analysis.blocks.BLOCK_ELEMS``):
    whole-head temporaries were fresh memory, page faults, on every call, and slower.
    """
    plogp_np, psum, slogs = _js_pass_one(a, smoothing, threads)
    mlogm = 0.5 * (slogs - np.log(2.0) * (psum[:, None] + psum[None, :]))
    plogp = torch.from_numpy(plogp_np)
    out = (0.5 * (plogp[:, None] + plogp[None, :]) - torch.from_numpy(mlogm)).float()
    _recompute_near_identical(out, a, plogp, smoothing, chunk_elems)
    out = out.triu(1)
    return (out + out.T).clamp_min_(0.0).double().numpy()


def _js_pass_one(
    a: np.ndarray, smoothing: float, threads: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_js_sums`` over every block of query rows of ``a``, the blocks shared by at most
    ``threads`` threads; the threads' sums added."""
    k, m, n = a.shape
    rows = min(m, rows_per_block(k * n))  # query rows of every head in one block
    starts = range(0, m, rows)
    workers = max(1, min(threads, len(starts)))
    if workers == 1:
        parts = [_js_sums(a, starts, rows, smoothing)]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="mhsa-js") as pool:
            parts = list(
                pool.map(lambda w: _js_sums(a, starts[w::workers], rows, smoothing), range(workers))
            )
    plogp, psum, slogs = (sum(p[i] for p in parts) for i in range(3))
    return plogp, psum, slogs


def _recompute_near_identical(
    out: torch.Tensor, a: np.ndarray, plogp: torch.Tensor, smoothing: float, chunk_elems: int
) -> None:
    """Pass 2 of ``js_divergences``: the pairs of ``out`` (upper triangle) within 1000 times
    pass 1's error bound, recomputed in ``out`` without cancellation, ``chunk_elems`` floats of
    temporaries at a time."""
    m, n = a.shape[1:]
    block = max(1, chunk_elems // max(m * n, 1))
    bound = 8 * _EPS32 * (plogp.abs()[:, None] + plogp.abs()[None, :])  # (K, K)
    pairs = (out < 1000 * bound).triu(1).nonzero()  # (R, 2)
    for chunk in pairs.split(block):
        pa, pb = (
            torch.from_numpy(_smoothed(a[c.numpy()], smoothing, n)) for c in chunk.T
        )  # (r, m, n)
        m = pa + pb
        d = (pb - pa).div_(m)
        g = (d * torch.atanh(d)).add_(torch.log1p(-d * d), alpha=0.5)
        out[chunk[:, 0], chunk[:, 1]] = 0.5 * m.mul_(g).sum((-1, -2))  # positive terms


def _cosine(a: np.ndarray) -> np.ndarray:
    flat = a.reshape(a.shape[0], -1).astype(np.float64)
    norms = np.linalg.norm(flat, axis=1, keepdims=True)
    unit = flat / np.where(norms == 0, 1.0, norms)
    return np.clip(unit @ unit.T, -1.0, 1.0)


_METRICS = {
    "js": lambda a: js_divergences(
        a, smoothing=_JS_SMOOTHING, threads=min(torch.get_num_threads(), _JS_THREADS)
    ),
    "cosine": _cosine,
}


class HeadSimilarityAccumulator:
    """Running mean of the heads x heads matrix over a corpus."""

    def __init__(self, metric: str = "js") -> None:
        if metric not in _METRICS:
            raise ValueError(f"Unknown metric {metric!r}: choose one of {', '.join(_METRICS)}.")
        self.metric = metric
        self.count = 0
        self._sum: np.ndarray | None = None
        self._labels: list[str] | None = None

    def add(self, result: AttentionResult) -> None:
        layers, heads, m, n = result.attention.shape
        matrix = _METRICS[self.metric](result.attention.reshape(layers * heads, m, n))
        if self._sum is not None and matrix.shape != self._sum.shape:
            raise ValueError("All results must come from models with the same layers x heads.")
        self._sum = matrix if self._sum is None else self._sum + matrix
        self._labels = result.head_labels()
        self.count += 1

    def merge(self, other: HeadSimilarityAccumulator) -> HeadSimilarityAccumulator:
        """Add another accumulator's sentences (a shard computed elsewhere); returns self.
        Associative and order-independent up to float rounding of the sums."""
        if not isinstance(other, HeadSimilarityAccumulator):
            raise TypeError(f"Cannot merge {type(other).__name__} into HeadSimilarityAccumulator.")
        if other.metric != self.metric:
            raise ValueError(f"Cannot merge {other.metric} similarity into {self.metric}.")
        if other._sum is None:
            return self
        if self._sum is not None and other._sum.shape != self._sum.shape:
            raise ValueError("All shards must come from models with the same layers x heads.")
        self._sum = other._sum.copy() if self._sum is None else self._sum + other._sum
        self._labels = other._labels
        self.count += other.count
        return self

    def frame(self) -> pd.DataFrame:
        if self._sum is None:
            raise ValueError("No results were added.")
        frame = pd.DataFrame(self._sum / self.count, index=self._labels, columns=self._labels)
        frame.attrs["metric"] = self.metric
        return frame


def head_similarity(
    results: AttentionResult | Iterable[AttentionResult], *, metric: str = "js"
) -> pd.DataFrame:
    """Heads x heads matrix labelled ``L{layer}H{head}``, averaged over sentences.

    Args:
        results: one result or a corpus.
        metric: ``"js"``: Jensen-Shannon divergence (natural log) between two heads' attention,
            summed over query rows, with Clark et al.'s smoothing 0.999 A + 0.001/n; 0 for
            identical heads. A divergence, not a distance: scipy's ``jensenshannon`` distance is
            the square root of one row's divergence. ``"cosine"``: cosine similarity of the
            flattened maps; 1 for identical heads. ``frame.attrs["metric"]`` records which.
    """
    acc = HeadSimilarityAccumulator(metric)
    for r in as_results(results):
        acc.add(r)
    return acc.frame()


def _distances(similarity: pd.DataFrame) -> np.ndarray:
    values = similarity.to_numpy(dtype=np.float64)
    d = 1.0 - values if similarity.attrs.get("metric") == "cosine" else values.copy()
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0.0)
    return np.clip(d, 0.0, None)


def head_map(similarity: pd.DataFrame, *, seed: int = 0) -> pd.DataFrame:
    """2-D coordinates per head by metric MDS on the head distances (scikit-learn).

    Returns a DataFrame indexed like ``similarity`` with ``x``, ``y``, ``layer``, ``head``.
    Deterministic for a fixed ``seed``.
    """
    from sklearn.manifold import MDS

    d = _distances(similarity)
    if len(d) < 3:
        xy = np.zeros((len(d), 2))
    else:
        mds = MDS(
            n_components=2,
            metric="precomputed",
            metric_mds=True,
            init="classical_mds",
            random_state=seed,
            n_init=1,
            max_iter=300,
        )
        xy = mds.fit_transform(d)
    frame = pd.DataFrame(xy, columns=["x", "y"], index=similarity.index)
    parts = np.array([parse_head_label(label) for label in similarity.index], dtype=int)
    parts = parts.reshape(-1, 2)
    frame["layer"], frame["head"] = parts[:, 0], parts[:, 1]
    return frame


@dataclass(frozen=True)
class HeadClusters:
    """Cluster label per head (1..k) and a leaf order that puts similar heads side by side."""

    labels: pd.Series
    order: list[str]


def head_clusters(similarity: pd.DataFrame, k: int) -> HeadClusters:
    """Average-linkage hierarchical clustering of heads (scipy) into at most ``k`` clusters."""
    from scipy.cluster.hierarchy import fcluster, leaves_list, linkage
    from scipy.spatial.distance import squareform

    names = list(similarity.index)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if len(names) == 1:
        return HeadClusters(pd.Series([1], index=names, name="cluster"), names)
    tree = linkage(
        squareform(_distances(similarity), checks=False), method="average", optimal_ordering=True
    )
    labels = fcluster(tree, t=min(k, len(names)), criterion="maxclust")
    order = [names[i] for i in leaves_list(tree)]
    return HeadClusters(pd.Series(labels, index=names, name="cluster"), order)

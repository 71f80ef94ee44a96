"""Compiled loops over an atlas's packed head-output codes (numba): a code is read straight
from its bits and looked up in its cell table, so a search never unpacks the codes into arrays
of their own (numpy's unpack, index and take made five passes over every number, 40 times the
time of one compiled pass: ``BENCHMARKS.md`` §24).

The codes' layout is ``mhsa.atlas.index._pack``'s, one head at one token a row of bytes: code
``i`` of a row lies at bits ``i * bits`` to ``(i + 1) * bits`` of the row read as one
little-endian number (4 bits: two a byte, the low nibble first; 5 bits: eight in 5 bytes).

- ``lookup(codes, heads, tokens, spans, tables)``: the tables' entries at each code of
  ``heads`` at ``tokens`` (a decode: midpoints; widths).
- ``cosines(codes, heads, bounds, mids, query, tokens=None)``: each token's cosine with
  ``query`` over ``heads``' decoded values, as an asymmetric scan (Jegou et al. 2011, "Product
  quantization for nearest neighbor search", IEEE TPAMI 33(1), section 4.1: the query's
  products with every cell's midpoint are tabled once, then each token sums its codes'
  entries): the cosine of the concatenation is ``sum_h q_h . c_h / sqrt(sum_h ||c_h||^2)``.
- ``cosine_bounds(...)``: the same for candidates, with each one's bound on its codes' error
  (``mhsa.atlas.exact``'s re-ranking), in the same single pass.
- ``cells_of(values, grid, power, cells)`` and ``pack(codes, bits, size)``: the build's coding
  (``ZCodes.quantise_cells``: each dimension's histogram, its cells and every number's code in
  one pass) and packing.

The loops run on every core (numba's ``prange``). Where numba finds neither OpenMP nor TBB its
thread pool is its "workqueue", which may not be entered by two threads at once, and Streamlit
serves each session on a thread of its own, so every call holds one lock (``_LOCK``): calls
wait for each other, each uses all cores. On OpenMP (numba's choice where torch has loaded
it) a launch sets the calling thread's torch threads, so each call restores them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import numpy as np

# compiled once per machine, not once per process (a server's first search would wait seconds
# for the compiler); the user's cache folder, where an installed package's folder is not
# writable
os.environ.setdefault(
    "NUMBA_CACHE_DIR",
    os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mhsa-explorer", "numba"
    ),
)
import numba  # after its cache folder is set
import torch

__all__ = ["cells_of", "cosine_bounds", "cosines", "lookup", "pack", "warm"]

_LOCK = threading.Lock()


@contextlib.contextmanager
def _launch() -> Iterator[None]:
    """One compiled loop at a time (``_LOCK``), and the calling thread's torch threads as they
    were after it: numba's OpenMP pool shares torch's OpenMP runtime, and a launch sets the
    calling thread's thread count (the service runs a page's work on one core fewer)."""
    with _LOCK:
        threads = torch.get_num_threads()
        try:
            yield
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)


@numba.njit(inline="always")
def _code(row: np.ndarray, i: int, bits: int) -> int:
    """Code ``i`` of one row of packed codes."""
    bit = i * bits
    byte = bit >> 3
    shift = bit & 7
    value = np.int64(row[byte]) >> shift
    if shift + bits > 8:
        value |= np.int64(row[byte + 1]) << (8 - shift)
    return value & ((1 << bits) - 1)


@numba.njit(parallel=True, cache=True)
def _lookup(codes, heads, tokens, spans, tables, bits, out):  # pragma: no cover - compiled
    n_tables, dh = tables.shape[0], tables.shape[3]
    for t in numba.prange(tokens.shape[0]):
        token, span = tokens[t], spans[t]
        for j in range(heads.shape[0]):
            h = heads[j]
            row = codes[h, token]
            for d in range(dh):
                c = _code(row, d, bits)
                for k in range(n_tables):
                    out[k, j, t, d] = tables[k, span, h, d, c]


@numba.njit(inline="always")
def _cosine(codes, heads, token, span, products, squares, bits):  # pragma: no cover
    """One token's cosine from the query's product and square tables of its span."""
    dot = 0.0
    norm = 0.0
    for j in range(heads.shape[0]):
        row = codes[heads[j], token]
        for d in range(products.shape[2]):
            c = _code(row, d, bits)
            dot += products[span, j, d, c]
            norm += squares[span, j, d, c]
    return dot / max(np.sqrt(norm), 1e-12)


@numba.njit(parallel=True, cache=True)
def _cosines(codes, heads, bounds, products, squares, bits, out):  # pragma: no cover
    for s in range(bounds.shape[0]):
        first = bounds[s]
        last = bounds[s + 1] if s + 1 < bounds.shape[0] else codes.shape[1]
        for token in numba.prange(first, last):
            out[token] = _cosine(codes, heads, token, s, products, squares, bits)


@numba.njit(parallel=True, cache=True)
def _cosines_at(codes, heads, tokens, spans, products, squares, bits, out):  # pragma: no cover
    for t in numba.prange(tokens.shape[0]):
        out[t] = _cosine(codes, heads, tokens[t], spans[t], products, squares, bits)


@numba.njit(parallel=True, cache=True)
def _bounds_at(
    codes, heads, tokens, spans, mids, widths, query, bits, margin, curvature, cos, bound
):  # pragma: no cover - compiled
    dh = mids.shape[2]
    for t in numba.prange(tokens.shape[0]):
        token, span = tokens[t], spans[t]
        # with m a number's midpoint, w its width, q the query's number: q.m, m.m, and the
        # sums of q^2 w^2, q m w^2, m^2 w^2 and w^2 give the gradient term without a second pass
        dot = 0.0
        norm = 0.0
        qq = 0.0
        qm = 0.0
        mm = 0.0
        ww = 0.0
        for j in range(heads.shape[0]):
            h = heads[j]
            row = codes[h, token]
            for d in range(dh):
                c = _code(row, d, bits)
                m = mids[span, h, d, c]
                w2 = widths[span, h, d, c] ** 2
                q = query[j * dh + d]
                dot += q * m
                norm += m * m
                qq += q * q * w2
                qm += q * m * w2
                mm += m * m * w2
                ww += w2
        length = max(np.sqrt(norm), 1e-12)
        cosine = dot / length
        # sum_d (q_d - cosine * m_d / length)^2 w_d^2
        gradient = qq - 2.0 * cosine / length * qm + (cosine / length) ** 2 * mm
        first = np.sqrt(max(gradient, 0.0) / 12.0) / length
        cos[t] = cosine
        bound[t] = margin * first + curvature * ww / 12.0 / length**2


@numba.njit(parallel=True, cache=True)
def _pack_rows(codes, bits, out):  # pragma: no cover - compiled
    hs, n, dh = codes.shape
    for r in numba.prange(hs * n):
        h, t = r // n, r % n
        for b in range(out.shape[2]):
            out[h, t, b] = 0
        for i in range(dh):
            bit = i * bits
            byte, shift = bit >> 3, bit & 7
            value = np.int64(codes[h, t, i]) << shift
            out[h, t, byte] |= np.uint8(value & 255)
            if shift + bits > 8:
                out[h, t, byte + 1] |= np.uint8(value >> 8)


@numba.njit(parallel=True, cache=True)
def _cells_of(values, grid, power, cells, codes, edges):  # pragma: no cover - compiled
    n, dh = values.shape
    for d in numba.prange(dh):
        lo, hi = values[0, d], values[0, d]
        for t in range(n):
            lo = min(lo, values[t, d])
            hi = max(hi, values[t, d])
        step = max((hi - lo) / np.float32(grid), np.float32(1e-30))
        fine = np.empty(n, np.int64)
        counts = np.zeros(grid, np.float64)
        for t in range(n):
            f = np.floor((values[t, d] - lo) / step)
            g = min(max(np.int64(f), 0), grid - 1)
            fine[t] = g
            counts[g] += 1.0
        below = np.cumsum(counts**power)  # up to and including each grid step
        table = np.zeros(grid + 1, np.int64)
        edges[d, 0], edges[d, cells] = lo, hi
        for c in range(1, cells):
            # cell c's first grid step: the one after the first that brings c / cells
            first = min(np.searchsorted(below, c / cells * below[grid - 1]) + 1, grid)
            table[first] += 1
            edges[d, c] = min(lo + np.float32(first) * step, hi)
        seen = 0
        for g in range(grid):  # grid step -> cell
            seen += table[g]
            table[g] = min(seen, cells - 1)
        for t in range(n):
            codes[t, d] = table[fine[t]]


def pack(codes: np.ndarray, bits: int, size: int) -> np.ndarray:
    """Codes ``[Hs, n, Dh]`` (uint8, each below ``2 ** bits``) packed as rows of ``size``
    bytes, code ``i`` of a row at bits ``i * bits`` on (``mhsa.atlas.index._pack``'s layout;
    ``size``: ``index.code_bytes``)."""
    hs, n, _ = codes.shape
    out = np.empty((hs, n, size), np.uint8)
    if out.size:
        with _launch():
            _pack_rows(np.ascontiguousarray(codes, np.uint8), bits, out)
    return out


def cells_of(
    values: np.ndarray, grid: int, power: float, cells: int
) -> tuple[np.ndarray, np.ndarray]:
    """One head's numbers ``values [n, Dh]`` (float32) in ``cells`` cells a dimension placed
    on a grid of ``grid`` even steps by the ``power`` of their density
    (``mhsa.atlas.index.ZCodes.quantise_cells``): ``(codes [n, Dh] uint8, edges [Dh, cells +
    1] float32)``."""
    values = np.ascontiguousarray(values, np.float32)
    codes = np.empty(values.shape, np.uint8)
    edges = np.empty((values.shape[1], cells + 1), np.float32)
    with _launch():
        _cells_of(values, grid, float(power), cells, codes, edges)
    return codes, edges


def lookup(
    codes: np.ndarray,
    heads: np.ndarray,
    tokens: np.ndarray,
    spans: np.ndarray,
    tables: np.ndarray,
    bits: int,
) -> np.ndarray:
    """``tables [T, S, Hs, Dh, cells]`` looked up at the code of every head of ``heads`` at
    every token of ``tokens`` (whose spans are ``spans``) in ``codes [Hs, N, bytes]``:
    ``[T, len(heads), len(tokens), Dh]`` float32."""
    tables = np.ascontiguousarray(tables, np.float32)
    out = np.empty((tables.shape[0], len(heads), len(tokens), tables.shape[3]), np.float32)
    if out.size:
        with _launch():
            _lookup(
                codes,
                np.asarray(heads, np.int64),
                np.asarray(tokens, np.int64),
                np.asarray(spans, np.int64),
                tables,
                bits,
                out,
            )
    return out


def cosines(
    codes: np.ndarray,
    heads: np.ndarray,
    bounds: np.ndarray,
    mids: np.ndarray,
    query: np.ndarray,
    bits: int,
    tokens: np.ndarray | None = None,
) -> np.ndarray:
    """The cosine of each token's decoded values over ``heads`` (their concatenation) with
    the unit vector ``query [len(heads) * Dh]``: ``[N]`` float32 for every token of ``codes
    [Hs, N, bytes]``, or ``[n]`` for ``tokens``; span s (from token ``bounds[s]``) decodes by
    ``mids [S, Hs, Dh, cells]``."""
    heads = np.asarray(heads, np.int64)
    mids = np.asarray(mids, np.float32)[:, heads]  # [S, len(heads), Dh, cells]
    q = np.asarray(query, np.float32).reshape(len(heads), -1)
    products = np.ascontiguousarray(mids * q[None, :, :, None])
    squares = np.ascontiguousarray(mids * mids)
    bounds = np.asarray(bounds, np.int64)
    out = np.empty(codes.shape[1] if tokens is None else len(tokens), np.float32)
    if not out.size:
        return out
    with _launch():
        if tokens is None:
            _cosines(codes, heads, bounds, products, squares, bits, out)
        else:
            tokens = np.asarray(tokens, np.int64)
            spans = np.searchsorted(bounds, tokens, side="right") - 1
            _cosines_at(codes, heads, tokens, spans, products, squares, bits, out)
    return out


def cosine_bounds(
    codes: np.ndarray,
    heads: np.ndarray,
    bounds: np.ndarray,
    tables: tuple[np.ndarray, np.ndarray],
    query: np.ndarray,
    bits: int,
    tokens: np.ndarray,
    margin: float,
    curvature: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Each of ``tokens``' coded cosine over ``heads`` with the unit vector ``query`` and how
    far above it its true cosine may lie (``mhsa.atlas.exact.cosine_bound``'s ``margin``
    standard deviations of the first-order error plus ``curvature`` times the mean
    second-order one), in one pass over the codes that decodes nothing: ``([n], [n])``
    float32. ``tables``: the midpoints and widths ``[S, Hs, Dh, cells]``."""
    mids, widths = (np.ascontiguousarray(t, np.float32) for t in tables)
    tokens = np.asarray(tokens, np.int64)
    spans = np.searchsorted(np.asarray(bounds, np.int64), tokens, side="right") - 1
    cos, bound = np.empty(len(tokens), np.float32), np.empty(len(tokens), np.float32)
    if len(tokens):
        q = np.ascontiguousarray(query, np.float64)
        with _launch():
            _bounds_at(
                codes, np.asarray(heads, np.int64), tokens, spans, mids, widths, q, bits,
                float(margin), float(curvature), cos, bound,
            )  # fmt: skip
    return cos, bound


def warm() -> None:
    """Compile every loop for the codes of an opened atlas (a read-only memory map) into the
    cache, so that a server's first search does not wait for the compiler (the image's build
    calls it)."""
    codes = np.zeros((1, 2, 5), np.uint8)
    codes.setflags(write=False)
    mids = np.zeros((1, 1, 8, 32), np.float32)
    cosines(codes, [0], [0], mids, np.ones(8, np.float32), 5)
    cosines(codes, [0], [0], mids, np.ones(8, np.float32), 5, np.array([1]))
    lookup(codes, np.array([0]), np.array([1]), np.array([0]), mids[None], 5)
    cosine_bounds(codes, [0], [0], (mids, mids), np.ones(8), 5, np.array([1]), 2.0, 0.25)
    cells_of(np.zeros((2, 8), np.float32), 4096, 1 / 3, 32)
    pack(np.zeros((1, 2, 8), np.uint8), 5, 5)
    pack(np.zeros((1, 2, 8), np.uint8), 4, 4)

"""The atlas's context search (exBERT's, Hoover et al. 2020): corpus tokens whose head outputs z
are nearest a chosen token's by cosine similarity.

Each head's output at each token is kept as its direction ``z / ||z||`` in 5 bits per number
and its norm ``||z||`` in 4 (``ZCodes``, format 6; the norm-explicit quantization of Dai et al.
2020, AAAI): per shard of the build, head and dimension, 32 cells placed by the values' density
(``ZCodes.quantise_cells``: as many cells in a stretch as the cube root of the density there,
the companding rule of least squared error; Gray and Neuhoff 1998, "Quantization", IEEE Trans.
Inf. Theory 44(6), section V), so a number decodes to its cell's midpoint and lies within half
the cell's width of it; the cells are narrow where the values crowd, which is where a context
search must tell near-equal outputs apart (``mhsa.atlas.exact``). A direction's numbers are
coded to the same share of its length whatever the norm, so a head's small outputs are told
apart as finely as its large ones (a cosine over one head reads the direction alone); over
several heads each head is weighed by its norm. Special tokens ([CLS], [SEP]: each text's one
crowd, far from the others) get a book of cells of their own (formats 5 and 6), so the words'
cells stay as fine as their own spread. 1,476 bytes per token for MiniLM's 72 heads of 32
dimensions, against 4,608 in float16. Atlases of format 5 keep the outputs themselves in such
cells; format 4 one book of cells for every token; format 3 32 even steps from each dimension's
minimum to its maximum, format 2 and before 16 (4 bits); all are
read as they were. A shard codes its own values, so merging shards copies bytes. Over one head
or a few, search is exhaustive over the stored values. Over every head at once (exBERT's
concatenation) it is exhaustive too up to ``EXACT_UP_TO`` tokens; above, each token's unit
concatenation, projected by a fixed random Gaussian matrix to ``PROJECTION_DIMS`` numbers
(Johnson and Lindenstrauss: inner products kept up to a small error; computed by the build from
the model's own values, layer by layer, as they are made), is scanned whole in a faiss
``IndexScalarQuantizer`` of float16 numbers (256 bytes a token; no training, so shards, resumed
builds and Ray workers need nothing from each other), and its ``RERANK`` best candidates per
result are re-ranked on the stored values (recall@10 against exhaustive search:
``bench/bench_atlas.py`` and the tests). Atlases written before (format 1) keep their one range
and their faiss ``IndexIVFPQ``, and are read as they were.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mhsa.atlas.kernels import cells_of, cosine_bounds, cosines, lookup, pack

__all__ = [
    "BITS",
    "EXACT_UP_TO",
    "NORM_BITS",
    "PROJECTION_DIMS",
    "ZCodes",
    "build_index",
    "code_bytes",
    "exact_neighbours",
    "index_candidates",
    "pack_norms",
    "projection_matrix",
    "search_index",
]

#: atlases up to this many tokens are searched exhaustively over every head
EXACT_UP_TO = 50_000
#: candidates the approximate index proposes per result, re-ranked on the stored values
RERANK = 500
#: inverted lists searched per query (format-1 atlases' IVF-PQ index)
PROBES = 64
#: numbers of a token's random projection, and the projection's seed (fixed: every build,
#: shard and worker projects the same way)
PROJECTION_DIMS, PROJECTION_SEED = 128, 48
#: rows decoded at a time (memory stays flat)
CHUNK = 16_384
#: bits a stored number: 5 (formats 3 to 6); atlases of format 2 and before keep 4
BITS = 5
#: bits of each head's norm at each token (format 6: the numbers are its direction's)
NORM_BITS = 4
#: the relative error of the float16 outputs the build codes (half a unit in the last place,
#: 2 ** -11): a stored number's cell is widened by it on each side, so that the model's own
#: float32 value lies within it too
FLOAT16_ERROR = 2.0**-11
#: even steps from a dimension's minimum to its maximum on which the cells' edges lie
#: (``ZCodes.quantise_cells``): 128 times finer than 32 even steps
GRID = 4096
#: the cells' density as a power of the numbers' density: 1/3 gives the least mean squared
#: error for many cells (Bennett 1948, "Spectra of quantized signals", Bell Syst. Tech. J.
#: 27(3); Panter and Dite 1951; Gray and Neuhoff 1998, section V): narrow cells where outputs
#: crowd, yet tails not as coarse as equal counts make them (a token with one number in a wide
#: tail cell is ranked by the codes far from its true place). Measured: ``BENCHMARKS.md`` §24
POINT_DENSITY = 1 / 3


@functools.lru_cache(maxsize=4)
def projection_matrix(dims: int) -> torch.Tensor:
    """The fixed random projection of a ``dims``-number concatenation of head outputs:
    ``[dims, PROJECTION_DIMS]`` float32, entries N(0, 1 / PROJECTION_DIMS) (numpy's PCG64, the
    same numbers on every platform)."""
    rng = np.random.default_rng(PROJECTION_SEED)
    matrix = rng.standard_normal((dims, PROJECTION_DIMS)) / np.sqrt(PROJECTION_DIMS)
    return torch.from_numpy(matrix.astype(np.float32))


def _pack(q: torch.Tensor | np.ndarray, bits: int) -> np.ndarray:
    """Codes ``q [Hs, n, Dh]`` (uint8, each below ``2 ** bits``) packed: 4 bits, two a byte,
    the low nibble first; 5 bits, each 8 numbers (Dh padded with zeros to a multiple of 8) as
    one 40-bit little-endian integer in 5 bytes, the first number in the lowest bits (both:
    code i at bits ``i * bits`` on of its row read as one little-endian number;
    ``mhsa.atlas.kernels.pack``)."""
    codes = q.cpu().numpy() if isinstance(q, torch.Tensor) else q
    return pack(codes, bits, code_bytes(codes.shape[2], bits))


def pack_norms(cells: np.ndarray) -> np.ndarray:
    """Norm codes ``[Hs, n]`` (each below 16) two heads a byte: ``[ceil(Hs / 2), n]``, head
    ``2 i`` in the low nibble of row i, head ``2 i + 1`` in the high one."""
    cells = np.asarray(cells, np.uint8)
    if len(cells) % 2:
        cells = np.concatenate([cells, np.zeros((1, cells.shape[1]), np.uint8)])
    return cells[0::2] | (cells[1::2] << 4)


def code_bytes(dh: int, bits: int) -> int:
    """Bytes of one head's codes at one token (``_pack``'s layout)."""
    return -(-dh // 2) if bits == 4 else 5 * -(-dh // 8)


@dataclass
class ZCodes:
    """The heads' outputs of every token, ``bits`` (4 or 5) a number: ``codes [Hs, N, bytes]``
    (``_pack``'s layout: 4 bits two a byte, 5 bits eight in 5 bytes) over S spans of tokens,
    span s from token ``bounds[s]``. Either ``edges``, each span's, head's and dimension's cell
    edges (a number is its cell's midpoint, ``(edges[c] + edges[c + 1]) / 2``): ``[S, G, Hs,
    Dh, 2 ** bits + 1]`` with a book of cells for each of G groups of tokens, token t's group
    ``groups[t]`` (formats 5 and 6: special tokens apart, ``special.npy``), or ``[S, Hs, Dh,
    2 ** bits + 1]`` (format 4: one book); or ``lo`` and ``step`` ``[S, Hs, Dh]`` (formats 1 to 3: a
    number is ``lo + code * step``; a format-1 atlas: one span, given as ``[Hs, Dh]``).
    ``norm_codes`` and ``norm_edges`` (format 6): the codes are each head's direction at
    each token, and its norm is coded apart in ``NORM_BITS`` (``norm_codes [ceil(Hs / 2), N]``
    uint8, head h in byte row ``h // 2``, the even head in the low nibble; ``norm_edges [S,
    G, Hs, 17]`` or ``[S, Hs, 17]``, the same spans and books); a decoded output is the
    product of the two."""

    codes: np.ndarray
    lo: np.ndarray | None = None
    step: np.ndarray | None = None
    bounds: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    bits: int = 4
    edges: np.ndarray | None = None
    groups: np.ndarray | None = None
    norm_codes: np.ndarray | None = None
    norm_edges: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.books = 1
        if self.edges is None:
            if self.lo is None or self.step is None:
                raise ValueError("ZCodes needs either edges or lo and step")
            if self.lo.ndim == 2:
                self.lo, self.step = self.lo[None], self.step[None]
            # even steps as cells: code c's value ``lo + c * step``, every cell a step wide
            # (the float16 slack from the span's largest value)
            levels = np.arange(2**self.bits, dtype=np.float32)
            self._mids = self.lo[..., None] + levels * self.step[..., None]
            ends = np.maximum(np.abs(self.lo), np.abs(self._mids[..., -1]))  # [S, Hs, Dh]
            wide = (self.step + 2 * FLOAT16_ERROR * ends)[..., None]
            self._widths = np.repeat(wide, len(levels), axis=-1).astype(np.float32)
        else:
            edges = self.edges = np.asarray(self.edges, np.float32)
            if edges.ndim == 5:  # a book per group: table s * G + g
                self.books = edges.shape[1]
                if self.books > 1 and self.groups is None:
                    raise ValueError("ZCodes with a book of cells per group needs groups")
                edges = edges.reshape(-1, *edges.shape[2:])
            # each cell's midpoint and width, [tables, Hs, Dh, cells]; a direction (format 6)
            # is divided from float16 numbers by their float16 norm: twice their error
            self._mids = (edges[..., 1:] + edges[..., :-1]) / 2
            ends = np.maximum(np.abs(edges[..., 1:]), np.abs(edges[..., :-1]))
            slack = (4 if self.norm_edges is not None else 2) * FLOAT16_ERROR
            self._widths = edges[..., 1:] - edges[..., :-1] + slack * ends
        if (self.norm_codes is None) != (self.norm_edges is None):
            raise ValueError("ZCodes needs both norm_codes and norm_edges, or neither")
        if self.norm_edges is not None:  # each norm's cell: [tables, Hs, cells]
            ne = np.asarray(self.norm_edges, np.float32)
            ne = ne.reshape(-1, *ne.shape[-2:])
            self._norm_mids = (ne[..., 1:] + ne[..., :-1]) / 2
            self._norm_widths = ne[..., 1:] - ne[..., :-1] + 2 * FLOAT16_ERROR * ne[..., 1:]
        self.bounds = np.asarray(self.bounds, np.int64)

    @functools.cached_property
    def table_of(self) -> np.ndarray:
        """Each token's table of cells: ``span * G + group``, ``[N]`` int32."""
        n = self.tokens
        spans = np.repeat(np.arange(len(self.bounds), dtype=np.int32), np.diff([*self.bounds, n]))
        if self.books > 1:
            spans = spans * np.int32(self.books) + np.asarray(self.groups, np.int32)
        return spans

    @property
    def dims(self) -> int:
        """Numbers of one head's output (``Dh``)."""
        return int(self._mids.shape[-2])

    @property
    def tokens(self) -> int:
        return int(self.codes.shape[1])

    @staticmethod
    def quantise(z: torch.Tensor, bits: int = BITS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``z [Hs, n, Dh]`` as ``(codes [Hs, n, bytes], lo [Hs, Dh], step [Hs, Dh])`` against
        its own per-dimension ranges, ``2 ** bits`` even steps from minimum to maximum."""
        hs, n, dh = z.shape
        levels = 2**bits - 1
        if n == 0:
            empty = torch.zeros((hs, 0, dh), dtype=torch.uint8)
            return _pack(empty, bits), np.zeros((hs, dh), np.float32), np.ones((hs, dh), np.float32)
        z = z.float()
        lo = z.amin(1)
        step = ((z.amax(1) - lo) / levels).clamp_(min=1e-12)
        q = z.sub_(lo[:, None]).div_(step[:, None]).round_().clamp_(0, levels).to(torch.uint8)
        return _pack(q, bits), lo.numpy(), step.numpy()

    @staticmethod
    def quantise_cells(
        z: torch.Tensor,
        bits: int = BITS,
        power: float = POINT_DENSITY,
        groups: np.ndarray | None = None,
        books: int = 1,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``z [Hs, n, Dh]`` as ``(codes [Hs, n, bytes], edges [Hs, Dh, 2 ** bits + 1])``, or
        with ``groups [n]`` (each token's, below ``books``) ``edges [books, Hs, Dh, 2 ** bits +
        1]``, a book of cells for each group placed by its own numbers alone (a crowd such as
        every text's ``[CLS]``, nearly one point among all tokens, gets cells as fine as its
        own spread):
        ``2 ** bits`` cells per head and dimension, as many of them in a stretch of values as
        the ``power`` of the numbers' density there (1: cells of equal count, the quantiles;
        ``POINT_DENSITY``, 1/3: the least squared error, see there). The density is a
        histogram on a grid of ``GRID`` even steps from the minimum to the maximum (the ends),
        so counting replaces a sort: cell c starts after the first grid step where the sum of
        the steps' counts to the ``power`` reaches ``c / 2 ** bits`` of its whole. Each
        number's code is its cell ``c``, ``edges[c] <= x <= edges[c + 1]``; where many numbers
        share one grid step, cells are left empty (zero width, no number)."""
        values = z.cpu() if z.dtype in (torch.float16, torch.float32) else z.float().cpu()
        # a head to a core, read as stored (mhsa.atlas.kernels.cells_of)
        size = code_bytes(z.shape[2], bits)
        codes, edges = cells_of(values.numpy(), GRID, power, bits, size, groups, books)
        return codes, (edges[0] if groups is None else edges)

    @staticmethod
    def quantise_directions(
        z: torch.Tensor,
        bits: int = BITS,
        power: float = POINT_DENSITY,
        groups: np.ndarray | None = None,
        books: int = 1,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``z [Hs, n, Dh]`` as each head's direction at each token, ``z / ||z||``, coded as
        ``quantise_cells`` codes numbers, and its norm ``||z||`` coded the same way in
        ``NORM_BITS``: ``(codes, edges, norm_codes [ceil(Hs / 2), n], norm_edges [books, Hs, 2 **
        NORM_BITS + 1])`` (format 6; the norms two heads a byte, ``pack_norms``; without ``groups``,
        edges and norm edges without their books' axis). A direction's numbers are coded to the same
        share of their length at every norm, so a head's small outputs are told apart as finely as
        its large ones (a cosine over one head reads the direction alone); the norm-explicit
        quantization of Dai et al. 2020 ("Norm-Explicit Quantization: Improving Vector Quantization
        for Maximum Inner Product Search", AAAI), here for cosines."""
        values = z.cpu() if z.dtype in (torch.float16, torch.float32) else z.float().cpu()
        size = code_bytes(z.shape[2], bits)
        norms = np.empty(z.shape[:2], np.float32)
        codes, edges = cells_of(values.numpy(), GRID, power, bits, size, groups, books, norms)
        cells, norm_edges = cells_of(norms[..., None], GRID, power, NORM_BITS, 1, groups, books)
        norm_codes = pack_norms(cells[..., 0])
        norm_edges = norm_edges[..., 0, :]  # [books, Hs, 2 ** NORM_BITS + 1]
        if groups is None:
            return codes, edges[0], norm_codes, norm_edges[0]
        return codes, edges, norm_codes, norm_edges

    def _norm_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The norms' codes, midpoints and widths as the compiled loops read them (format
        6), or None."""
        if self.norm_codes is None:
            return None
        return self.norm_codes, self._norm_mids, self._norm_widths

    def _norm_cells(
        self, tokens: np.ndarray | slice, heads: list[int] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each of ``heads``' norm at ``tokens`` and its width: ``[Hs, n, 1]`` each."""
        where, chosen = self._where(tokens), self._heads(heads)
        # only the rows and tokens asked are read from the memory map
        byte = np.asarray(self.norm_codes)[np.ix_(chosen // 2, where)]  # [Hs, n]
        cell = (byte >> (4 * (chosen % 2))[:, None].astype(np.uint8)) & 15
        at = (self.table_of[where][None], chosen[:, None], cell)
        return self._norm_mids[at][..., None], self._norm_widths[at][..., None]

    def _where(self, tokens: np.ndarray | slice) -> np.ndarray:
        """``tokens`` (indices or a slice of the atlas's) as a flat int64 array of indices."""
        where = np.arange(self.tokens)[tokens] if isinstance(tokens, slice) else tokens
        return np.asarray(where, np.int64).reshape(-1)

    def _heads(self, heads: list[int] | None) -> np.ndarray:
        """``heads`` as an array (None: every head)."""
        return np.arange(self.codes.shape[0]) if heads is None else np.asarray(heads)

    def _spans(self, tokens: np.ndarray | slice) -> np.ndarray:
        """The table of cells of each of ``tokens`` (``table_of``)."""
        return self.table_of[self._where(tokens)].astype(np.int64)

    def _cells(
        self, tables: tuple[np.ndarray, ...], tokens: np.ndarray | slice, heads: list[int] | None
    ) -> list[np.ndarray]:
        """Each of ``tables`` (``[tables, Hs, Dh, cells]``, token t's at ``table_of[t]``:
        midpoints, widths) looked up at each code of ``heads`` at ``tokens``, read from the
        packed codes in one compiled pass (``mhsa.atlas.kernels.lookup``): ``[Hs, n, Dh]``
        float32 each."""
        where, chosen = self._where(tokens), self._heads(heads)
        stacked = tables[0][None] if len(tables) == 1 else np.stack(tables)
        out = lookup(self.codes, chosen, where, self._spans(where), stacked, self.bits)
        return list(out)

    def widths(self, tokens: np.ndarray | slice, heads: list[int] | None = None) -> np.ndarray:
        """How far apart the model's own value of each stored number may lie from the
        decoded one, at most: ``[Hs, n, Dh]``, twice the bound (a number lies within half its
        width of its decoded value). Formats 4 to 6: its cell's width; before, its span's
        step. Each widened by ``FLOAT16_ERROR`` of the value on each side (the build codes
        float16). Format 6 (a direction ``u`` of width ``w`` times a norm ``s`` of width
        ``v``): ``|u| v + s w + v w / 2``, twice the product's error at its largest (``|u| v /
        2 + s w / 2 + (w / 2)(v / 2)``)."""
        if self.norm_codes is None:  # the widths' table alone
            return self._cells((self._widths,), tokens, heads)[0]
        return self.decode_with_widths(tokens, heads)[1]

    def decode(self, tokens: np.ndarray | slice, heads: list[int] | None = None) -> np.ndarray:
        """The stored values of ``heads`` (None: all) at ``tokens``: ``[Hs, n, Dh]`` float32."""
        values = self._cells((self._mids,), tokens, heads)[0]
        if self.norm_codes is not None:
            values *= self._norm_cells(tokens, heads)[0]
        return values

    def decode_with_widths(
        self, tokens: np.ndarray | slice, heads: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``decode`` and ``widths`` at once, the codes unpacked once."""
        values, widths = self._cells((self._mids, self._widths), tokens, heads)
        if self.norm_codes is not None:
            norm, spread = self._norm_cells(tokens, heads)
            widths = np.abs(values) * spread + norm * widths + widths * spread / 2
            values = values * norm
        return values, widths

    def cosines(
        self, query: np.ndarray, tokens: np.ndarray | None = None, heads: list[int] | None = None
    ) -> np.ndarray:
        """The cosine of ``heads``' values (None: all, concatenated) at ``tokens`` (None:
        every token) with the unit vector ``query``, in one compiled scan of the codes that
        decodes nothing (``mhsa.atlas.kernels.cosines``): ``[n]`` float32, ``rows(tokens,
        heads) @ query``."""
        chosen = self._heads(heads)
        return cosines(
            self.codes, chosen, self.table_of, self._mids, query, self.bits, tokens,
            self._norm_tables(),
        )  # fmt: skip

    def cosine_bounds(
        self,
        query: np.ndarray,
        tokens: np.ndarray,
        heads: list[int] | None,
        margin: float,
        curvature: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``cosines(query, tokens, heads)`` and, for each token, how far above its coded
        cosine its true one may lie by its own cells' widths (``mhsa.atlas.exact.cosine_bound``
        over ``decode_with_widths``, in one compiled pass that decodes nothing)."""
        chosen = self._heads(heads)
        tables = (self._mids, self._widths)
        return cosine_bounds(
            self.codes, chosen, self.table_of, tables, query, self.bits, tokens, margin, curvature,
            self._norm_tables(),
        )  # fmt: skip

    def rows(self, tokens: np.ndarray | slice, heads: list[int] | None = None) -> np.ndarray:
        """Unit-length concatenations of ``heads``' values at ``tokens``: ``[n, Hs Dh]``."""
        z = self.decode(tokens, heads)
        rows = np.ascontiguousarray(z.transpose(1, 0, 2)).reshape(z.shape[1], -1)
        return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def build_index(projections: Any, tokens: int, dims: int, folder: Path) -> dict[str, Any]:
    """The all-heads index into ``folder/index.faiss`` when the atlas has more than
    ``EXACT_UP_TO`` tokens, from its projections (an iterable of ``[n, PROJECTION_DIMS]``
    arrays in token order); returns its description for the manifest."""
    if tokens <= EXACT_UP_TO:
        return {"kind": "exact", "lists": 0, "dims": dims}
    import faiss

    index = faiss.IndexScalarQuantizer(
        PROJECTION_DIMS, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
    )
    for chunk in projections:
        index.add(np.ascontiguousarray(chunk, np.float32))
    assert index.ntotal == tokens, (index.ntotal, tokens)
    faiss.write_index(index, str(folder / "index.faiss"))
    return {
        "kind": "projection",
        "dims": dims,
        "projection_dims": PROJECTION_DIMS,
        "seed": PROJECTION_SEED,
    }


def search_index(
    index: Any,
    z: ZCodes,
    query: np.ndarray,
    k: int,
    token: int,
    probes: int = PROBES,
    pool: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest tokens to ``token``, whose unit vector over all heads is ``query``:
    ``(tokens, similarities)``, candidates of the approximate index (its projection of
    ``token``, or a format-1 IVF-PQ index searched with ``query``; ``pool`` of them, None:
    ``k * RERANK``) re-ranked on the stored values."""
    cand = index_candidates(index, query, token, pool or k * RERANK, probes)
    sims = z.cosines(query, cand)
    order = np.lexsort((cand, -sims))[:k]
    return cand[order], sims[order]


def index_candidates(
    index: Any, query: np.ndarray, token: int, pool: int, probes: int = PROBES
) -> np.ndarray:
    """The ``pool`` tokens the approximate index puts nearest ``token`` (its projection of
    ``token``; a format-1 IVF-PQ index: searched with the unit vector ``query``), sorted; the
    token itself is usually among them, but nothing guarantees it (callers leave it out)."""
    if hasattr(index, "nprobe"):  # format 1: IVF-PQ over the values themselves
        index.nprobe = probes
        probe = query
    else:
        probe = index.reconstruct(int(token))
    _, cand = index.search(probe[None].astype(np.float32), pool)
    return np.unique(cand[0][cand[0] >= 0])


def exact_neighbours(
    z: ZCodes, heads: list[int] | None, query: np.ndarray, k: int | None, exclude: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exhaustive cosine search over ``heads``' stored values (None: all): ``(tokens,
    similarities)`` of the ``k`` nearest (None: all), ``exclude`` left out, ties by token."""
    sims = z.cosines(query, heads=heads)
    sims[exclude] = -np.inf
    found = np.flatnonzero(np.isfinite(sims))
    if k is not None and k < len(found):
        edge = -np.partition(-sims[found], k - 1)[k - 1]
        found = found[sims[found] >= edge]  # ties at the edge kept: the order decides
    order = found[np.lexsort((found, -sims[found]))][:k]
    return order, sims[order]

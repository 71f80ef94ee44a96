"""What the head analyses (``mhsa.analysis.stats``, ``mhsa.analysis.similarity``) share: their
input, one result or
a corpus of results from one model, as a list; and work in blocks that stay in a CPU's cache."""

from __future__ import annotations

from collections.abc import Iterable

from mhsa.engine.result import AttentionResult

__all__ = ["BLOCK_ELEMS", "as_results", "rows_per_block"]

#: floats of one block of temporaries (2**20 float32: about a CPU's L2/L3, and reused from call
#: to call rather than fresh memory, page faults, every time)
BLOCK_ELEMS = 2**20


def as_results(results: AttentionResult | Iterable[AttentionResult]) -> list[AttentionResult]:
    """``results`` (one result, or a corpus of them) as a list, checked: at least one result,
    all from models with the same layers x heads."""
    items = [results] if isinstance(results, AttentionResult) else list(results)
    if not items:
        raise ValueError("No results given: pass at least one AttentionResult.")
    shapes = {r.attention.shape[:2] for r in items}
    if len(shapes) > 1:
        raise ValueError(f"Results come from models with different layers x heads: {shapes}")
    return items


def rows_per_block(row_elems: int) -> int:
    """Rows of ``row_elems`` floats that make one block of temporaries (``BLOCK_ELEMS``)."""
    return max(1, BLOCK_ELEMS // max(row_elems, 1))

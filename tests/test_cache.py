"""The shared result cache: bounded in bytes, least recently used first, read-only, no copies."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from mhsa.engine.cache import ResultCache, result_nbytes, value_nbytes
from tests.test_stats import _result


def _sized(n: int, value: float = 0.5) -> object:
    return _result(np.full((2, 3, n, n), value, dtype=np.float32))


def test_bounded_in_bytes_least_recently_used_first() -> None:
    one = result_nbytes(_sized(10))
    assert one == 2 * 3 * 10 * 10 * 4
    cache = ResultCache(3 * one)
    for key in "abc":
        cache.put(key, _sized(10))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("d", _sized(10))  # evicts b, the least recently used
    assert "b" not in cache and all(k in cache for k in "acd")
    assert cache.nbytes == 3 * one <= cache.max_bytes
    big = cache.put("e", _sized(20))  # 4x one: larger than the whole budget
    assert big is not None and "e" not in cache and len(cache) == 3
    cache.put("f", _sized(17))  # 2.89x one: everything else goes
    assert list(cache._items) == ["f"] and cache.nbytes == result_nbytes(_sized(17))


def test_shared_object_is_read_only_and_computed_once() -> None:
    cache = ResultCache(10**6)
    calls = []

    def compute():
        calls.append(1)
        return _sized(8)

    first = cache.get_or_compute("k", compute)
    again = cache.get_or_compute("k", compute)
    assert first is again and len(calls) == 1
    with pytest.raises(ValueError, match="read-only"):
        first.attention[0, 0, 0, 0] = 1.0
    with pytest.raises(ValueError, match="max_bytes"):
        ResultCache(-1)


def test_analyses_made_of_tables_and_arrays_count_their_bytes() -> None:
    """A page's analysis (a dataclass of a table and a dict of arrays, a tuple of tables) counts
    what it holds, so the cache's bound covers it."""

    @dataclasses.dataclass(frozen=True)
    class Analysis:
        scores: pd.DataFrame
        patterns: dict[str, np.ndarray]

    table = pd.DataFrame({"score": np.zeros(72)})
    table_bytes = int(table.memory_usage(deep=True).sum())
    patterns = {"a": np.zeros((9, 9)), "b": np.zeros((9, 9), dtype=np.float32)}
    assert value_nbytes(Analysis(table, patterns)) == table_bytes + 81 * 8 + 81 * 4
    assert value_nbytes((table, table)) == 2 * table_bytes
    result = _sized(10)
    assert value_nbytes((result, np.zeros(5))) == result_nbytes(result) + 40


def test_a_series_counts_its_bytes() -> None:
    """A Series (per-head scores) is a table too: its ``memory_usage`` is one number."""
    series = pd.Series(np.zeros(12), index=[f"L0H{h}" for h in range(12)])
    index_bytes = sum(len(f"L0H{h}") for h in range(12))
    assert value_nbytes(series) >= 12 * 8 + index_bytes
    assert value_nbytes(series) == int(series.memory_usage(index=True, deep=True))

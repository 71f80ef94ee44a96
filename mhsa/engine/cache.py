"""A process-wide cache of read-only attention results (and the analyses derived from them),
bounded in bytes (no web framework here: the app shares one instance between all browser
sessions)."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import torch

from mhsa.engine.result import ARRAY_FIELDS, AttentionResult

__all__ = ["ResultCache", "result_nbytes", "value_nbytes"]

T = TypeVar("T")


def result_nbytes(result: AttentionResult) -> int:
    """Bytes held by a result's arrays (tokens and other metadata are small beside them)."""
    return sum(a.nbytes for a in (getattr(result, k) for k in ARRAY_FIELDS) if a is not None)


def _results_in(value: Any) -> list[AttentionResult]:
    """The attention results a cached value holds (itself, or an ``Ablation``'s two)."""
    if isinstance(value, AttentionResult):
        return [value]
    return [getattr(value, k) for k in ("intact", "ablated") if hasattr(value, k)]


def value_nbytes(value: Any) -> int:
    """Bytes a cached value holds: a result's arrays, an ``Ablation``'s two results, a table,
    an array or tensor, and what tuples, dicts and other dataclasses of these hold."""
    if isinstance(value, pd.DataFrame | pd.Series):
        return int(np.sum(value.memory_usage(deep=True)))  # a Series gives an int
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, torch.Tensor):  # a decomposition's parts (``qk_attribution``'s)
        return value.numel() * value.element_size()
    if isinstance(value, tuple | list):  # several tables of one job, or a page's arrays
        return sum(value_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(value_nbytes(v) for v in value.values())
    results = _results_in(value)
    if not results and dataclasses.is_dataclass(value):  # an analysis made of tables and arrays
        return sum(value_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return sum(result_nbytes(r) for r in results)


def _freeze(value: T) -> T:
    """Make the arrays read-only: one object is shared by every reader, none may change it."""
    for result in _results_in(value):
        for key in ARRAY_FIELDS:
            array = getattr(result, key)
            if isinstance(array, np.ndarray):
                array.flags.writeable = False
    return value


class ResultCache:
    """Least-recently-used results (and analyses: ablations, tables), at most ``max_bytes`` in
    all, shared read-only.

    ``get_or_compute`` returns the very object it keeps (no copy per reader). A result larger
    than the whole budget is returned but not kept. Safe to call from several threads; two
    threads asking for the same missing key may both compute it (the first one kept wins).
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be at least 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def get(self, key: Hashable) -> Any:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, result: T) -> T:
        size = value_nbytes(_freeze(result))
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
            if size > self.max_bytes:
                return result
            while self._items and self.nbytes + size > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self.nbytes -= dropped
            self._items[key] = (result, size)
            self.nbytes += size
            return result

    def get_or_compute(self, key: Hashable, compute: Callable[[], T]) -> T:
        hit = self.get(key)
        return hit if hit is not None else self.put(key, compute())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0

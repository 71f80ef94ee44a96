"""A process-wide cache of read-only attention results, bounded in bytes (no web framework here:
the app shares one instance between all browser sessions)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

from mhsa.result import AttentionResult

__all__ = ["ResultCache", "result_nbytes"]

_ARRAYS = ("attention", "cross_attention", "decoder_attention")


def result_nbytes(result: AttentionResult) -> int:
    """Bytes held by a result's arrays (tokens and other metadata are small beside them)."""
    return sum(a.nbytes for a in (getattr(result, k) for k in _ARRAYS) if a is not None)


def _freeze(result: AttentionResult) -> AttentionResult:
    """Make the arrays read-only: one object is shared by every reader, none may change it."""
    for key in _ARRAYS:
        array = getattr(result, key)
        if isinstance(array, np.ndarray):
            array.flags.writeable = False
    return result


class ResultCache:
    """Least-recently-used results, at most ``max_bytes`` of arrays in all, shared read-only.

    ``get_or_compute`` returns the very object it keeps (no copy per reader). A result larger
    than the whole budget is returned but not kept. Safe to call from several threads; two
    threads asking for the same missing key may both compute it (the first one kept wins).
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be at least 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[AttentionResult, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def get(self, key: Hashable) -> AttentionResult | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, result: AttentionResult) -> AttentionResult:
        size = result_nbytes(_freeze(result))
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

    def get_or_compute(
        self, key: Hashable, compute: Callable[[], AttentionResult]
    ) -> AttentionResult:
        hit = self.get(key)
        return hit if hit is not None else self.put(key, compute())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0

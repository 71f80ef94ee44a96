"""The server process's runtime: how many cores a page's own work runs on, the garbage
collector's schedule, and the slow imports warmed in the background."""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import threading

from threadpoolctl import ThreadpoolController

import mhsa

__all__ = [
    "GC_EVERY_RUNS",
    "collect_now_and_then",
    "freeze_long_lived_objects",
    "page_work",
    "release_freed_memory",
]

_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
_THREADS = ThreadpoolController()


def page_work():
    """Run the calling thread's next computations, those a page waits for while the browser
    draws it, on one core fewer than the machine has: the browser (on a machine of one's own it
    shares the CPUs) and Streamlit's event loop, which sends the page's first elements
    meanwhile, keep one. On a small machine a team of threads whose last member is pre-empted
    waits at every barrier, which costs more than the thread brings (BENCHMARKS.md). OpenMP's
    limit is per thread: other sessions and long computations (head importance) keep every
    thread."""
    threads = max(1, min(mhsa.engine.cpu_threads(), _CPUS - 1))
    return _THREADS.limit(limits=threads, user_api="openmp")


def _warm_imports() -> None:
    """Import scikit-learn's MDS, slow to import, once per process in the background, so that
    the first visit to Head similarity does not wait for it (``mhsa.analysis.head_map`` imports it
    lazily, which keeps the CLI and ``import mhsa`` light)."""
    import sklearn.manifold  # noqa: F401


threading.Thread(target=_warm_imports, name="mhsa-warm-imports", daemon=True).start()

_freeze_once = threading.Lock()


def freeze_long_lived_objects() -> None:
    """Move every object alive now (torch, transformers, the first model) out of the garbage
    collector's reach, once per process: a full collection then visits only what the sessions
    made since, which keeps memory level at little cost per run (BENCHMARKS.md §8)."""
    if _freeze_once.acquire(blocking=False):
        gc.collect()
        gc.freeze()


#: a full garbage collection every this many page runs, process-wide (``collect_now_and_then``)
GC_EVERY_RUNS = 16
_page_runs = itertools.count(1)


def collect_now_and_then() -> None:
    """A full garbage collection at the end of every ``GC_EVERY_RUNS``-th page run of the
    process, instead of Streamlit's after every run (``runner.postScriptGC``, off): with the
    long-lived objects frozen it visits only what sessions made since, and cyclic garbage
    (figures, results) is freed within a few runs rather than whenever Python's own thresholds
    get to it. Then the freed heap pages go back to the system (``release_freed_memory``)."""
    if next(_page_runs) % GC_EVERY_RUNS == 0:
        gc.collect()
        release_freed_memory()


def _libc_malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to call
        return None


_MALLOC_TRIM = _libc_malloc_trim()


def release_freed_memory() -> bool:
    """glibc's ``malloc_trim(0)``: hand the heap pages that freed objects left back to the
    system. glibc keeps them otherwise, in every arena, so that a server's resident memory
    climbs with its visitors' churn though nothing is alive in it (the many-sessions load test:
    about 24 MB over 20 rounds, all but 5 MB of it given back by one trim; BENCHMARKS.md §8).
    False where there is no glibc."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True

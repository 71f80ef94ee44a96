"""Timing helpers shared by the benchmarks: interleaved medians, with warm-up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_times(
    fns: dict[str, Callable[[], object]],
    *,
    repeat: int = 21,
    warmup: int = 2,
    sync: Callable[[], None] | None = None,
    budget_s: float = 20.0,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds of each function by ``clock`` (wall time by default; ``time.process_time``
    counts this process's CPU time only, steadier on a CPU shared with others), called in turn
    round after round.

    Interleaving puts every candidate under the same machine state (frequency, other load), so
    their ratios are much steadier than timing one after the other. Fewer rounds (at least 5)
    when the whole comparison would exceed ``budget_s``.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    if sync:
        sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    start_all = time.perf_counter()
    for round_ in range(repeat):
        for name, fn in fns.items():
            start = clock()
            fn()
            if sync:
                sync()
            times[name].append(clock() - start)
        if round_ >= 4 and time.perf_counter() - start_all > budget_s:
            break
    return {name: statistics.median(t) for name, t in times.items()}


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A Markdown table, ready to paste into BENCHMARKS.md."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = [f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        print("| " + " | ".join(cells) + " |")


def engine_row(family: str, seconds: dict[str, float], **extra: object) -> dict:
    """A table row of one family's median seconds per engine (``seconds["transformers"]``,
    ``seconds["mhsa"]``): milliseconds of each and their ratio, ``extra`` columns after the
    family's name."""
    return {
        "family": family,
        **extra,
        "transformers ms": seconds["transformers"] * 1e3,
        "mhsa ms": seconds["mhsa"] * 1e3,
        "mhsa/transformers": seconds["mhsa"] / seconds["transformers"],
    }

"""Pruning curves: heads switched off cumulatively in order of importance, against a seeded random
order (the shape of Michel et al. 2019's pruning figure; see ``mhsa.causal.importance``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from mhsa.causal.importance import Progress, as_entries, head_importance, pair_target, resolve_model
from mhsa.causal.targets import Head, Measure, TargetSpec, gates_rows, prepare
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel
from mhsa.engine.runs.batches import Entry
from mhsa.errors import InputError

__all__ = ["ORDERS", "pruning_curve"]

#: the orders heads are pruned in besides the random baseline
ORDERS = ("importance", "reverse")
#: most points on a curve
MAX_STEPS = 10_000


class _Step(NamedTuple):
    """One point of a curve: the order it follows and the heads switched off there."""

    order: str
    count: int
    pruned: tuple[Head, ...]


def pruning_curve(
    texts: str | Iterable[object],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    order: str = "importance",
    target: str | None = None,
    seed: int = 0,
    steps: int = 10,
    method: str = "ablation",
    importance: pd.DataFrame | None = None,
    max_tokens: int | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Heads removed step by step, with a seeded random order as the baseline (the shape of
    Michel et al.'s pruning figure).

    The importance order is computed once, before pruning (``head_importance`` with ``method``
    over the same texts, or ``importance`` when given) and not recomputed after each step.

    Args:
        order: ``"importance"``: least important heads first (Michel et al.); ``"reverse"``:
            most important first.
        seed: of the random baseline's order (``numpy.random.default_rng``).
        steps: the curve's points are ``0, 1/steps, ..., 1`` of the heads (rounded to whole
            heads); ``steps`` = number of heads gives every head.

    Returns:
        Columns ``order`` (``order``'s value or ``"random"``), ``fraction_pruned``,
        ``heads_pruned``, ``metric`` (mean over texts: for ``embedding`` the change from the
        intact embedding, else the target's value: loss or similarity) and ``pruned`` (the
        heads off at that step, ``L{l}H{h}`` comma-separated).
    """
    if order not in ORDERS:
        raise InputError(f"Unknown order {order!r}: choose 'importance' or 'reverse'.")
    if not 1 <= steps <= MAX_STEPS:
        raise InputError("steps must be between 1 and 10000.")
    lm = resolve_model(model)
    entries = as_entries(texts)
    spec = pair_target(lm, entries, target)
    before = 0  # progress: the importance pass counts as much as the pruning pass
    if importance is None:
        before = len(entries)
        importance = head_importance(
            entries,
            model=lm,
            method=method,
            target=spec.name,
            max_tokens=max_tokens,
            batch_size=batch_size,
            progress=(lambda d, t: progress(d * before // t, 2 * before)) if progress else None,
        )
    heads = _importance_order(importance, order)
    plan = _steps(heads, order, seed, steps)

    def report(done: int) -> None:
        if progress is not None:
            progress(before + done, before + len(entries))

    sums, names = _summed_values(lm, spec, entries, plan, max_tokens, batch_size, report)
    frame = _curve(plan, sums / len(entries), len(heads), names)
    frame.attrs.update(target=spec.name, seed=seed, texts=len(entries), recomputed=False)
    return frame


def _curve(
    plan: Sequence[_Step], metric: np.ndarray, total: int, names: Sequence[str]
) -> pd.DataFrame:
    """The curve's table: one row per step (see ``pruning_curve``); ``names``: how labels name
    each block (``Measure.names``)."""
    return pd.DataFrame(
        {
            "order": [s.order for s in plan],
            "fraction_pruned": [s.count / total for s in plan],
            "heads_pruned": [s.count for s in plan],
            "metric": metric,
            "pruned": [",".join(f"{names[a]}H{b}" for a, b in s.pruned) for s in plan],
        }
    )


def _importance_order(importance: pd.DataFrame, order: str) -> list[Head]:
    """Every head, least important first (``reverse``: most important first); ties by place."""
    ranked = importance.sort_values(["importance", "layer", "head"], kind="stable")
    heads = [(int(r.layer), int(r.head)) for r in ranked.itertuples()]
    return heads[::-1] if order == "reverse" else heads


def _steps(heads: list[Head], order: str, seed: int, steps: int) -> list[_Step]:
    """The curve's points in ``order``, then the same counts in the seeded random order."""
    base = sorted(heads)  # the random order depends on the seed alone, not on importance
    shuffled = [base[i] for i in np.random.default_rng(seed).permutation(len(base))]
    total = len(heads)
    counts = sorted({round(f * total) for f in np.linspace(0.0, 1.0, steps + 1)})
    orders = ((order, heads), ("random", shuffled))
    return [_Step(name, k, tuple(seq[:k])) for name, seq in orders for k in counts]


def _summed_values(
    lm: LoadedModel,
    spec: TargetSpec,
    entries: Sequence[Entry],
    plan: Sequence[_Step],
    max_tokens: int | None,
    batch_size: int,
    report: Callable[[int], None],
) -> tuple[np.ndarray, list[str]]:
    """Per step, the target's value summed over the entries; the steps of one entry run side by
    side, ``batch_size`` at a time. ``report(done)`` after each entry. Also how labels name
    the blocks."""
    sums = np.zeros(len(plan))
    names: list[str] = []
    for done, entry in enumerate(entries, start=1):
        with lm.lock, torch.inference_mode():
            measure = Measure(lm, spec)
            names = measure.names
            item = prepare(lm, entry, spec, max_tokens)
            intact = measure.raw(item, {})
            for start in range(0, len(plan), batch_size):
                chunk = [s.pruned for s in plan[start : start + batch_size]]
                gates = gates_rows(chunk, measure.layers, measure.heads, lm.device)
                raw = measure.raw(item, gates, rows=len(chunk), layer=0)
                value = measure.value(raw, intact).double().cpu().numpy()
                sums[start : start + len(chunk)] += value
        report(done)
    return sums, names

"""Capacity held: the work each rerun of each page does, counted, against a baseline file.

A rerun is what every widget change and every other session's visit costs the server. Once a
page has drawn (its results in the process's shared cache), a rerun of it with nothing changed
is counted: model forward passes (every call of a transformers model's top module), figures
built (plotly ``Figure`` objects made), shared-cache misses (``ResultCache.put``) and the bytes
of what it sends to the browser (the serialized elements of the page). A feature that adds work
to every rerun fails here instead of in a benchmark nobody reruns; a change that lowers the
counts rewrites the baseline with ``MHSA_UPDATE_RERUN_BASELINE=1`` (say why in the commit).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import plotly.basedatatypes
import pytest
import torch
from streamlit.testing.v1 import AppTest

from mhsa.engine.cache import ResultCache
from ui import navigation

ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).with_name("rerun_work.json")
PAGES = sorted(page.file for page in navigation.PAGES)
#: bytes vary a little with timings shown on the page (milliseconds, seconds)
BYTES_SLACK = 1.05

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def counting():
    """Counters of forward passes, figures built and cache misses while the block runs."""
    from transformers import PreTrainedModel

    counts = {"forward passes": 0, "figures built": 0, "cache misses": 0}

    def on_forward(module, _args, _output):
        if isinstance(module, PreTrainedModel):
            counts["forward passes"] += 1

    figure_init = plotly.basedatatypes.BaseFigure.__init__
    put = ResultCache.put

    def counted_init(self, *args, **kwargs):
        counts["figures built"] += 1
        figure_init(self, *args, **kwargs)

    def counted_put(self, key, result):
        counts["cache misses"] += 1
        return put(self, key, result)

    handle = torch.nn.modules.module.register_module_forward_hook(on_forward)
    plotly.basedatatypes.BaseFigure.__init__ = counted_init
    ResultCache.put = counted_put
    try:
        yield counts
    finally:
        handle.remove()
        plotly.basedatatypes.BaseFigure.__init__ = figure_init
        ResultCache.put = put


def sent_bytes(node) -> int:
    """Serialized size of every element under ``node`` of an AppTest tree."""
    total = 0
    proto = getattr(node, "proto", None)
    if proto is not None and hasattr(proto, "ByteSize"):
        total += proto.ByteSize()
    children = getattr(node, "children", None)
    if isinstance(children, dict):
        total += sum(sent_bytes(child) for child in children.values())
    return total


def rerun_work(page: str) -> dict[str, int]:
    at = AppTest.from_file(str(ROOT / page), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    with counting() as counts:
        at.run()  # the rerun: nothing changed
    assert not at.exception, [e.value for e in at.exception]
    return {**counts, "bytes sent": sent_bytes(at._tree)}


def test_every_rerun_does_no_more_work_than_the_baseline() -> None:
    measured = {page: rerun_work(page) for page in PAGES}
    if os.environ.get("MHSA_UPDATE_RERUN_BASELINE"):
        BASELINE.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    baseline = json.loads(BASELINE.read_text())
    assert sorted(baseline) == PAGES, "a page without a baseline: rerun with the update flag"
    over = {}
    for page, counts in measured.items():
        for what, value in counts.items():
            allowed = baseline[page][what] * (BYTES_SLACK if what == "bytes sent" else 1)
            if value > allowed:
                over[f"{page}: {what}"] = (baseline[page][what], value)
    assert not over, f"more work per rerun than the baseline (was, now): {over}"
    # a rerun with nothing changed computes nothing: the shared cache holds every result
    assert all(c["forward passes"] == 0 and c["cache misses"] == 0 for c in measured.values())


def test_the_counters_count() -> None:
    """The counters see a forward pass, a figure and a cache miss when there is one."""
    import mhsa
    from mhsa import plots
    from ui import core

    with counting() as counts:
        result = mhsa.attend("Counters count this sentence.", model="default")
        plots.head_heatmap(result, 0, 0)
        core.result_cache().put(("counted", id(counts)), result)
    assert counts["forward passes"] >= 1 and counts["figures built"] >= 1
    assert counts["cache misses"] == 1

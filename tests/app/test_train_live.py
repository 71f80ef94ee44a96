"""The Train heads page while it trains (issue 38.3): the live figures are rebuilt at most every
``REDRAW_SECONDS`` and only for new snapshots, from a thinned history; the trainer keeps one
core fewer than the machine has; the progress line shows the rate and the time left, and a
queued run its expected wait."""

from __future__ import annotations

import itertools
import os
import re
import threading
import time

import pytest

import mhsa
from mhsa.corpus.jobs import JobState
from mhsa.engine.models.trained import trained_store
from mhsa.training import TrainConfig, TrainSnapshot
from tests.app.test_train_page import RUN, SHORT, button, open_page
from ui import core, training


def test_thin_keeps_the_ends_and_spreads_the_rest_evenly() -> None:
    assert training.thin(9, 3) == [0, 4, 8]
    assert training.thin(10, 4) == [0, 3, 6, 9]
    assert training.thin(5, 25) == [0, 1, 2, 3, 4]  # fewer than kept: all
    kept = training.thin(41, 25)
    assert len(kept) == 25 and kept[0] == 0 and kept[-1] == 40
    assert {b - a for a, b in itertools.pairwise(kept)} <= {1, 2}
    with pytest.raises(ValueError, match="at least 2"):
        training.thin(10, 1)


def snapshot(step: int) -> TrainSnapshot:
    return TrainSnapshot(step, 1.0, 0.0, 0.0, [], None, None, None)  # only the step is read


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_live_figures_are_rebuilt_only_for_new_snapshots_and_not_within_the_interval(
    monkeypatch,
) -> None:
    built: list[list[int]] = []

    def figures(run, snapshots):  # records which snapshots each build drew
        built.append([s.step for s in snapshots])
        return {"build": len(built)}

    monkeypatch.setattr(training, "figures", figures)
    run = training.TrainingRun(training.DEFAULTS, 25)
    clock = Clock()
    live = training.LiveFigures(run, interval=2.0, points=5, clock=clock)
    assert live.get() == {} and live.builds == 0  # no snapshot yet: nothing to draw
    run.snapshots.extend(snapshot(25 * i) for i in range(3))
    assert live.get() == {"build": 1} and built[-1] == [0, 25, 50]
    run.snapshots.append(snapshot(75))
    clock.now += 1.5  # a new snapshot, but within the interval: the last build again
    assert live.get() == {"build": 1} and live.builds == 1
    clock.now += 0.6
    assert live.get() == {"build": 2} and built[-1] == [0, 25, 50, 75]
    clock.now += 10  # nothing new: no build however long it has been
    assert live.get() == {"build": 2} and live.builds == 2
    run.snapshots.extend(snapshot(25 * i) for i in range(4, 41))  # 41 snapshots, 5 drawn
    assert live.get() == {"build": 3}
    assert built[-1] == [0, 250, 500, 750, 1000]


def test_the_trainer_computes_on_one_core_fewer_than_the_machine_has(monkeypatch) -> None:
    seen: list[int] = []
    real = training.train

    def recording(config, **kwargs):
        seen.append(mhsa.engine.cpu_threads())  # in the job's thread, as the trainer computes
        return real(config, **kwargs)

    monkeypatch.setattr(training, "train", recording)
    before = mhsa.engine.cpu_threads()
    run = training.start(TrainConfig(layers=1, heads=2, width=16, steps=2, batch=4, warmup=1))
    assert run.job.wait(120) and run.state is JobState.DONE, run.job.error
    cpus = len(os.sched_getaffinity(0))
    assert seen == [max(1, min(before, cpus - 1))]
    if cpus == before == 2:  # CI's 2 cores: the browser and Streamlit keep one
        assert seen == [1]
    assert mhsa.engine.cpu_threads() == before  # this thread keeps every core


def test_durations_are_said_in_minutes_and_seconds() -> None:
    assert training.duration_text(0.3) == "under a second"
    assert training.duration_text(42.4) == "about 42 s"
    assert training.duration_text(130) == "about 2 min 10 s"
    assert training.duration_text(120) == "about 2 min"


@pytest.fixture(autouse=True)
def _empty_store():
    yield
    trained_store().clear()


def test_a_running_run_shows_its_rate_and_time_left() -> None:
    at = open_page(**(SHORT | {"steps": "3000"}))
    button(at, "Train").click().run()
    run = at.session_state[RUN]
    try:
        deadline = time.monotonic() + 60
        while run.steps_done < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        at.run()
        text = at.get("progress")[0].proto.text
        line = r"step (\d+) of 3000 · ([\d.]+) steps/s · about (?:(\d+) min )?(\d+) s"
        found = re.search(line, text)
        assert found, text
        done, rate = int(found.group(1)), float(found.group(2))
        left = 60 * int(found.group(3) or 0) + int(found.group(4))
        assert done >= 5 and rate > 0
        # the time left is the steps to go at the rate shown (read a moment apart: 10%)
        assert left == pytest.approx((3000 - done) / rate, rel=0.1, abs=2)
    finally:
        run.cancel()
        assert run.job.wait(60)


def test_a_queued_run_shows_its_expected_wait(monkeypatch) -> None:
    monkeypatch.setenv("MHSA_MAX_HEAVY", "1")
    core.heavy_queue.cache_clear()
    queue = core.heavy_queue()
    release, reported = threading.Event(), threading.Event()

    def paced(progress):  # 50 steps of 100 done: as many seconds left as it has run
        progress(50, 100)
        reported.set()
        release.wait(600)

    holder = queue.submit(("test", "paced"), paced, "another student's job")
    try:
        assert reported.wait(5)
        at = open_page(**SHORT)
        before = time.monotonic()
        holder.started = before - 50.0  # 50 steps in 50 s: 50 s left now
        button(at, "Train").click().run()
        took = time.monotonic() - before
        assert not at.exception
        run = at.session_state[RUN]
        assert run.state is JobState.WAITING
        captions = " ".join(c.value for c in at.caption)
        found = re.search(r"Expected wait: about (?:(\d+) min)? ?(?:(\d+) s)?,", captions)
        assert found and any(found.groups()), captions
        wait = 60 * int(found.group(1) or 0) + int(found.group(2) or 0)
        assert 50 <= wait <= 50 + took + 1  # and the seconds the page took
        button(at, "Cancel").click().run()
    finally:
        release.set()
        holder.wait(10)
        core.heavy_queue.cache_clear()

"""The per-process queue of heavy jobs (``mhsa.corpus.jobs``): its limit, order, cancelling,
failures,
shared jobs, and the ``MHSA_MAX_HEAVY`` setting."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mhsa.corpus.jobs import JobCancelled, JobQueue, JobState, max_heavy_from_env, seconds_left

ROOT = Path(__file__).resolve().parents[1]


def blocker(release: threading.Event, started: threading.Event | None = None):
    def run(progress):
        if started:
            started.set()
        while not release.wait(0.01):
            progress(0, 1)  # reports, so that a cancel can stop it
        return "released"

    return run


def test_with_a_limit_of_one_a_second_job_waits_until_the_first_finishes() -> None:
    queue = JobQueue(1)
    release, started = threading.Event(), threading.Event()
    first = queue.submit("a", blocker(release, started))
    assert started.wait(5)
    second = queue.submit("b", lambda progress: 42)
    third = queue.submit("c", lambda progress: 43)
    assert (first.state, second.state, third.state) == (
        JobState.RUNNING,
        JobState.WAITING,
        JobState.WAITING,
    )
    assert not second.wait(0.2)
    assert (queue.ahead(second), queue.ahead(third)) == (1, 2)
    assert queue.counts() == (1, 2)
    release.set()
    assert first.wait(5) and second.wait(5) and third.wait(5)
    assert (first.result, second.result, third.result) == ("released", 42, 43)
    assert queue.counts() == (0, 0)


def test_two_slots_run_two_jobs_at_once() -> None:
    queue = JobQueue(2)
    release = threading.Event()
    started = [threading.Event(), threading.Event()]
    jobs = [queue.submit(i, blocker(release, started[i])) for i in range(2)]
    assert all(s.wait(5) for s in started)  # both run before either is released
    assert queue.counts() == (2, 0)
    release.set()
    assert all(j.wait(5) for j in jobs)


def test_cancel_removes_a_waiting_job_and_the_next_one_moves_up() -> None:
    queue = JobQueue(1)
    release = threading.Event()
    queue.submit("a", blocker(release))
    ran: list[str] = []
    second = queue.submit("b", lambda progress: ran.append("b"))
    third = queue.submit("c", lambda progress: ran.append("c"))
    assert queue.ahead(third) == 2
    queue.cancel(second)
    assert second.state is JobState.CANCELLED and second.finished
    assert queue.counts() == (1, 1) and queue.ahead(third) == 1
    release.set()
    assert third.wait(5)
    assert ran == ["c"]  # the cancelled job never ran


def test_cancel_stops_a_running_job_at_its_next_report_and_frees_the_slot() -> None:
    queue = JobQueue(1)
    started = threading.Event()
    running = queue.submit("a", blocker(threading.Event(), started))  # never released
    assert started.wait(5)
    queue.cancel(running)
    assert running.wait(5)
    assert running.state is JobState.CANCELLED and running.result is None
    after = queue.submit("b", lambda progress: "next")
    assert after.wait(5) and after.result == "next"


def test_a_crashed_job_frees_its_slot_and_keeps_its_error() -> None:
    queue = JobQueue(1)

    def crash(progress):
        raise RuntimeError("boom")

    failed = queue.submit("a", crash)
    assert failed.wait(5)
    assert failed.state is JobState.FAILED and str(failed.error) == "boom"
    later = queue.submit("b", lambda progress: "still served")
    assert later.wait(5) and later.result == "still served"
    assert queue.counts() == (0, 0)


def test_the_same_key_is_one_job_cancelled_only_when_every_asker_withdraws() -> None:
    queue = JobQueue(1)
    release = threading.Event()
    queue.submit("other", blocker(release))
    calls: list[int] = []
    mine = queue.submit("corpus", lambda progress: calls.append(1) or "table")
    theirs = queue.submit("corpus", lambda progress: calls.append(2) or "table")
    assert mine is theirs
    queue.cancel(mine)  # one of two askers leaves: the job stays
    assert mine.state is JobState.WAITING and queue.counts() == (1, 1)
    release.set()
    assert theirs.wait(5) and theirs.result == "table"
    assert calls == [1]  # computed once, by the first asker's function


def test_progress_raises_once_cancelled() -> None:
    queue = JobQueue(1)
    seen: list[BaseException] = []
    started, go_on = threading.Event(), threading.Event()

    def run(progress):
        started.set()
        go_on.wait(5)
        try:
            progress(1, 2)
        except JobCancelled as e:
            seen.append(e)
            raise

    job = queue.submit("a", run, label="Importance")
    assert started.wait(5)
    queue.cancel(job)
    go_on.set()
    assert job.wait(5) and job.state is JobState.CANCELLED
    assert len(seen) == 1 and "Importance" in str(seen[0])


def test_a_queue_needs_a_limit_of_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        JobQueue(0)


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5", "3x"])
def test_bad_max_heavy_values_are_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match="MHSA_MAX_HEAVY") as info:
        max_heavy_from_env({"MHSA_MAX_HEAVY": raw})
    assert repr(raw) in str(info.value)


def test_max_heavy_defaults_to_the_cores_and_reads_a_number() -> None:
    cores = len(os.sched_getaffinity(0))
    assert max_heavy_from_env({}) == max(1, cores)
    assert max_heavy_from_env({"MHSA_MAX_HEAVY": " 3 "}) == 3


def start_server(**env: str) -> subprocess.CompletedProcess:
    """``python -m ui.serve`` started with ``env`` added, for a refusal (port 1: it never
    serves), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "ui.serve", "--server.port=1"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("raw", ["0", "-2", "many"])
@pytest.mark.slow
def test_the_server_refuses_to_start_with_a_bad_limit(raw: str) -> None:
    done = start_server(MHSA_MAX_HEAVY=raw)
    assert done.returncode == 2
    assert "MHSA Explorer cannot start" in done.stderr and "MHSA_MAX_HEAVY" in done.stderr
    assert "Traceback" not in done.stderr


# --- estimates: time left and expected wait ---------------------------------------------------
def test_seconds_left_is_the_steps_to_go_at_the_rate_so_far() -> None:
    assert seconds_left(25, 100, 10.0) == pytest.approx(30.0)  # 2.5 steps/s, 75 to go
    assert seconds_left(100, 100, 40.0) == 0.0
    assert seconds_left(0, 100, 3.0) is None  # no step yet: no rate
    assert seconds_left(5, 0, 3.0) is None  # no total


def paced(release: threading.Event, done: int, total: int, started: threading.Event):
    """A job that reports ``done`` of ``total`` steps, then holds its slot until released."""

    def run(progress):
        progress(done, total)
        started.set()
        release.wait(10)
        return done

    return run


def test_the_expected_wait_fills_the_first_free_slot_in_turn() -> None:
    queue = JobQueue(2)
    release = threading.Event()
    started = [threading.Event(), threading.Event()]
    a = queue.submit("a", paced(release, 2, 10, started[0]))  # 8 steps to go
    b = queue.submit("b", paced(release, 5, 10, started[1]))  # 5 steps to go
    assert all(s.wait(5) for s in started)
    c = queue.submit("c", lambda progress: 0, expected_seconds=30.0)
    d = queue.submit("d", lambda progress: 0, expected_seconds=10.0)
    mine = queue.submit("mine", lambda progress: 0)
    try:
        now = max(a.started, b.started) + 1.0
        a.started, b.started = now - 4.0, now - 2.0  # a: 2 steps in 4 s; b: 5 steps in 2 s
        assert a.seconds_left(now) == pytest.approx(16.0)
        assert b.seconds_left(now) == pytest.approx(2.0)
        # slots free at 2 (b) and 16 (a); c takes b's slot until 32, d a's until 26
        assert queue.expected_wait(c, now) == pytest.approx(2.0)
        assert queue.expected_wait(d, now) == pytest.approx(16.0)
        assert queue.expected_wait(mine, now) == pytest.approx(26.0)
        assert queue.expected_wait(a, now) == 0.0  # running
        later = queue.submit("later", lambda progress: 0)
        assert queue.expected_wait(later, now) is None  # "mine" has no expected length
    finally:
        release.set()
    assert all(j.wait(5) for j in (a, b, c, d, mine, later))
    assert (a.seconds_left(), c.seconds_left()) == (0.0, 0.0)


def test_a_running_job_without_a_rate_leaves_the_wait_unknown() -> None:
    queue = JobQueue(1)
    release, started = threading.Event(), threading.Event()
    first = queue.submit("a", blocker(release, started))  # reports 0 of 1: no rate
    assert started.wait(5)
    second = queue.submit("b", lambda progress: 0, expected_seconds=5.0)
    try:
        assert first.seconds_left() is None
        assert second.seconds_left() == 5.0  # waiting: its expected length
        assert queue.expected_wait(second) is None
    finally:
        release.set()
    assert first.wait(5) and second.wait(5)


@pytest.mark.parametrize("preset", [None, "4"])
def test_the_server_starts_streamlit_with_malloc_arenas_capped_unless_the_operator_says(
    preset: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ui.serve`` execs Streamlit with ``MALLOC_ARENA_MAX=2`` in its environment (glibc reads it
    when the new process starts); an operator's own value is kept."""
    from ui import serve

    monkeypatch.setenv("MALLOC_ARENA_MAX", preset or "")  # restored after the test
    if preset is None:
        monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.delenv("MHSA_MAX_HEAVY", raising=False)
    started: list[tuple[str, list[str], str | None]] = []
    monkeypatch.setattr(
        serve.os,
        "execv",
        lambda path, args: started.append((path, args, os.environ.get("MALLOC_ARENA_MAX"))),
    )
    monkeypatch.chdir(ROOT)  # main changes the working directory: monkeypatch restores it
    assert serve.main(["--server.port=1"]) == 0
    ((_, args, arenas),) = started
    assert args[1:4] == ["-m", "streamlit", "run"] and args[-1] == "--server.port=1"
    assert arenas == (preset or "2")

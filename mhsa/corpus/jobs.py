"""Heavy work waits its turn: one queue per server process that runs at most ``limit`` heavy
jobs at once (head importance, pruning curves, corpus statistics; later training and
patching), first come first served, each in a thread of its own.

Page views never enter the queue: they compute in their own session's thread as before, so a
class's page views stay quick while heavy jobs wait. A job with the same key as one already
waiting or running is that job (two students asking for the same corpus share one
computation); each asker holds a claim on it, and the job is cancelled when the last claim is
withdrawn. A job reports progress through the callable it is given, and that callable raises
``JobCancelled`` once the job is cancelled, so cancelling a running job stops it at its next
step; a job that raises anything frees its slot all the same.

The limit is ``MHSA_MAX_HEAVY`` (``max_heavy_from_env``): by default the number of cores this
process may use, at least 1.

Estimates: a running job's time left comes from its own measured rate (``Job.seconds_left``),
and a waiting job's expected wait from the time left of the jobs running and the expected
length (``Job.expected_seconds``, given when it was submitted) of those ahead of it
(``JobQueue.expected_wait``).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

__all__ = [
    "Job",
    "JobCancelled",
    "JobQueue",
    "JobState",
    "max_heavy_from_env",
    "seconds_left",
]

#: the environment variable that sets how many heavy jobs run at once per process
MAX_HEAVY_VARIABLE = "MHSA_MAX_HEAVY"

Progress = Callable[[int, int], None]


class JobCancelled(Exception):
    """Raised inside a job by its progress callable once the job has been cancelled."""


class JobState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


def max_heavy_from_env(environ: dict[str, str] | None = None) -> int:
    """The heavy-job limit from ``MHSA_MAX_HEAVY``: unset or empty gives the number of cores
    this process may use (at least 1).

    Raises:
        ValueError: the value is not a whole number of at least 1; the message names the
            variable, for a start-up error an operator can act on.
    """
    raw = (os.environ if environ is None else environ).get(MAX_HEAVY_VARIABLE, "").strip()
    if not raw:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return max(1, cores or os.cpu_count() or 1)
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(
            f"{MAX_HEAVY_VARIABLE}={raw!r} is not allowed: it must be a whole number of at least "
            f"1 (how many heavy jobs, such as head importance, run at once); leave it unset for "
            f"the number of cores."
        )
    return int(raw)


def seconds_left(done: int, total: int, elapsed: float) -> float | None:
    """Seconds until ``total`` steps are done at the rate measured so far (``done`` steps in
    ``elapsed`` seconds); None before the first step (no rate yet) or without a total."""
    if done <= 0 or total <= 0 or elapsed <= 0:
        return None
    return max(0, total - done) * elapsed / done


class Job:
    """One heavy computation: its state, progress, and result or error once finished.

    ``expected_seconds``: how long the job is expected to run (None: unknown), for the expected
    wait of the jobs behind it before it has started."""

    def __init__(
        self,
        key: Hashable,
        fn: Callable[[Progress], Any],
        label: str,
        expected_seconds: float | None = None,
    ) -> None:
        self.key = key
        self.label = label
        self._fn = fn
        self.state = JobState.WAITING
        self.done_steps = 0
        self.total_steps = 0
        self.expected_seconds = expected_seconds
        self.started: float | None = None  # time.monotonic() when it began to run
        self.result: Any = None
        self.error: BaseException | None = None
        self._claims = 0
        self._cancel = threading.Event()
        self._finished = threading.Event()

    def __repr__(self) -> str:
        return f"Job({self.label!r}, {self.state.value}, {self.done_steps}/{self.total_steps})"

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job has finished (or ``timeout`` seconds); whether it has."""
        return self._finished.wait(timeout)

    def _progress(self, done: int, total: int) -> None:
        if self._cancel.is_set():
            raise JobCancelled(self.label)
        self.done_steps, self.total_steps = done, total

    def seconds_left(self, now: float | None = None) -> float | None:
        """A running job's seconds left at its rate so far (``seconds_left``; ``now``: a
        ``time.monotonic()`` reading), its ``expected_seconds`` while it waits, 0 once
        finished, None while unknown."""
        if self.finished:
            return 0.0
        if self.started is None:
            return self.expected_seconds
        now = time.monotonic() if now is None else now
        return seconds_left(self.done_steps, self.total_steps, now - self.started)

    def _run(self) -> None:
        self.started = time.monotonic()
        try:
            self._progress(0, 0)  # cancelled before it started: nothing runs
            self.result = self._fn(self._progress)
            self.state = JobState.DONE
        except JobCancelled:
            self.state = JobState.CANCELLED
        except BaseException as e:  # any failure is the job's result
            self.error = e
            self.state = JobState.FAILED


class JobQueue:
    """At most ``limit`` jobs run at once; the rest wait in order of arrival."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a job queue needs a limit of at least 1, not {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._waiting: deque[Job] = deque()
        self._running: set[Job] = set()
        self._live: dict[Hashable, Job] = {}  # waiting or running, by key

    def submit(
        self,
        key: Hashable,
        fn: Callable[[Progress], Any],
        label: str = "",
        *,
        expected_seconds: float | None = None,
    ) -> Job:
        """The live job for ``key``, or a new one queued to run ``fn(progress)`` (expected to
        take ``expected_seconds``, if known); either way the caller holds one claim on it
        (``cancel`` withdraws it)."""
        with self._lock:
            job = self._live.get(key)
            if job is None:
                job = Job(key, fn, label or str(key), expected_seconds)
                self._live[key] = job
                self._waiting.append(job)
            job._claims += 1
            self._start_next()
            return job

    def ahead(self, job: Job) -> int:
        """Jobs ahead of a waiting one: those running and those that arrived before it
        (0 once it runs or has finished)."""
        with self._lock:
            if job.state is not JobState.WAITING or job not in self._waiting:
                return 0
            return len(self._running) + self._waiting.index(job)

    def expected_wait(self, job: Job, now: float | None = None) -> float | None:
        """Seconds until a waiting job starts, if every job before it keeps its pace: each of
        the ``limit`` slots frees when its running job's time left is over, and the jobs
        ahead take the first free slot in turn for their ``expected_seconds``. 0 once it runs
        or has finished; None when a job before it has no estimate (no rate yet, no expected
        length)."""
        with self._lock:
            if job.state is not JobState.WAITING or job not in self._waiting:
                return 0.0
            running = list(self._running)
            ahead = list(itertools.islice(self._waiting, self._waiting.index(job)))
        slots = [0.0] * (self.limit - len(running))
        for other in running:
            left = other.seconds_left(now)
            if left is None:
                return None
            slots.append(left)
        heapq.heapify(slots)
        for other in ahead:
            if other.expected_seconds is None:
                return None
            heapq.heappush(slots, heapq.heappop(slots) + other.expected_seconds)
        return slots[0]

    def counts(self) -> tuple[int, int]:
        """(running, waiting)."""
        with self._lock:
            return len(self._running), len(self._waiting)

    def cancel(self, job: Job) -> None:
        """Withdraw one claim; with none left the job is cancelled: a waiting job leaves the
        queue at once, a running one stops at its next progress report."""
        with self._lock:
            if job.finished or job._claims == 0:
                return
            job._claims -= 1
            if job._claims:
                return
            job._cancel.set()
            if job in self._waiting:
                self._waiting.remove(job)
                job.state = JobState.CANCELLED
                self._forget(job)

    def _forget(self, job: Job) -> None:
        """Under the lock: the job has left the queue for good."""
        if self._live.get(job.key) is job:
            del self._live[job.key]
        job._finished.set()

    def _start_next(self) -> None:
        """Under the lock: start waiting jobs while slots are free."""
        while self._waiting and len(self._running) < self.limit:
            job = self._waiting.popleft()
            job.state = JobState.RUNNING
            self._running.add(job)
            threading.Thread(target=self._work, args=(job,), name="mhsa-heavy", daemon=True).start()

    def _work(self, job: Job) -> None:
        try:
            job._run()
        finally:
            with self._lock:
                self._running.discard(job)
                self._forget(job)
                self._start_next()

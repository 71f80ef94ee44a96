"""The heavy-job UI: a page's heavy work (importance, patching, a corpus, the flow) runs through
the server's one queue (``ui.core.heavy_queue``), showing its place in the queue, its progress
and a Cancel button; its value comes back through the shared cache."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import streamlit as st

from mhsa.corpus.jobs import Job, JobQueue, JobState
from ui import core
from ui.state import error

__all__ = ["heavy", "queue_place", "time_left"]

#: session key of the heavy jobs this session holds a claim on, by the name a page gives each
_JOBS = "_mhsa_jobs"
#: session key of the jobs cancelled here, by name: their key, not run again until asked
_CANCELLED = "_mhsa_cancelled_jobs"


def heavy(
    name: str,
    key: tuple,
    compute: Callable[[core.Progress], Any],
    label: str,
    *,
    on_cancel: Callable[[], None] | None = None,
    unit: str = "steps",
) -> Any | None:
    """Run ``compute(progress)`` through the server's heavy-job queue (``core.heavy_queue``)
    and return its value, or None while it waits its turn or once cancelled.

    The value comes from the shared cache when a finished job put it there under ``key``. A job
    that waits shows how many jobs are ahead of it, checks again every second in a fragment
    (the rest of the page is drawn meanwhile) and can be cancelled; a running job shows its
    progress and this run waits for it (the page's later elements need its value). These
    controls are cleared once the job has finished. ``name``
    says which of the page's jobs this is: a new ``key`` under the same name withdraws the
    session's claim on the old job. Its error, if it failed, is raised here. ``unit``: what
    the progress counts ("steps", "texts", ...).
    """
    hit = core.cached(key)
    if hit is not None:
        return hit
    cancelled: dict[str, tuple] = st.session_state.setdefault(_CANCELLED, {})
    if cancelled.get(name) == key:
        st.info(f"{label}: cancelled.", icon=":material/stop_circle:")
        st.button("Run it again", key=f"again-{name}", on_click=cancelled.pop, args=(name,))
        return None
    try:
        queue = core.heavy_queue()
    except ValueError as e:  # a bad MHSA_MAX_HEAVY (ui.serve refuses it at start)
        error(e)
        return None
    job = _claim(queue, name, key, compute, label)
    cancel = {"on_click": _cancel, "args": (queue, name, job, key, on_cancel)}
    controls = st.empty()  # the queue's place or progress, and Cancel: only while it is pending
    with controls.container():
        if job.state is JobState.WAITING:
            st.button("Cancel", key=f"cancel-{name}", **cancel)
            _waiting(queue, job)
            return None
        if not job.finished:
            st.button("Cancel", key=f"cancel-{name}", **cancel)
            _follow(job, label, unit)
    controls.empty()  # finished: no Cancel button left beside the result
    st.session_state[_JOBS].pop(name, None)
    if job.state is JobState.FAILED:
        raise job.error
    return job.result if job.state is JobState.DONE else None


def _claim(
    queue: JobQueue, name: str, key: tuple, compute: Callable[[core.Progress], Any], label: str
) -> Job:
    """The session's job called ``name`` for ``key``: the one it holds, else a new one in the
    queue (a job for another key under that name is withdrawn first)."""
    jobs: dict[str, Job] = st.session_state.setdefault(_JOBS, {})
    job = jobs.get(name)
    if job is not None and job.key != key:
        queue.cancel(job)
        job = None
    if job is None or job.state is JobState.CANCELLED:
        job = jobs[name] = queue.submit(
            key, functools.partial(core.compute_and_keep, key, compute), label
        )
    return job


def _cancel(
    queue: JobQueue, name: str, job: Job, key: tuple, on_cancel: Callable[[], None] | None
) -> None:
    """The Cancel button: withdraw the session's claim on the job; then the page's
    ``on_cancel``, or else the key is remembered as cancelled (not run again until asked)."""
    queue.cancel(st.session_state.setdefault(_JOBS, {}).pop(name, job))
    if on_cancel:
        on_cancel()
    else:
        st.session_state.setdefault(_CANCELLED, {})[name] = key


def _follow(job: Job, label: str, unit: str = "steps") -> None:
    """A progress bar for a running job, until it ends (the page's later elements need its
    value), with the time left at the pace so far."""
    bar = st.progress(0.0, text=f"{label}…")
    while not job.wait(0.25):  # each update lets Streamlit stop this run for a newer one
        done, total = job.done_steps, job.total_steps
        text = f"{label}: {done:,} of {total:,} {unit}" if total else f"{label}…"
        left = time_left(job, time.monotonic())
        if left is not None:
            text += f", about {left} left"
        bar.progress(min(1.0, done / max(total, 1)), text=text)
    bar.empty()


def time_left(job: Job, now: float) -> str | None:
    """The time a running job has left at its pace so far ("40 s", "3 min"); None before its
    first step is done."""
    done, total = job.done_steps, job.total_steps
    if job.started is None or not 0 < done < total:
        return None
    seconds = (now - job.started) / done * (total - done)
    return f"{max(1, round(seconds))} s" if seconds < 90 else f"{round(seconds / 60)} min"


@st.fragment(run_every=1.0)
def _waiting(queue: JobQueue, job: Job) -> None:
    """A waiting job's place in the queue, checked every second; the whole page runs again
    once the job has its turn."""
    if job.state is not JobState.WAITING:
        st.rerun()
    queue_place(job, queue)


def queue_place(job: Job, queue: JobQueue | None = None) -> None:
    """How many heavy jobs are ahead of a waiting one (``queue``: the server's heavy queue)."""
    queue = queue or core.heavy_queue()
    ahead = queue.ahead(job)
    running, _ = queue.counts()
    st.info(
        f"{job.label} waits its turn: {ahead} heavy job{'s' if ahead != 1 else ''} ahead of "
        f"you ({running} running; this server runs {queue.limit} at a time). It starts by "
        "itself; the rest of the page works meanwhile.",
        icon=":material/hourglass_top:",
    )

"""Training runs of the Train heads page: the settings and their link values, one run per
session through the server's heavy-job queue, its snapshots for the page to draw while it trains,
and the trained model held in the process's store (``mhsa.engine.models.trained``) under
``trained:<id>``.

A run waits in the heavy queue like any heavy job (its place and expected wait shown); once it
runs, the trainer appends a snapshot every few steps. Cancel takes a waiting run out of the
queue, and stops a running one after its current step: what was trained so far is saved and held
like a finished model.

Drawing must not slow the trainer (issue 38: the page took 3x the command line's time). The
page's progress line (steps, rate, time left) is redrawn every second, but the live figures
only every ``REDRAW_SECONDS`` and only when new snapshots have come (``LiveFigures``), from at
most ``LIVE_POINTS`` snapshots per curve (``thin``), built in the page's thread with nothing
held that the trainer waits for. The trainer computes with one core fewer than the machine has
(``runtime.page_work``, as a page's own work): on a small machine the browser and Streamlit keep
one, and a team of threads whose last member is pre-empted waits at every barrier (a 2-thread
team on 2 busy cores spun 5 to 10x the CPU of one thread). The measurements:
BENCHMARKS.md, "Training in the browser" (``bench/bench_train_page.py``).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go

from mhsa import plots
from mhsa.corpus.jobs import Job, JobState
from mhsa.engine.models.trained import TrainedModel, trained_store
from mhsa.training import (
    PHASE_CHANGE_SCORE,
    RECIPES,
    TASKS,
    TOY_PREFIX,
    TrainConfig,
    TrainSnapshot,
    probe,
    save_model,
    train,
)
from mhsa.training.circuit_probe import strongest_k_edges
from mhsa.training.results import phase_change, phase_change_step
from mhsa.training.tasks import BOS, VOCAB
from ui import core, runtime

__all__ = [
    "DEFAULTS",
    "LIVE_POINTS",
    "REDRAW_SECONDS",
    "SETTINGS",
    "LiveFigures",
    "TrainingRun",
    "bad_settings",
    "check_setting",
    "config_from",
    "duration_text",
    "explore_state",
    "figures",
    "kept_text",
    "phase_change_text",
    "probe_text",
    "progress_text",
    "rate",
    "recipe_state",
    "setting",
    "start",
    "task_alone_in_link",
    "thin",
    "toy_state",
    "wait_text",
    "whole",
]

#: the page's settings: link key -> TrainConfig field
SETTINGS = {
    "task": "task",
    "family": "family",
    "layers": "layers",
    "heads": "heads",
    "width": "width",
    "mlp": "mlp",
    "steps": "steps",
    "lr": "lr",
    "train_seed": "seed",
}
#: snapshots per run (about): enough to see the phase change as a curve; each costs a forward
#: pass over the trainer's evaluation batch, so not every step of a short run
SNAPSHOTS_PER_RUN = 40
MIN_SNAPSHOT_EVERY = 5
DEFAULTS = TrainConfig()
#: seconds between redraws of the live figures (the progress line: every second)
REDRAW_SECONDS = 2.0
#: snapshots per curve in the live figures (the finished run's figures: every snapshot)
LIVE_POINTS = 25

#: seconds per step of the last finished run of each model shape in this process (and under
#: None, of any shape): a queued run's expected length
_PACE: dict[tuple | None, float] = {}


def check_setting(name: str, value: Any) -> Any:
    """``value`` for the setting ``name`` (a TrainConfig field), checked on its own against the
    trainer's limits. A value refused only beside the default of another setting (3 heads
    beside a width of 64) passes: the whole configuration is checked when it trains.

    Raises:
        ValueError: the trainer's message, naming the setting and its range.
    """
    try:
        dataclasses.replace(DEFAULTS, **{name: value}).check()
    except ValueError as e:
        if str(e).startswith((f"{name} ", f"Unknown {name} ")):  # about this setting itself
            raise
    return value


def setting(name: str, cast: Callable[[str], Any]) -> Callable[[str], Any]:
    """A link parser for the setting ``name``: ``cast`` the text, then ``check_setting``."""

    def parse(raw: str) -> Any:
        return check_setting(name, cast(raw.strip()))

    return parse


def whole(raw: str) -> int:
    """A whole number written in decimal digits."""
    if not raw.lstrip("-").isdigit():
        raise ValueError("must be a whole number")
    return int(raw)


def rate(raw: str) -> float:
    """A finite number."""
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def recipe_state(task: str) -> dict[str, Any]:
    """The settings of the shipped ``task`` model's recipe (``mhsa.training.RECIPES``), the seed
    left as it is."""
    recipe = RECIPES.get(task, dataclasses.replace(DEFAULTS, task=task))
    return {key: getattr(recipe, name) for key, name in SETTINGS.items() if name != "seed"}


def task_alone_in_link(params: Mapping[str, str], state: Any) -> bool:
    """The page's settings are about to be read from a link (``params``, the URL's query
    parameters) that names a task and no family: the family is then the task's recipe's
    (``recipe_state``), as choosing the task in the box brings it (an encoder-decoder task
    cannot train in the default family). Call before ``page.setup`` reads the link into
    ``state`` (session state)."""
    return "family" not in state and "task" in params and "family" not in params


def bad_settings(state: Any) -> list[tuple[str, str]]:
    """Settings in ``state`` (session state) that the trainer refuses on their own: (link key,
    the trainer's message)."""
    bad = []
    for key, name in SETTINGS.items():
        try:
            check_setting(name, state[key])
        except (ValueError, TypeError) as e:
            bad.append((key, str(e)))
    return bad


def config_from(state: Any, device: str) -> TrainConfig:
    """The TrainConfig of the page's settings in ``state``.

    Raises:
        ValueError: the settings do not go together (the trainer's message).
    """
    config = TrainConfig(**{name: state[key] for key, name in SETTINGS.items()}, device=device)
    config.check()
    return config


@dataclass(eq=False)
class TrainingRun:
    """One training run of a session: its settings, its job in the heavy queue, the snapshots the
    trainer has sent so far and, once it has finished, its outcome and the held model.

    The job's thread writes the fields; the session's thread reads them (whole objects and list
    appends, nothing read half-written)."""

    config: TrainConfig
    snapshot_every: int
    job: Job | None = None
    snapshots: list[TrainSnapshot] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    steps_done: int = 0
    accuracy: float | None = None
    seconds: float | None = None
    stopped_early: bool = False
    model: TrainedModel | None = None
    drawn: LiveFigures | None = field(default=None, repr=False)

    @property
    def state(self) -> JobState:
        return self.job.state if self.job is not None else JobState.WAITING

    @property
    def live(self) -> bool:
        """Waiting or training."""
        return self.job is not None and not self.job.finished

    def cancel(self) -> None:
        """A waiting run leaves the queue; a running one stops after its current step and
        keeps what it has trained."""
        if self.job is not None and self.job.state is JobState.WAITING:
            core.heavy_queue().cancel(self.job)
        self.stop.set()

    @property
    def phase_change_step(self) -> int | None:
        """The step of the phase change among the snapshots so far (the finished run's:
        the trainer's ``TrainResult.phase_change_step``, the same definition)."""
        return phase_change_step(self.snapshots)

    def seconds_left(self) -> float | None:
        """Seconds until the last step at the rate measured so far (None: no step yet)."""
        return None if self.job is None else self.job.seconds_left()

    def live_figures(self) -> dict[str, go.Figure]:
        """The figures to draw while it trains (``LiveFigures``: throttled, thinned)."""
        if self.drawn is None:
            self.drawn = LiveFigures(self)
        return self.drawn.get()

    def _body(self, progress: Callable[[int, int], None]) -> str:
        """The job: train, save into the store, keep the outcome (not the model object: the
        store's folder is the model, loaded by name like any other). Nothing per step beyond
        a count and the queue's progress report: the page reads, the trainer only writes."""

        def after_step() -> bool:  # the trainer asks after every step
            self.steps_done += 1
            progress(self.steps_done, self.config.steps)
            return self.stop.is_set()

        with runtime.page_work():  # one core fewer than the machine has
            result = train(
                self.config,
                on_snapshot=self.snapshots.append,
                snapshot_every=self.snapshot_every,
                should_stop=after_step,
            )
        if result.steps_done:
            _PACE[_shape(self.config)] = _PACE[None] = result.seconds / result.steps_done
        info = {key: getattr(self.config, name) for key, name in SETTINGS.items()}
        info["steps_done"] = result.steps_done
        self.model = trained_store().add(lambda folder: save_model(result, folder), info)
        self.accuracy = float(result.accuracy)
        self.seconds = float(result.seconds)
        self.stopped_early = bool(result.stopped_early)
        return self.model.name


def start(config: TrainConfig) -> TrainingRun:
    """A new run of ``config``, queued in the server's heavy queue (a key of its own: two
    students training the same settings each get their own run, which each may cancel)."""
    every = max(MIN_SNAPSHOT_EVERY, -(-config.steps // SNAPSHOTS_PER_RUN))
    run = TrainingRun(config, every)
    pace = _PACE.get(_shape(config), _PACE.get(None))
    run.job = core.heavy_queue().submit(
        ("train", id(run)),
        run._body,
        "Training",
        expected_seconds=None if pace is None else pace * config.steps,
    )
    return run


def _shape(config: TrainConfig) -> tuple:
    """What a step's cost depends on."""
    return (config.task, config.family, config.layers, config.heads, config.width, config.mlp)


def thin(n: int, keep: int) -> list[int]:
    """Indices of at most ``keep`` of ``n`` items in order, evenly spread, the first and the
    last always among them (all of them when ``n <= keep``)."""
    if keep < 2:
        raise ValueError(f"thin keeps at least 2 items, not {keep}")
    if n <= keep:
        return list(range(n))
    return sorted({round(i * (n - 1) / (keep - 1)) for i in range(keep)})


def figures(
    run: TrainingRun,
    snapshots: Sequence[TrainSnapshot] | None = None,
    *,
    step_index: int = -1,
    final: bool = False,
) -> dict[str, go.Figure]:
    """The run's figures by file name: loss and accuracy, every head on the probe at one
    snapshot (``step_index``), the head scores over the steps; the phase change marked once
    the run has finished (``final``).

    Args:
        run: the run.
        snapshots: the snapshots to draw (default: all of the run's so far).
        step_index: which snapshot the mosaic shows.
        final: the finished run's figures.
    """
    snapshots = list(run.snapshots if snapshots is None else snapshots)
    steps, phase = run.config.steps, run.phase_change_step if final else None
    shown = snapshots[step_index]
    return {
        "training-curves": plots.training_curves(
            plots.snapshot_history(snapshots), steps=steps, phase_change_step=phase
        ),
        f"probe-step-{shown.step}": plots.probe_mosaic(
            shown.probe_tokens,
            shown.probe_attention,
            step=shown.step,
            key_tokens=shown.probe_source_tokens,
        ),
        "head-scores": plots.head_scores_figure(
            plots.snapshot_scores(snapshots),
            steps=steps,
            phase_change_step=phase,
            threshold=PHASE_CHANGE_SCORE,
        ),
        **_k_composition(snapshots, steps, phase),
    }


def _k_composition(
    snapshots: Sequence[TrainSnapshot], steps: int, phase: int | None
) -> dict[str, go.Figure]:
    """The induction task's strongest K-composition edge at each step, by its support of the
    right answer (beside the head scores), or nothing for another task."""
    series = strongest_k_edges(snapshots)
    if series is None:
        return {}
    at, edges, supports = series
    figure = plots.k_support_figure(at, edges, supports, total_steps=steps, phase_change_step=phase)
    return {"k-composition": figure}


class LiveFigures:
    """A running run's figures, rebuilt only when new snapshots have come and at least
    ``interval`` seconds after the last build (between, the last build is drawn again), from
    at most ``points`` snapshots per curve (``thin``), the last one always among them.

    Args:
        run: the run whose snapshots are drawn.
        interval: the least seconds between two builds.
        points: snapshots per curve.
        clock: seconds, monotonic (``time.monotonic``).
    """

    def __init__(
        self,
        run: TrainingRun,
        *,
        interval: float = REDRAW_SECONDS,
        points: int = LIVE_POINTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run, self.interval, self.points, self.clock = run, interval, points, clock
        self.builds = 0
        self._count = 0
        self._built_at = -math.inf
        self._figures: dict[str, go.Figure] = {}

    def get(self) -> dict[str, go.Figure]:
        """The figures to draw now (none before the first snapshot)."""
        snapshots = list(self.run.snapshots)  # the trainer appends: read once
        now = self.clock()
        if len(snapshots) > self._count and now - self._built_at >= self.interval:
            shown = [snapshots[i] for i in thin(len(snapshots), self.points)]
            self._figures = figures(self.run, shown)
            self._count, self._built_at = len(snapshots), now
            self.builds += 1
        return self._figures


def duration_text(seconds: float) -> str:
    """``seconds`` in words for a person waiting: "about 40 s", "about 2 min 10 s"."""
    seconds = max(0, round(seconds))
    if seconds < 1:
        return "under a second"
    minutes, rest = divmod(seconds, 60)
    if not minutes:
        return f"about {rest} s"
    return f"about {minutes} min {rest} s" if rest else f"about {minutes} min"


def progress_text(run: TrainingRun) -> str:
    """The progress line of a running run: steps, rate and the time left at that rate."""
    done, steps = run.steps_done, run.config.steps
    text = f"Training: step {done} of {steps}"
    if run.stop.is_set():
        return f"{text} (stopping after this step)"
    left, started = run.seconds_left(), run.job.started if run.job else None
    if left is None or started is None:
        return text
    rate = done / max(time.monotonic() - started, 1e-9)
    return f"{text} · {rate:.1f} steps/s · {duration_text(left)} left"


def phase_change_text(run: TrainingRun) -> str | None:
    """The phase change among the snapshots so far, in words (None: not seen yet)."""
    change = phase_change(run.snapshots)
    if change is None:
        return None
    elapsed = next(s.elapsed for s in run.snapshots if s.step == change.step)
    return (
        f"Phase change from step {change.step}, {elapsed:.1f} s into training: the accuracy "
        f"rose fastest between steps {change.step} and {change.end} ({change.before:.2f} to "
        f"{change.after:.2f}) as an induction head formed (a head above layer 0 reached an "
        f"induction score of {PHASE_CHANGE_SCORE:g} on the probe; Olsson et al. 2022)."
    )


def wait_text(run: TrainingRun) -> str:
    """A waiting run's expected wait, from the time left of the jobs running and the expected
    length of those ahead (``JobQueue.expected_wait``)."""
    wait = core.heavy_queue().expected_wait(run.job) if run.job is not None else None
    if wait is None:
        return (
            "Expected wait: not known yet (a job ahead has not measured its pace); it shows "
            "once it has."
        )
    return f"Expected wait: {duration_text(wait)}, if the jobs ahead keep their pace."


def probe_text(tokens: Sequence[str]) -> str:
    """The probe sequence as a sentence the toy models' tokenizer reads back to the same tokens
    (it puts the BOS token in front by itself)."""
    return " ".join(tokens[1:] if tokens and tokens[0] == BOS else tokens)


def explore_state(run: TrainingRun) -> dict[str, Any]:
    """What "Explore this model" puts in session state: the model box names the held model,
    the sentence is the probe sequence, and the Heads page opens on the head with the highest
    induction score at the last snapshot (an encoder-decoder: the encoder's input, whose
    self-attention the pages show, and its first head)."""
    if run.model is None or not run.snapshots:
        raise ValueError("this run has no trained model to explore")
    last = run.snapshots[-1]
    if last.probe_source_tokens is not None:
        text = probe_text(last.probe_source_tokens)
        return {"model": run.model.name, "text": text, "layer": 0, "head": 0}
    layer, head = divmod(int(last.induction_scores.argmax()), last.induction_scores.shape[1])
    return {
        "model": run.model.name,
        "text": probe_text(last.probe_tokens),
        "layer": layer,
        "head": head,
    }


def kept_text(model: TrainedModel) -> str:
    """Where the trained ``model`` is kept, in words (markdown): a store of its own
    (``MHSA_STORE``) keeps it across restarts and for every replica sharing it; without one,
    the server process holds it for a while."""
    name = f"**{model.name}**"  # trained:<hex>: no markdown in it
    if trained_store().shared:
        return (
            f"Kept in this server's store as {name}: the sidebar's model box opens it on every "
            "page, and a link to it opens it on every replica of this server, after a restart "
            "too."
        )
    return (
        f"Held by this server for a while as {name}: the sidebar's model box opens it on every "
        "page."
    )


def toy_state(task: str) -> dict[str, Any]:
    """What "Open the shipped model" puts in session state: ``toy:<task>`` in the model box,
    the task's probe sequence as the sentence."""
    ids = probe(TASKS[task])
    token = {i: t for t, i in VOCAB.items()}
    return {"model": f"{TOY_PREFIX}{task}", "text": probe_text([token[i] for i in ids])}

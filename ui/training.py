"""Training runs of the Train heads page: the settings and their link values, one run per
session through the server's heavy-job queue, its snapshots for the page to draw while it trains,
and the trained model held in the process's store (``mhsa.trained``) under ``trained:<id>``.

A run waits in the heavy queue like any heavy job (its place shown); once it runs, the trainer
appends a snapshot every few steps, which the page's fragment reads every second. Cancel takes a
waiting run out of the queue, and stops a running one after its current step: what was trained
so far is saved and held like a finished model.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mhsa.jobs import Job, JobState
from mhsa.trained import TrainedModel, trained_store
from mhsa.training import (
    RECIPES,
    TASKS,
    TOY_PREFIX,
    TrainConfig,
    TrainSnapshot,
    probe,
    save_model,
    train,
)
from mhsa.training.tasks import BOS, VOCAB
from ui import core

__all__ = [
    "DEFAULTS",
    "SETTINGS",
    "TrainingRun",
    "bad_settings",
    "check_setting",
    "config_from",
    "explore_state",
    "probe_text",
    "rate",
    "recipe_state",
    "setting",
    "start",
    "task_alone_in_link",
    "toy_state",
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
    phase_change_step: int | None = None
    accuracy: float | None = None
    seconds: float | None = None
    stopped_early: bool = False
    model: TrainedModel | None = None

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

    def _body(self, progress: Callable[[int, int], None]) -> str:
        """The job: train, save into the store, keep the outcome (not the model object: the
        store's folder is the model, loaded by name like any other)."""

        def after_step() -> bool:  # the trainer asks after every step
            self.steps_done += 1
            progress(self.steps_done, self.config.steps)
            return self.stop.is_set()

        result = train(
            self.config,
            on_snapshot=self.snapshots.append,
            snapshot_every=self.snapshot_every,
            should_stop=after_step,
        )
        info = {key: getattr(self.config, name) for key, name in SETTINGS.items()}
        info["steps_done"] = result.steps_done
        self.model = trained_store().add(lambda folder: save_model(result, folder), info)
        self.phase_change_step = result.phase_change_step
        self.accuracy = float(result.accuracy)
        self.seconds = float(result.seconds)
        self.stopped_early = bool(result.stopped_early)
        return self.model.name


def start(config: TrainConfig) -> TrainingRun:
    """A new run of ``config``, queued in the server's heavy queue (a key of its own: two
    students training the same settings each get their own run, which each may cancel)."""
    every = max(MIN_SNAPSHOT_EVERY, -(-config.steps // SNAPSHOTS_PER_RUN))
    run = TrainingRun(config, every)
    run.job = core.heavy_queue().submit(("train", id(run)), run._body, "Training")
    return run


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


def toy_state(task: str) -> dict[str, Any]:
    """What "Open the shipped model" puts in session state: ``toy:<task>`` in the model box,
    the task's probe sequence as the sentence."""
    ids = probe(TASKS[task])
    token = {i: t for t, i in VOCAB.items()}
    return {"model": f"{TOY_PREFIX}{task}", "text": probe_text([token[i] for i in ids])}

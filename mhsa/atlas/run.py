"""``build_atlas``: plan, run the shards here or on Ray (resuming from those already written),
merge. A lock file keeps two builders of one folder apart: the second waits, then reuses."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mhsa.atlas.build import (
    FORMAT,
    PARTS,
    SAMPLE_SIZE,
    AtlasPlan,
    Tagged,
    build_shard,
    merge_shards,
    plan_atlas,
    read_corpus,
    save_atomic,
    shard_path,
    tags_digest,
)
from mhsa.atlas.corpora import TaggedText
from mhsa.atlas.reader import Atlas, open_atlas
from mhsa.engine.models.loading import get_model
from mhsa.errors import InputError

__all__ = ["build_atlas"]

Progress = Callable[[int, int, int], None]  # (texts done, texts, tokens done)


def build_atlas(
    corpus: str | Path | Sequence[str] | Sequence[TaggedText],
    out: str | Path,
    *,
    model: str = "default",
    top_k: int = 32,
    batch_size: int | None = None,
    layers: Sequence[int] | int | None = None,
    heads: Sequence[int] | int | None = None,
    progress: bool | Progress = True,
    resume: bool = True,
    ray: bool = False,
    workers: int = 2,
    sample_size: int = SAMPLE_SIZE,
    shard_texts: int | None = None,
    part: str | None = None,
) -> Atlas:
    """Build the head atlas of ``model`` over ``corpus`` into the folder ``out``.

    Args:
        corpus: a text file (one text a line; ``text_id`` is the line's 0-based number), a
            list of strings, or a tagged corpus: a list of ``TaggedText`` or a ``.jsonl`` file
            of ``{"text", "words", "tags"}`` records (``read_corpus``; the atlas then keeps
            each token's Universal tag, ``Atlas.tags``).
        out: the atlas's folder (created; an atlas already there for the same model, corpus and
            settings is reused).
        model: a model name as everywhere (``"default"``, ``"toy:induction"``, a folder...).
        top_k: pairs kept per head by weight and by norm.
        batch_size: padded tokens per forward pass (None: by device).
        layers, heads: build part of a large model (None: all).
        progress: a bar on stderr (True), none (False), or ``progress(texts_done, texts,
            tokens_done)``.
        resume: continue a stopped build from its written shards (False: start over).
        ray: compute the shards on Ray (``workers`` actors; a local instance unless Ray is
            already connected) with the same result.
        sample_size: pairs of the uniform sample (the same pairs for every head).
        shard_texts: texts per shard (the unit of resuming and of Ray's work); None: sized
            by the corpus (``shard_texts_for``: about 256 MB of head outputs a shard).
        part: an encoder-decoder's ``"encoder"`` or ``"decoder"`` self-attention alone (its
            heads labelled ``E{layer}H{head}`` / ``D{layer}H{head}``; the decoder reads each
            text as its teacher-forced target, as ``mhsa.attend`` shows it). None: both, each
            in a subfolder of ``out``, read as one atlas. Encoders and decoders: None.

    Raises:
        InputError: bad corpus, settings or folder (nothing is written).
        UnsupportedModelError: a model whose attention atlases do not cover.
    """
    texts, source, tagged = read_corpus(corpus)
    lm = get_model(model)
    if lm.is_encoder_decoder and part is None:
        settings = {
            "model": model,
            "top_k": top_k,
            "batch_size": batch_size,
            "layers": layers,
            "heads": heads,
            "progress": progress,
            "resume": resume,
            "ray": ray,
            "workers": workers,
            "sample_size": sample_size,
            "shard_texts": shard_texts,
        }
        records: list[str] | list[TaggedText] = texts
        if tagged is not None:
            records = [
                TaggedText(t, *(g if g is not None else ((), ())))
                for t, g in zip(texts, tagged, strict=True)
            ]
        return _build_parts(records, Path(out), settings)
    plan = plan_atlas(
        texts,
        source,
        lm,
        model=model,
        top_k=top_k,
        layers=layers,
        heads=heads,
        batch_size=batch_size,
        sample_size=sample_size,
        shard_texts=shard_texts,
        part=part,
        tags_sha256=tags_digest(tagged),
    )
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{str(folder)!r} is a file: give a folder for the atlas.")
    folder.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(folder / ".lock")):
        done = _finished(folder, plan)
        if done is not None:
            return done
        _start(folder, plan, resume)
        start = time.perf_counter()
        todo = [s for s in range(plan.shards) if not shard_path(folder, s).exists()]
        report = _Report(progress, plan)
        report(plan.shards - len(todo))
        held: dict[int, dict] = {}
        if ray:
            _on_ray(plan, texts, tagged, folder, todo, workers, report)
        else:
            for s in todo:
                arrays = build_shard(lm, plan, texts, s, tagged)
                if s == todo[-1]:  # the last goes straight to the merge (a stop there: redone)
                    held[s] = arrays
                else:
                    save_atomic(shard_path(folder, s), arrays)
                report(1)
        report.close()
        seconds = time.perf_counter() - start
        try:
            merge_shards(folder, plan, texts, seconds, {"ray": bool(ray)}, held=held)
        except BaseException:  # the held shard kept, so that a resumed build does not redo it
            for s, arrays in held.items():
                save_atomic(shard_path(folder, s), arrays)
            raise
        shutil.rmtree(folder / ".shards", ignore_errors=True)
        return open_atlas(folder)


def _build_parts(texts: list[str] | list[TaggedText], out: Path, settings: dict[str, Any]) -> Atlas:
    """An encoder-decoder's atlas: its encoder's and its decoder's, each in a subfolder, and
    a manifest naming them (written last, as a single atlas's)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{str(out)!r} is a file: give a folder for the atlas.")
    out.mkdir(parents=True, exist_ok=True)
    parts = {}
    for part in PARTS:
        built = build_atlas(texts, out / part, part=part, **settings)
        parts[part] = {"folder": part, "plan": built.manifest["plan"]}
    manifest = {"kind": "mhsa-atlas", "format": FORMAT, "parts": parts}
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / "manifest.json")
    return open_atlas(out)


def _finished(folder: Path, plan: AtlasPlan) -> Atlas | None:
    """The atlas already in ``folder`` when it was built with ``plan``."""
    if not (folder / "manifest.json").is_file():
        return None
    try:
        atlas = open_atlas(folder)
    except InputError:
        return None
    built = atlas.manifest.get("plan")
    if built == plan.json():
        return atlas
    if plan.tags_sha256 is not None and built == {
        k: v for k, v in plan.json().items() if k != "tags_sha256"
    }:
        return None  # the same atlas without the corpus's tags: built again, with them
    raise InputError(
        f"{str(folder)!r} holds an atlas of other settings or another corpus: choose another "
        "folder, or remove it to build again."
    )


def _start(folder: Path, plan: AtlasPlan, resume: bool) -> None:
    """Make the shards folder ready: kept when it belongs to ``plan`` and ``resume``."""
    shards = folder / ".shards"
    plan_file = shards / "plan.json"
    # shards of another format (or, before, an .npz each) are redone
    wanted = {**plan.json(), "shard_format": FORMAT, "shard_files": "npy"}
    same = plan_file.is_file() and json.loads(plan_file.read_text()) == wanted
    if shards.exists() and not (resume and same):
        shutil.rmtree(shards)
    shards.mkdir(parents=True, exist_ok=True)
    for tmp in shards.glob(".*.tmp"):  # a writer killed mid-write
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    if not plan_file.is_file():
        plan_file.write_text(json.dumps(wanted))


class _Report:
    def __init__(self, progress: bool | Progress, plan: AtlasPlan) -> None:
        self.plan, self.done, self.bar = plan, 0, None
        self.callback = progress if callable(progress) else None
        if progress is True:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=plan.shards, desc="atlas", unit="shard")

    def __call__(self, shards: int, tokens: int = 0) -> None:
        self.done += shards
        if self.bar is not None:
            self.bar.update(shards)
        if self.callback is not None:
            texts = min(self.done * self.plan.shard_texts, self.plan.texts)
            self.callback(texts, self.plan.texts, tokens)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _on_ray(
    plan: AtlasPlan,
    texts: list[str],
    tagged: list[Tagged] | None,
    folder: Path,
    todo: list[int],
    workers: int,
    report: _Report,
) -> None:
    """The shards computed by ``workers`` Ray actors (one model each), written where the
    local build writes them."""
    from mhsa.corpus.distributed import connect

    try:
        import ray as ray_module

        started = not ray_module.is_initialized()  # an instance of ours: shut down at the end
    except ImportError:  # connect says how to install it
        started = False
    ray = connect(None)
    try:
        _run_actors(ray, plan, (texts, tagged), folder, todo, workers, report)
    finally:
        if started:
            ray.shutdown()


def _run_actors(
    ray: Any,
    plan: AtlasPlan,
    texts: tuple[list[str], list[Tagged] | None],
    folder: Path,
    todo: list[int],
    workers: int,
    report: _Report,
) -> None:
    """A pool of ``workers`` actors, each given the next shard as it finishes one."""

    @ray.remote
    class ShardActor:
        def __init__(self, model: str) -> None:
            import numba
            import torch

            # one core an actor, for its model and its compiled loops alike (a pool of
            # actors each on every core would oversubscribe the machine)
            torch.set_num_threads(1)
            numba.set_num_threads(1)
            self.lm = get_model(model)

        def run(self, shard: int, texts_ref: Any) -> int:
            import numba

            numba.set_num_threads(1)  # numba's count is a thread's own
            plain, tagged = texts_ref
            arrays = build_shard(self.lm, plan, plain, shard, tagged)
            save_atomic(shard_path(folder, shard), arrays)
            return shard

    actors = [ShardActor.remote(plan.model) for _ in range(max(1, workers))]
    texts_ref = ray.put(texts)
    pending = {}
    queue = list(todo)
    for actor in actors:
        if queue:
            pending[actor.run.remote(queue.pop(0), texts_ref)] = actor
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        actor = pending.pop(ready[0])
        ray.get(ready[0])
        report(1)
        if queue:
            pending[actor.run.remote(queue.pop(0), texts_ref)] = actor
    for actor in actors:
        ray.kill(actor)

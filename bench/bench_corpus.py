"""Corpus throughput on the embedded model: batched against one by one, and Ray against batched,
in one run.

    PYTHONPATH=. .venv/bin/python -m bench.bench_corpus [--device cpu|cuda] [--sentences 1000]

Target (issue 14): 1,000 sentences of 8 to 64 tokens, MiniLM on the CPU: the batched pipeline
(padded batches of similar length) at least 3x the throughput of one sentence per forward pass
(what ``python -m mhsa stats`` did before). Ray on a local instance with 2 workers is measured
against the batched local path; its overhead (start-up, actors loading the model, shipping
shards) is stated.

The corpus is built from ``data/sentences.txt``: seeded random joins of 1 to 3 of its sentences,
kept when they are 8 to 64 tokens long.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mhsa
from bench.common import print_table
from mhsa.causal.importance import corpus_importance
from mhsa.corpus.stats import corpus_stats
from mhsa.engine.runs.batches import Corpus, Entry

SENTENCES = Path(__file__).resolve().parents[1] / "data" / "sentences.txt"


def build_corpus(lm: mhsa.engine.LoadedModel, count: int, seed: int = 0) -> list[str]:
    lines = SENTENCES.read_text(encoding="utf-8").splitlines()
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        text = " ".join(rng.sample(lines, rng.randint(1, 3)))
        if 8 <= len(lm.tokenizer(text)["input_ids"]) <= 64:
            out.append(text)
    return out


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def statistics_rows(lm: mhsa.engine.LoadedModel, entries: list[Entry], rounds: int) -> list[dict]:
    """Statistics, then statistics + JS similarity: one by one against batched."""
    rows = []
    for what, sim, n_rounds in (
        ("statistics", None, rounds),
        ("statistics + JS similarity", "js", 1),
    ):
        # interleaved rounds, medians: both paths see the same machine state (this VM's speed
        # varies by 30% from minute to minute)
        one_t, bat_t = [], []
        for _ in range(n_rounds):
            seconds, one = timed(
                lambda s=sim: corpus_stats(entries, model=lm, batched=False, similarity=s)
            )
            one_t.append(seconds)
            seconds, bat = timed(lambda s=sim: corpus_stats(entries, model=lm, similarity=s))
            bat_t.append(seconds)
        one_s, bat_s = statistics.median(one_t), statistics.median(bat_t)
        assert one.used == bat.used == len(entries)
        diff = (bat.stats.frame()["entropy"] - one.stats.frame()["entropy"]).abs().max()
        rows.append(
            {
                "work": f"{what} (median of {n_rounds})" if n_rounds > 1 else what,
                "one by one, sent/s": len(entries) / one_s,
                "batched, sent/s": len(entries) / bat_s,
                "batched / one by one": one_s / bat_s,
                "max |entropy diff|": f"{diff:.1e}",
            }
        )
    return rows


def importance_row(lm: mhsa.engine.LoadedModel, few: list[Entry]) -> dict:
    """Leave-one-out importance: ``head_importance`` against the batched corpus path."""
    items = [e.text for e in few]
    one_s, table = timed(lambda: mhsa.causal.head_importance(items, model=lm))
    bat_s, acc = timed(lambda: corpus_importance(few, model=lm))
    diff = (acc.frame()["importance"] - table["importance"]).abs().max()
    return {
        "work": f"importance, leave-one-out ({len(few)} sentences)",
        "one by one, sent/s": len(few) / one_s,
        "batched, sent/s": len(few) / bat_s,
        "batched / one by one": one_s / bat_s,
        "max |entropy diff|": f"{diff:.1e} (importance)",
    }


def print_ray_rows(lm: mhsa.engine.LoadedModel, texts: list[str]) -> None:
    """Ray on a local instance (2 workers) against the batched local path; prints its table."""
    import ray

    from mhsa.corpus.distributed import RayTask, run_on_ray

    start_s, _ = timed(lambda: ray.init(num_cpus=os.cpu_count(), include_dashboard=False))
    corpus = Corpus.of(texts)
    bat_s, bat = timed(lambda: corpus_stats(corpus.entries, model=lm))
    rows = []
    for shard in (250, 500):
        task = RayTask("stats", "default", {})
        ray_s, got = timed(lambda t=task, s=shard: run_on_ray(t, corpus, workers=2, shard_size=s))
        diff = (got.stats.frame()["entropy"] - bat.stats.frame()["entropy"]).abs().max()
        rows.append(
            {
                "shard size": shard,
                "batched local, s": bat_s,
                "Ray 2 workers, s": ray_s,
                "Ray / batched": ray_s / bat_s,
                "overhead, s": ray_s - bat_s,
                "max |entropy diff|": f"{diff:.1e}",
            }
        )
    print(f"ray.init (local instance, {os.cpu_count()} CPUs): {start_s:.1f} s, not counted below")
    print_table(rows, list(rows[0]))
    ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--importance-sentences", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, statistics")
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    lm = mhsa.load_model("default", device=args.device)
    texts = build_corpus(lm, args.sentences)
    lengths = [len(lm.tokenizer(t)["input_ids"]) for t in texts]
    print(
        f"{len(texts)} sentences, {min(lengths)} to {max(lengths)} tokens "
        f"(mean {sum(lengths) / len(lengths):.1f}), {lm.display_name} on {lm.device}"
    )
    entries = Corpus.of(texts).entries
    corpus_stats(entries[:50], model=lm)  # warm-up: first-call costs out of the comparison
    corpus_stats(entries[:50], model=lm, batched=False)
    rows = statistics_rows(lm, entries, args.rounds)
    rows.append(importance_row(lm, entries[: args.importance_sentences]))
    print_table(rows, list(rows[0]))
    if not args.no_ray:
        print_ray_rows(lm, texts)


if __name__ == "__main__":
    main()

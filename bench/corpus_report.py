"""Corpus-level results of the embedded model on the project's own corpus, as Markdown for
``docs/corpus.md``:

    PYTHONPATH=. .venv/bin/python -m bench.corpus_report > docs/corpus.md

Statistics and the Jensen-Shannon head similarity over every sentence of ``data/sentences.txt``
(batched pipeline), head roles, the most and least similar pairs of heads, and leave-one-out
head importance (target ``embedding``) over the same sentences.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd

import mhsa
from mhsa.causal.importance import corpus_importance, rank_correlation
from mhsa.corpus.stats import corpus_stats
from mhsa.engine.runs.batches import read_corpus

CORPUS = Path(__file__).resolve().parents[1] / "data" / "sentences.txt"


def print_roles(stats: pd.DataFrame) -> None:
    """Head roles, and the positional heads."""
    print("## Head roles (Clark et al.'s thresholds, `mhsa.analysis.stats.ROLE_THRESHOLDS`)\n")
    print("| role | heads | of which in layers 0-2 |")
    print("|---|---|---|")
    for role, group in stats.groupby("role"):
        print(f"| {role} | {len(group)} | {(group['layer'] <= 2).sum()} |")
    positional = stats[stats["positional"]]
    print(
        f"\nPositional heads (Voita et al.: the largest weight at one offset for at least 90% "
        f"of the tokens): {len(positional)}: "
        + (
            ", ".join(f"{n} ({int(o):+d})" for n, o in positional["positional_offset"].items())
            or "none"
        )
        + ".\n"
    )


def print_layers(stats: pd.DataFrame) -> None:
    """Means over each layer's heads."""
    print("## Per layer (means over the layer's heads)\n")
    columns = ["entropy", "mean_distance", "confidence", "to_first", "to_sep", "to_punct"]
    by_layer = stats.groupby("layer")[columns].mean()
    print("| layer | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for layer, row in by_layer.iterrows():
        print(f"| {layer} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")


def print_similarity(sim: pd.DataFrame) -> None:
    """The five most and least alike pairs of heads."""
    values = sim.to_numpy()
    upper = np.triu_indices_from(values, 1)
    order = np.argsort(values[upper])
    labels = list(sim.index)
    print("\n## Head similarity (Jensen-Shannon divergence, mean over sentences)\n")
    print("| most alike | JS | least alike | JS |")
    print("|---|---|---|---|")
    for i in range(5):
        a, b = order[i], order[-1 - i]
        near = f"{labels[upper[0][a]]} ~ {labels[upper[1][a]]}"
        far = f"{labels[upper[0][b]]} ~ {labels[upper[1][b]]}"
        print(f"| {near} | {values[upper][a]:.3f} | {far} | {values[upper][b]:.3f} |")


def print_importance(importance: pd.DataFrame, stats: pd.DataFrame) -> None:
    """The most and least important heads, and importance against confidence."""
    print("\n## Head importance (leave-one-out, target `embedding`: mean 1 − cos)\n")
    ranked = importance.sort_values("importance", ascending=False)
    print("| rank | head | importance | std | role |")
    print("|---|---|---|---|---|")
    for rank, (name, row) in enumerate(ranked.iterrows(), start=1):
        if rank <= 5 or rank > len(ranked) - 3:
            role = stats.loc[name, "role"]
            print(f"| {rank} | {name} | {row['importance']:.4f} | {row['std']:.4f} | {role} |")
    rho = rank_correlation(importance, stats, "confidence")
    top = ranked.head(10)
    print(
        f"\nThe ten most important heads: {', '.join(top.index)} "
        f"({(top['layer'] == 5).sum()} of them in the last layer). Spearman's rho between "
        f"importance and confidence: {rho:+.2f}.\n"
    )


def main() -> None:
    lm = mhsa.load_model("default", device="cpu")
    corpus = read_corpus(CORPUS)
    start = time.perf_counter()
    result = corpus_stats(corpus.entries, model=lm, similarity="js")
    stats_s = time.perf_counter() - start
    stats = result.stats.frame()
    start = time.perf_counter()
    problems: list = []
    importance = corpus_importance(corpus.entries, model=lm, problems=problems).frame()
    importance_s = time.perf_counter() - start
    print("# MiniLM over the project's corpus\n")
    print(
        f"`{lm.display_name}` (6 layers x 12 heads) over the {result.used} sentences of "
        f"`data/sentences.txt` ({len(corpus.problems) + len(result.problems)} not used), made by "
        "`PYTHONPATH=. .venv/bin/python -m bench.corpus_report > docs/corpus.md` "
        f"(statistics and JS similarity {stats_s:.0f} s, importance {importance_s:.0f} s on a "
        "2-core CPU). The same numbers come from the command line:\n"
    )
    print("```bash")
    print("python -m mhsa stats data/sentences.txt --out stats.csv --similarity sim.csv")
    print("python -m mhsa importance data/sentences.txt --out importance.csv")
    print("```\n")
    print_roles(stats)
    print_layers(stats)
    print_similarity(result.similarity.frame())
    print_importance(importance, stats)


if __name__ == "__main__":
    main()

"""What the embedded model shows: MiniLM's most and least important heads over the corpus in
``data/corpus.txt``, and how many heads can be pruned before the sentence embedding moves by
0.05 in cosine (compare Michel et al. 2019: about 40% of BERT's heads on MNLI).

    python -m bench.importance_report

Prints Markdown for docs/IMPORTANCE.md.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import numpy as np

import mhsa
from mhsa.causal.importance import rank_correlation

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus.txt"
THRESHOLD = 0.05


def prunable(curve, order: str) -> tuple[int, float]:
    """Most heads switched off (and that share) with the metric still below THRESHOLD, pruning
    cumulatively in that order."""
    rows = curve[curve["order"] == order].sort_values("heads_pruned")
    below = rows["metric"].to_numpy() < THRESHOLD
    k = int(np.argmin(below)) - 1 if not below.all() else len(rows) - 1  # last step below
    return int(rows["heads_pruned"].iloc[k]), float(rows["fraction_pruned"].iloc[k])


def main() -> None:
    lm = mhsa.load_model("default", device="cpu")
    texts = [ln.strip() for ln in CORPUS.read_text(encoding="utf-8").splitlines() if ln.strip()]
    table = mhsa.causal.head_importance(texts, model=lm, method="ablation", target="embedding")
    stats = mhsa.head_stats([mhsa.attend(t, model=lm) for t in texts])
    ranked = table.sort_values("importance", ascending=False)
    print(f"{len(texts)} sentences from data/corpus.txt, target embedding (1 - cosine), ablation\n")
    print("| rank | head | importance (mean 1 − cos) | std | role (head_stats) | confidence |")
    print("|---|---|---|---|---|---|")
    shown = [*range(5), *range(len(ranked) - 5, len(ranked))]
    for i in shown:
        name = ranked.index[i]
        row = ranked.iloc[i]
        print(
            f"| {i + 1} | {name} | {row['importance']:.4f} | {row['std']:.4f} | "
            f"{stats.loc[name, 'role']} | {stats.loc[name, 'confidence']:.2f} |"
        )
    by_layer = table.groupby("layer")["importance"].mean()
    print("\nmean importance per layer: " + ", ".join(f"L{k} {v:.4f}" for k, v in by_layer.items()))
    rho = rank_correlation(table, stats, "confidence")
    print(f"Spearman(importance, confidence) = {rho:.2f}")
    for seed in (0, 1, 2):
        curve = mhsa.causal.pruning_curve(
            texts, model=lm, target="embedding", importance=table, steps=72, seed=seed
        )
        if seed == 0:
            k, share = prunable(curve, "importance")
            print(
                f"\nimportance order: {k} of 72 heads ({share:.0%}) off with the embedding "
                f"still within {THRESHOLD} of the intact one (mean 1 − cos over the corpus)"
            )
        k, share = prunable(curve, "random")
        print(f"random order (seed {seed}): {k} of 72 heads ({share:.0%})")


if __name__ == "__main__":
    main()

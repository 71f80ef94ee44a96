"""Head analysis on the embedded model (72 heads): statistics, JS similarity, MDS head map,
clustering and rollout, median ms at 32 and 128 tokens.

    python -m bench.bench_stats

Target: all of it under 200 ms at 128 tokens on the 2-core CI machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mhsa
from bench.bench_attend import text_of
from bench.common import median_times, print_table


def analyse(result: mhsa.AttentionResult) -> None:
    mhsa.head_stats(result)
    sim = mhsa.head_similarity(result, metric="js")
    mhsa.head_map(sim)
    mhsa.head_clusters(sim, 6)
    mhsa.attention_rollout(result)


def main() -> None:
    model = mhsa.load_model("default", device="cpu")
    rows = []
    for n in (32, 128, 512):
        r = mhsa.attend(text_of(model, n), model=model)
        sim = mhsa.head_similarity(r)
        t = median_times(
            {
                "all": lambda r=r: analyse(r),
                "stats": lambda r=r: mhsa.head_stats(r),
                "js": lambda r=r: mhsa.head_similarity(r, metric="js"),
                "cosine": lambda r=r: mhsa.head_similarity(r, metric="cosine"),
                "map": lambda s=sim: mhsa.head_map(s),
                "clusters": lambda s=sim: mhsa.head_clusters(s, 6),
                "rollout": lambda r=r: mhsa.attention_rollout(r),
            },
            repeat=11,
        )
        rows.append({"tokens": n, **{f"{k} ms": v * 1e3 for k, v in t.items()}})
        print(rows[-1], flush=True)
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    main()

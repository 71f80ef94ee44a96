"""What ``attend(norms=True)`` adds to ``attend``: MiniLM, 128 and 512 tokens, both engines,
interleaved in one run; and the share of attention on [CLS]/[SEP] by weights and by norms.

    python -m bench.bench_norms

Target: norms add at most 20% (ratio <= 1.2) to ``attend`` with either engine. Timed as this
process's CPU time on one thread (``time.process_time``): on a CPU shared with other work, wall
time swings by 2x from round to round, CPU time hardly (the run prints the load average).
The second table is the README's measurement of Kobayashi et al.'s BERT finding on MiniLM.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

import mhsa
from bench.bench_attend import text_of
from bench.common import median_times, print_table

ENGINES = ("transformers", "mhsa")

#: a few sentences of everyday English for the [CLS]/[SEP] share (README)
SENTENCES = (
    "The cat sat on the mat.",
    "Attention is not only a weight: the norm of the value vector matters too.",
    "She bought three apples, two pears and a melon at the market on Sunday.",
    "Although it was raining, the children played football in the park.",
    "The committee postponed its decision until the next meeting in March.",
)


def timings(model: mhsa.engine.LoadedModel) -> list[dict]:
    """Median ms of ``attend`` without and with norms, per engine and length, interleaved."""
    rows = []
    for n in (128, 512):
        text = text_of(model, n)
        fns = {
            (engine, norms): (
                lambda e=engine, k=norms: mhsa.attend(text, model=model, engine=e, norms=k)
            )
            for engine in ENGINES
            for norms in (False, True)
        }
        named = {f"{e} {k}": fn for (e, k), fn in fns.items()}
        t = median_times(named, budget_s=40.0, clock=time.process_time)
        for engine in ENGINES:
            plain, weighted = t[f"{engine} False"], t[f"{engine} True"]
            rows.append(
                {
                    "tokens": n,
                    "engine": engine,
                    "attend CPU ms": plain * 1e3,
                    "attend(norms=True) CPU ms": weighted * 1e3,
                    "norms/plain": weighted / plain,
                }
            )
            print(rows[-1], flush=True)
    return rows


def special_shares(model: mhsa.engine.LoadedModel) -> list[dict]:
    """Per layer, the share of each query's attention on [CLS] and [SEP], mean over queries,
    heads and ``SENTENCES``: by weights, and by weights times value norms (rows scaled to 1)."""
    by_weight, by_norm, uniform, carried = [], [], [], []
    for sentence in SENTENCES:
        result = mhsa.attend(sentence, model=model, norms=True)
        special = np.array(result.special)
        rows = mhsa.engine.norms_as_attention(result, rows_sum_to_one=True).attention
        by_weight.append(result.attention[..., special].sum(-1).mean(-1))  # (L, H)
        by_norm.append(rows[..., special].sum(-1).mean(-1))
        uniform.append(special.mean())
        a = result.attention.astype(np.float64)
        seen = a > 1e-6
        per_key = np.nanmean(np.where(seen, result.norms / np.where(seen, a, 1), np.nan), 2)
        carried.append((per_key[..., special].mean(), per_key[..., ~special].mean()))
    weight, norm = np.mean(by_weight, 0), np.mean(by_norm, 0)  # (L, H)
    special_norm, other_norm = np.mean(carried, 0)
    print(
        f"uniform attention would give {np.mean(uniform):.3f}; heads with a lower share by "
        f"norm than by weight: {(norm < weight).sum()} of {norm.size}; mean value norm of "
        f"[CLS]/[SEP] {special_norm:.2f}, of the other tokens {other_norm:.2f}"
    )
    layers = [
        {"layer": str(i), "by weight": float(w), "by norm": float(v)}
        for i, (w, v) in enumerate(zip(weight.mean(1), norm.mean(1), strict=True))
    ]
    return [
        *layers,
        {"layer": "all", "by weight": float(weight.mean()), "by norm": float(norm.mean())},
    ]


def main() -> None:
    torch.set_num_threads(1)  # CPU time of one thread: no spinning team threads counted
    model = mhsa.load_model("default", device="cpu")
    print(f"load average before: {os.getloadavg()}")
    rows = timings(model)
    print(f"load average after: {os.getloadavg()}")
    print_table(rows, list(rows[0]))
    print_table(special_shares(model), ["layer", "by weight", "by norm"])


if __name__ == "__main__":
    main()

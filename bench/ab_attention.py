"""Another version of ``mhsa/engine/attention/module.py`` against this one, in one process: paired
calls
(the
two versions adjacent in time, in alternating order), the median of the per-pair ratios and its
interquartile range, so that a shared CPU's load swings hit both alike.

    git show main:mhsa/engine/attention/module.py > /tmp/old_attention.py
    python -m bench.ab_attention /tmp/old_attention.py --threads 1

Ratios below 1.0 mean this version is faster. "no weights (sdpa)" runs the same torch kernel in
both versions: its spread is the noise floor of the machine at the time.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

from mhsa.engine.attention.module import module as new


def _load(path: str):
    spec = importlib.util.spec_from_file_location("old_attention", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def paired(old: Callable[[], object], ours: Callable[[], object], pairs: int) -> tuple[float, ...]:
    """``(old's median seconds, median ours/old, first quartile, third quartile)``."""
    for _ in range(3):
        old(), ours()
    base, ratios = [], []
    for i in range(pairs):
        seconds = {}
        for name, fn in (
            (("old", old), ("new", ours)) if i % 2 == 0 else (("new", ours), ("old", old))
        ):
            start = time.perf_counter()
            fn()
            seconds[name] = time.perf_counter() - start
        base.append(seconds["old"])
        ratios.append(seconds["new"] / seconds["old"])
    ratios.sort()
    n = len(ratios)
    return statistics.median(base), statistics.median(ratios), ratios[n // 4], ratios[3 * n // 4]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("old", help="path of the other attention.py")
    p.add_argument("--pairs", type=int, default=41)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    old = _load(a.old)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for d, heads, b, t in [(384, 12, 1, 128), (384, 12, 1, 512), (384, 12, 8, 128)]:
        torch.manual_seed(0)
        ref = nn.MultiheadAttention(d, heads, batch_first=True).eval()
        o = old.MultiHeadSelfAttention.from_torch(ref).eval()
        n = new.MultiHeadSelfAttention.from_torch(ref).eval()
        x = torch.randn(b, t, d)
        bo, bn = torch.empty(b, heads, t, t), torch.empty(b, heads, t, t)
        cases = {
            "weights": (lambda: o(x), lambda: n(x)),
            "weights buffer (engine)": (lambda: o(x, weights_out=bo), lambda: n(x, weights_out=bn)),
            "causal, weights buffer": (
                lambda: o(x, is_causal=True, weights_out=bo),
                lambda: n(x, is_causal=True, weights_out=bn),
            ),
            "attention_weights": (lambda: o.attention_weights(x), lambda: n.attention_weights(x)),
            "no weights (sdpa)": (
                lambda: o(x, need_weights=False),
                lambda: n(x, need_weights=False),
            ),
        }
        with torch.inference_mode():
            for name, (fo, fn) in cases.items():
                ms, med, q1, q3 = paired(fo, fn, a.pairs)
                print(
                    f"d={d} B={b} T={t:4d} {name:24s} old {ms * 1e3:8.3f} ms  "
                    f"new/old {med:.3f} (IQR {q1:.3f}-{q3:.3f})",
                    flush=True,
                )


if __name__ == "__main__":
    main()

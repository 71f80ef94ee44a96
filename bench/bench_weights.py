"""OV/QK circuits from the weights and "Why here?" (issue 49): their time against one forward
pass of the same model on 64 tokens, interleaved in one run, 1 torch thread, CPU time of this
process (``time.process_time``).

    python -m bench.bench_weights              # everything
    python -m bench.bench_weights --minilm     # the panel on MiniLM only

Targets: every copying score of a 12 x 12 model of GPT-2 small's shape (width 768, 50257
tokens; random weights time as trained ones do) in at most 10 s on one CPU thread; a "Why
here?" panel (``qk_attribution`` of the last layer's head at the last of 64 tokens, then the
panel's summary, ``ui.views.weights.summarised``) in at most 0.3 s, timed on toy:induction, on
GPT-2 small's shape and on the default model (MiniLM, a post-norm encoder). On MiniLM the panel
is timed as the page computes it (``ui.views.weights``: a layer's ``layer_sources`` kept per
text and layer, the terms per head and query), CPU time of this process and wall time, p50
and p95 over ``PANEL_RUNS`` runs after a warm-up: "first click" (a text or layer not seen
yet: the forward pass and the decomposition, then the terms and the summary) and "another
cell" (the same layer's sources kept: another head and query).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

import mhsa
from bench.bench_flow import _random_gpt2
from bench.common import median_times, print_table
from ui.views.weights import summarised

COPYING_TARGET_S, PANEL_TARGET_S = 10.0, 0.3
PANEL_RUNS = 10
MINILM_COLUMNS = ["what", "tokens", "CPU p50 ms", "CPU p95 ms", "wall p50 ms", "wall p95 ms"]


def _rows(name: str, lm: mhsa.engine.LoadedModel, text: str) -> list[dict]:
    ids = lm.tokenizer(text, return_tensors="pt")
    tokens = int(ids["input_ids"].shape[1])
    head = f"L{lm.config.num_hidden_layers - 1}H1"

    def forward() -> None:
        with torch.inference_mode():
            lm.head_model(**ids)

    def panel() -> None:
        terms = mhsa.analysis.qk_attribution.qk_attribution(text, head, model=lm)
        summarised(terms, len(terms.attrs["tokens"]) - 1)

    start = time.process_time()
    mhsa.analysis.ov_copying_scores(lm)  # the first call also builds our module's blocks
    cold = time.process_time() - start
    times = median_times(
        {
            "forward": forward,
            "copying scores (every head)": lambda: mhsa.analysis.ov_copying_scores(lm),
            f"Why here? panel ({head}, last query)": panel,
        },
        repeat=5,
        warmup=1,
        budget_s=120,
        clock=time.process_time,
    )
    times["copying scores, first call"] = cold
    base = times["forward"]
    return [
        {"model": name, "tokens": tokens, "what": what, "ms": 1000 * t, "x forward": t / base}
        for what, t in times.items()
    ]


def _percentiles(fn, runs: int = PANEL_RUNS) -> dict[str, float]:
    """p50 and p95 of ``fn``'s milliseconds over ``runs`` runs after one warm-up, by this
    process's CPU time (the server's time, steady on a shared CPU) and by the wall clock."""
    fn()
    cpu, wall = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    out = {}
    for clock, times in (("CPU", cpu), ("wall", wall)):
        p50, p95 = np.percentile(times, [50, 95])
        out[f"{clock} p50 ms"], out[f"{clock} p95 ms"] = 1000 * p50, 1000 * p95
    return out


def _minilm_panel(text: str) -> list[dict]:
    """The "Why here?" panel on MiniLM at ``text``'s tokens (the page's computation)."""
    lm = mhsa.load_model("default", device="cpu")
    tokens = int(lm.tokenizer(text, return_tensors="pt")["input_ids"].shape[1])
    layer = lm.config.num_hidden_layers - 1
    sources = mhsa.analysis.layer_sources(text, layer, model=lm)
    cells = iter(range(10**6))

    def first_click() -> None:
        fresh = mhsa.analysis.layer_sources(text, layer, model=lm)
        terms = mhsa.analysis.qk_attribution.qk_attribution(
            fresh, (layer, 1), model=lm, query=tokens - 1
        )
        summarised(terms, 0)

    def another_cell() -> None:
        n = next(cells)
        terms = mhsa.analysis.qk_attribution.qk_attribution(
            sources, (layer, n % 12), model=lm, query=n % tokens
        )
        summarised(terms, (7 * n) % tokens)

    def forward() -> None:
        with torch.inference_mode():
            lm.model(**lm.tokenizer(text, return_tensors="pt"))

    rows = []
    for what, fn in (
        ("forward", forward),
        ("first click", first_click),
        ("another cell", another_cell),
    ):
        rows.append({"what": what, "tokens": tokens, **_percentiles(fn)})
    return rows


def main() -> None:
    torch.set_num_threads(1)
    words = " ".join(("the cat sat on the mat and " * 12).split()[:62])  # 64 BERT tokens
    if "--minilm" in sys.argv[1:]:
        print(f"torch threads 1, load {os.getloadavg()[0]:.2f}")
        print_table(_minilm_panel(words), MINILM_COLUMNS)
        return
    toy = mhsa.load_model("toy:induction", device="cpu")
    vocab = [w for w in toy.tokenizer.get_vocab() if not w.startswith("[")][:24]
    rows = _rows("toy:induction", toy, " ".join(vocab + vocab))
    with tempfile.TemporaryDirectory() as folder:
        small = _random_gpt2(f"{folder}/small", n_positions=128)  # GPT-2 small's shape
        rows += _rows("GPT-2 small shape", small, words)
    print(f"torch threads 1, load {os.getloadavg()[0]:.2f}")
    print_table(rows, ["model", "tokens", "what", "ms", "x forward"])
    small_rows = {r["what"]: r["ms"] / 1000 for r in rows if r["model"] == "GPT-2 small shape"}
    copying = small_rows["copying scores, first call"]
    panel = next(v for k, v in small_rows.items() if k.startswith("Why here?"))
    minilm = _minilm_panel(words)
    print(
        "\nMiniLM (the default model), CPU and wall time over", PANEL_RUNS, "runs after a warm-up"
    )
    print_table(minilm, MINILM_COLUMNS)
    first = next(r for r in minilm if r["what"] == "first click")["CPU p95 ms"] / 1000
    for what, seconds, target in (
        ("copying scores of 144 heads (first call)", copying, COPYING_TARGET_S),
        ("Why here? panel at 64 tokens, GPT-2 small shape", panel, PANEL_TARGET_S),
        ("Why here? panel at 64 tokens, MiniLM, first click (CPU p95)", first, PANEL_TARGET_S),
    ):
        verdict = "meets" if seconds <= target else "MISSES"
        print(f"{what}: {seconds:.2f} s, {verdict} the {target:g} s target")


if __name__ == "__main__":
    main()

"""OV/QK circuits from the weights and "Why here?" (issue 49): their time against one forward
pass of the same model on 64 tokens, interleaved in one run, 1 torch thread, CPU time of this
process (``time.process_time``).

    python -m bench.bench_weights

Targets: every copying score of a 12 x 12 model of GPT-2 small's shape (width 768, 50257
tokens; random weights time as trained ones do) in at most 10 s on one CPU thread; a "Why
here?" panel (``qk_attribution`` of the last layer's head at the last of 64 tokens, then the
panel's summary, ``ui.views.weights.summarised``) in at most 0.3 s. The embedded default model
(MiniLM, a post-norm encoder) is refused by ``qk_attribution``: the panel is timed on
toy:induction and on GPT-2 small's shape.
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import mhsa
from bench.bench_flow import _random_gpt2
from bench.common import median_times, print_table
from ui.views.weights import summarised

COPYING_TARGET_S, PANEL_TARGET_S = 10.0, 0.3


def _rows(name: str, lm: mhsa.LoadedModel, text: str) -> list[dict]:
    ids = lm.tokenizer(text, return_tensors="pt")
    tokens = int(ids["input_ids"].shape[1])
    head = f"L{lm.config.num_hidden_layers - 1}H1"

    def forward() -> None:
        with torch.inference_mode():
            lm.head_model(**ids)

    def panel() -> None:
        terms = mhsa.qk_attribution(text, head, model=lm)
        summarised(terms, len(terms.attrs["tokens"]) - 1)

    start = time.process_time()
    mhsa.ov_copying_scores(lm)  # the first call also builds our module's blocks
    cold = time.process_time() - start
    times = median_times(
        {
            "forward": forward,
            "copying scores (every head)": lambda: mhsa.ov_copying_scores(lm),
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


def main() -> None:
    torch.set_num_threads(1)
    words = " ".join(("the cat sat on the mat and " * 12).split()[:62])  # 64 BERT tokens
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
    for what, seconds, target in (
        ("copying scores of 144 heads (first call)", copying, COPYING_TARGET_S),
        ("Why here? panel at 64 tokens, GPT-2 small shape", panel, PANEL_TARGET_S),
    ):
        verdict = "meets" if seconds <= target else "MISSES"
        print(f"{what}: {seconds:.2f} s, {verdict} the {target:g} s target")


if __name__ == "__main__":
    main()

"""mhsa.attend on the embedded model: both engines, 8 to 512 tokens, median ms and ratio.

    python -m bench.bench_attend
    python -m bench.bench_attend families   # tiny random models of issue 39's families


The mhsa engine runs the whole model with every attention block swapped for our module (weights
collected from our modules); ``verify=True`` adds the model's own forward and the comparison.
Target: the mhsa engine end to end, without verify, at most 1.3x the transformers engine;
per family (``families``: a small random model of each family of ``tests.tiny.tiny_family``,
``FAMILY_SIZES``, 128 tokens, saved to a folder and opened by path) at most 1.1x.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mhsa
from bench.common import engine_row, median_times, print_table

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "attention",
    "heads",
    "watch",
]


def text_of(model: mhsa.engine.LoadedModel, n_tokens: int) -> str:
    """A sentence that tokenizes to exactly n_tokens (with [CLS] and [SEP])."""
    words = (WORDS * (n_tokens // len(WORDS) + 2))[: n_tokens - 2]
    text = " ".join(words)
    assert len(model.tokenizer(text)["input_ids"]) == n_tokens
    return text


def main() -> None:
    model = mhsa.load_model("default", device="cpu")
    rows = []
    for n in (8, 32, 128, 512):
        text = text_of(model, n)
        t = median_times(
            {
                "transformers": lambda: mhsa.attend(text, model=model, engine="transformers"),
                "mhsa": lambda: mhsa.attend(text, model=model, engine="mhsa"),
                "verify": lambda: mhsa.attend(text, model=model, engine="mhsa", verify=True),
            }
        )
        rows.append(
            {
                "tokens": n,
                "transformers ms": t["transformers"] * 1e3,
                "mhsa ms": t["mhsa"] * 1e3,
                "mhsa+verify ms": t["verify"] * 1e3,
                "mhsa/transformers": t["mhsa"] / t["transformers"],
                "(mhsa+verify)/transformers": t["verify"] / t["transformers"],
            }
        )
        print(rows[-1], flush=True)
    print_table(rows, list(rows[0]))


#: the benchmark's family models: small rather than tiny, so that the attention's work, not the
#: fixed cost of a call, is what gets compared
FAMILY_SIZES = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
}


def _cpu_medians(fns: dict, repeat: int = 11) -> dict[str, float]:
    """Median CPU seconds of each function, interleaved: on a machine shared with other work
    the process's CPU time (one torch thread) is steadier than the wall clock."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def families(tokens: int = 128) -> None:
    """Both engines on a small random model of each family of ``tests.tiny.FAMILY_MODELS``
    (``FAMILY_SIZES``), CPU time with one torch thread, interleaved, median of 11."""
    import torch

    from tests.tiny import FAMILY_MODELS, save_tiny, tiny_family

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in FAMILY_MODELS:
            built = tiny_family(name, **FAMILY_SIZES)
            model = mhsa.load_model(save_tiny(f"{folder}/{name}", built), device="cpu")
            text = text_of(model, tokens)
            t = _cpu_medians(
                {
                    "transformers": lambda m=model: mhsa.attend(
                        text, model=m, engine="transformers"
                    ),
                    "mhsa": lambda m=model: mhsa.attend(text, model=m, engine="mhsa"),
                }
            )
            rows.append(engine_row(name, t))
            print(rows[-1], flush=True)
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    families() if sys.argv[1:] == ["families"] else main()

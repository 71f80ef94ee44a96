"""Information flow, direct logit attribution and the logit lens (issue 31): their time against
one forward pass of the same model and text, interleaved in one run.

    python -m bench.bench_flow

Models: the shipped toy:induction (2 layers, 4 heads, width 64, 64 syllables), a tiny random
GPT-2 (2 layers, 4 heads, width 32) and a random GPT-2 of GPT-2 small's shape (12 layers, 12
heads, width 768, 50257 tokens; random weights time as trained ones do), at about 64 tokens.
Timed as this process's CPU time (``time.process_time``), steadier than wall time on a shared
CPU.
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import mhsa
from bench.common import median_times, print_table
from mhsa.causal.attribution import head_attribution, logit_lens
from mhsa.causal.flow import flow_contributions, flow_graph
from tests.tiny import save_tiny


def _random_gpt2(folder: str, **sizes: int) -> mhsa.engine.LoadedModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    path = save_tiny(folder, GPT2LMHeadModel(GPT2Config(**sizes)))
    return mhsa.load_model(path, device="cpu")


def _rows(name: str, lm: mhsa.engine.LoadedModel, text: str, answer: str, wrong: str) -> list[dict]:
    tokens = len(lm.tokenizer(text)["input_ids"])
    flow = flow_contributions(text, model=lm)

    def forward() -> None:
        with torch.inference_mode():
            lm.head_model(**{k: v for k, v in lm.tokenizer(text, return_tensors="pt").items()})

    times = median_times(
        {
            "forward": forward,
            "flow contributions": lambda: flow_contributions(text, model=lm),
            "flow graph (threshold)": lambda: flow_graph(flow, threshold=0.04),
            "head attribution": lambda: head_attribution(
                text, model=lm, answer=answer, wrong=wrong
            ),
            "logit lens": lambda: logit_lens(text, model=lm, answer=answer, wrong=wrong),
        },
        repeat=7,
        warmup=1,
        budget_s=60,
        clock=time.process_time,
    )
    base = times["forward"]
    return [
        {
            "model": name,
            "tokens": tokens,
            "what": what,
            "ms": 1000 * t,
            "x forward": t / base,
        }
        for what, t in times.items()
    ]


def main() -> None:
    torch.set_num_threads(1)
    text = ("the cat sat on the mat and " * 12).strip()  # 84 words: 64 tokens kept below
    words = " ".join(text.split()[:62])  # [CLS] + 62 + [SEP] = 64 tokens (BERT tokenizer)
    rows = []
    toy = mhsa.load_model("toy:induction", device="cpu")
    vocab = [w for w in toy.tokenizer.get_vocab() if not w.startswith("[")][:24]
    rows += _rows("toy:induction", toy, " ".join(vocab + vocab), vocab[0], vocab[1])
    with tempfile.TemporaryDirectory() as folder:
        tiny = _random_gpt2(f"{folder}/tiny", n_embd=32, n_layer=2, n_head=4, n_positions=128)
        rows += _rows("tiny GPT-2", tiny, words, "cat", "mat")
        small = _random_gpt2(f"{folder}/small", n_positions=128)  # GPT-2 small's shape
        rows += _rows("GPT-2 small shape", small, words, "cat", "mat")
    print(f"torch threads 1, load {os.getloadavg()[0]:.2f}")
    print_table(rows, ["model", "tokens", "what", "ms", "x forward"])


if __name__ == "__main__":
    main()

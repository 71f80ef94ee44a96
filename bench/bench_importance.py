"""Head importance on the embedded model: leave-one-out of all 72 heads and the gradient,
against the baselines a user would otherwise run, interleaved in one run.

    python -m bench.bench_importance [--device cpu|cuda]

Targets (issue 11): leave-one-out importance of all 72 heads of a 32-token sentence at most
0.5x the time of 72 separate forward passes with one head hooked out; gradient importance at
most 3x one forward pass.

Baselines:
- "72 hooked forwards": the model's own forward, once per head, with a forward pre-hook on that
  layer's output projection zeroing the head's slice of the context (what one writes by hand
  now that transformers has no head_mask), pooling the embedding each time.
- "72 gated forwards": the same through our module (one gate at 0 per forward).
- "one forward": the model's own forward of the sentence (and of the pair, for the gradient of
  the similarity, which needs both sentences).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F

import mhsa
from bench.bench_attend import text_of
from bench.common import median_times, print_table
from mhsa.engine.runs.swap import OurPass, forward_through_ours

PAIR = "A fast brown fox leaps over a sleepy dog."


def _embedding(outputs) -> torch.Tensor:
    return outputs.last_hidden_state[0].mean(0)


def _hooked_forwards(lm, inputs: dict[str, torch.Tensor]) -> None:
    """The model's own forward once per head, a pre-hook zeroing that head's slice."""
    projections = [layer.attention.output.dense for layer in lm.model.encoder.layer]
    d_head = 384 // 12
    with torch.inference_mode():
        intact = _embedding(lm.model(**inputs))
        for proj in projections:
            for head in range(12):

                def zero(_m, a, head=head):
                    x = a[0].clone()
                    x[..., head * d_head : (head + 1) * d_head] = 0
                    return (x,)

                handle = proj.register_forward_pre_hook(zero)
                try:
                    out = _embedding(lm.model(**inputs))
                finally:
                    handle.remove()
                float(1 - F.cosine_similarity(out, intact, dim=0))


def _gated_forwards(lm, inputs: dict[str, torch.Tensor]) -> None:
    """Our module's forward once per head, that head's gate at 0."""
    with torch.inference_mode():
        for layer in range(6):
            for head in range(12):
                gates = torch.ones(12, device=lm.device)
                gates[head] = 0
                run = OurPass(gates={layer: gates}, need_weights=False)
                _embedding(forward_through_ours(lm, inputs, run))


def _gradient_pass(lm, inputs: dict[str, torch.Tensor], probe: torch.Tensor) -> None:
    """One forward and backward through our module for one sentence: d(pooled embedding .
    probe) / d gates, the cost of a gradient importance per sentence the target runs."""
    gates = {layer: torch.ones(12, device=lm.device, requires_grad=True) for layer in range(6)}
    out = forward_through_ours(lm, inputs, OurPass(gates=gates, need_weights=False))
    torch.autograd.grad(_embedding(out) @ probe, list(gates.values()))


def _forwards(lm, *inputs: dict[str, torch.Tensor]) -> None:
    with torch.inference_mode():
        for one in inputs:
            lm.model(**one)


def _candidates(lm, text: str) -> dict[str, Callable[[], object]]:
    """Every timed candidate, by the name ``_rows`` reads."""
    inputs = {k: v.to(lm.device) for k, v in lm.tokenizer(text, return_tensors="pt").items()}
    pair = {k: v.to(lm.device) for k, v in lm.tokenizer(PAIR, return_tensors="pt").items()}
    probe = torch.randn(384, generator=torch.Generator().manual_seed(0)).to(lm.device)
    return {
        "leave-one-out (ours)": lambda: mhsa.causal.head_importance(
            [text], model=lm, method="ablation"
        ),
        "72 hooked forwards": lambda: _hooked_forwards(lm, inputs),
        "72 gated forwards": lambda: _gated_forwards(lm, inputs),
        "gradient (ours, pair)": lambda: mhsa.causal.head_importance(
            [(text, PAIR)], model=lm, method="gradient"
        ),
        "gradient pass, one sentence": lambda: _gradient_pass(lm, inputs, probe),
        "one forward": lambda: _forwards(lm, inputs),
        "pair forward": lambda: _forwards(lm, inputs, pair),
    }


#: (measure, its candidate, baseline, the baseline's candidate, target)
ROWS = [
    ("leave-one-out, 72 heads", "leave-one-out (ours)",
     "72 hooked forwards (model's own)", "72 hooked forwards", "<= 0.5"),
    ("leave-one-out, 72 heads", "leave-one-out (ours)",
     "72 gated forwards (our module)", "72 gated forwards", ""),
    ("gradient, 72 heads (similarity: 2 sentences)", "gradient (ours, pair)",
     "one forward of the sentence", "one forward", "<= 3"),
    ("gradient, 72 heads (similarity: 2 sentences)", "gradient (ours, pair)",
     "forward of both sentences", "pair forward", ""),
    ("gradient pass through our module, one sentence", "gradient pass, one sentence",
     "one forward of the sentence", "one forward", ""),
]  # fmt: skip


def _rows(t: dict[str, float]) -> list[dict]:
    return [
        {
            "measure": measure,
            "ms": t[ours] * 1e3,
            "baseline": baseline,
            "baseline ms": t[base] * 1e3,
            "ratio": t[ours] / t[base],
            "target": target,
        }
        for measure, ours, baseline, base, target in ROWS
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    lm = mhsa.load_model("default", device=args.device)
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else None
    candidates = _candidates(lm, text_of(lm, args.tokens))
    t = median_times(candidates, repeat=11, budget_s=120, sync=sync)
    print(f"{lm.display_name} on {lm.device}, {args.tokens} tokens, torch {torch.__version__}")
    print_table(_rows(t), ["measure", "ms", "baseline", "baseline ms", "ratio", "target"])


if __name__ == "__main__":
    main()

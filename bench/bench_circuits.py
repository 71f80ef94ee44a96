"""Edge attribution and faithfulness curves (``mhsa.circuits``) against plain forward passes of
the model itself, interleaved in one run.

    python -m bench.bench_circuits [--model toy:induction] [--device cpu|cuda] [--threads N]

Targets (issue 40):

- EAP over every edge (``edge_attribution(method="eap")``: a clean and a corrupted forward as
  one batch of two, then one forward and backward with a zero on every receiver input) costs at
  most 3x one forward and backward of the plain model (the metric's gradient with respect to
  its input embeddings).
- A faithfulness curve of MIB's 10 sizes (``faithfulness_curve``: the two texts' runs, then the
  10 circuits as rows of one batch) costs at most the time of 10 plain forwards (one per size,
  as EAP-IG's ``evaluate_graph`` runs per circuit), so ratio <= 1.

Also printed: EAP-IG with its default 5 steps and "exact" (every edge alone, 32 per pass),
against the same baseline.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import mhsa
from bench.common import median_times, print_table

#: a repeat of 10 symbols up to its 5th, and the same with that symbol's first occurrence
#: replaced (the test's pair: the induction head's key no longer matches)
TOY = (
    "ba ke mo di fu lo ni pa su te ba ke mo di fu",
    "ba ke mo di ra lo ni pa su te ba ke mo di fu",
    "lo",
    "ba",
)


def _plain(lm: mhsa.LoadedModel, text: str, answer: str, wrong: str, backward: bool) -> float:
    """One forward (and backward) of the plain model: the metric at the last position."""
    tok = lm.tokenizer
    inputs = tok(text, return_tensors="pt").to(lm.device)
    a, w = (tok(" " + t, add_special_tokens=False)["input_ids"][0] for t in (answer, wrong))
    embed = lm.head_model.get_input_embeddings()
    with torch.set_grad_enabled(backward):
        embeddings = embed(inputs["input_ids"]).detach().requires_grad_(backward)
        logits = lm.head_model(inputs_embeds=embeddings).logits[0, -1]
        value = logits[a] - logits[w]
        if backward:
            value.backward()
    return float(value.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toy:induction")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = mhsa.load_model(args.model, device=args.device)
    clean, corrupted, answer, wrong = TOY
    kw = {"model": lm, "answer": answer, "wrong": wrong}
    scores = mhsa.edge_attribution(clean, corrupted, **kw)
    edges = len(scores)
    times = median_times(
        {
            "forward+backward": lambda: _plain(lm, clean, answer, wrong, True),
            "10 forwards": lambda: [_plain(lm, clean, answer, wrong, False) for _ in range(10)],
            "eap": lambda: mhsa.edge_attribution(clean, corrupted, **kw),
            "eap-ig (5 steps)": lambda: mhsa.edge_attribution(
                clean, corrupted, method="eap-ig", **kw
            ),
            "exact": lambda: mhsa.edge_attribution(clean, corrupted, method="exact", **kw),
            "curve (10 sizes)": lambda: mhsa.faithfulness_curve(clean, corrupted, scores, **kw),
        },
        repeat=11,
        budget_s=60,
    )
    one, ten = times["forward+backward"], times["10 forwards"]
    rows = [
        {"what": name, "ms": 1000 * t, "baseline": base, "ratio": t / ref, "target": target}
        for name, t, base, ref, target in (
            ("eap", times["eap"], "forward+backward", one, "<= 3"),
            ("eap-ig (5 steps)", times["eap-ig (5 steps)"], "forward+backward", one, ""),
            ("exact", times["exact"], "forward+backward", one, ""),
            ("curve (10 sizes)", times["curve (10 sizes)"], "10 forwards", ten, "<= 1"),
        )
    ]
    print(
        f"{lm.display_name}: {edges} edges; forward+backward {1000 * one:.1f} ms, 10 forwards "
        f"{1000 * ten:.1f} ms"
    )
    print_table(rows, ["what", "ms", "baseline", "ratio", "target"])


if __name__ == "__main__":
    main()

"""Head roles on the embedded model (72 heads): detection on 10 sentences, the random-token
induction test, sinks and composition, median ms, each against ``mhsa.attend`` of the same
sentences one by one (the attention alone) in the same run.

    python -m bench.bench_roles

Target: detection of 72 heads on 10 sentences under 1 s on the 2-core CI machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import mhsa
from bench.common import median_times, print_table

SENTENCES = Path(__file__).resolve().parent.parent / "data" / "sentences.txt"
#: detection's target, seconds
TARGET_S = 1.0


def main() -> None:
    model = mhsa.load_model("default", device="cpu")
    texts = SENTENCES.read_text(encoding="utf-8").splitlines()[:10]
    result = mhsa.attend(texts[0], model=model)
    times = median_times(
        {
            "attend x10": lambda: [mhsa.attend(t, model=model) for t in texts],
            "previous token": lambda: mhsa.detect_heads(texts, "previous token", model=model),
            "induction": lambda: mhsa.detect_heads(texts, "induction", model=model),
            "induction, mhsa engine": lambda: mhsa.detect_heads(
                texts, "induction", model=model, engine="mhsa"
            ),
            "random tokens (10 x 100)": lambda: mhsa.detect_heads(None, model=model),
            "sinks (1 sentence)": lambda: mhsa.analysis.attention_sinks(result),
            "K composition": lambda: mhsa.analysis.head_composition(model, "K"),
        },
        repeat=11,
    )
    base = times["attend x10"]
    rows = [
        {"what": name, "ms": seconds * 1e3, "x attend x10": seconds / base}
        for name, seconds in times.items()
    ]
    print_table(rows, ["what", "ms", "x attend x10"])
    detection = max(times["previous token"], times["induction"])
    verdict = "meets" if detection <= TARGET_S else "MISSES"
    print(
        f"\ndetection of 72 heads on 10 sentences: {detection * 1e3:.0f} ms, {verdict} the "
        f"{TARGET_S:.0f} s target; {detection / base:.2f} x attend of the same sentences"
    )


if __name__ == "__main__":
    main()

"""Activation patching of every head, batched as leave-one-out, against the TransformerLens way:
one forward pass per head with a hook on the plain model, interleaved in one run.

    python -m bench.bench_patching [--device cpu|cuda] [--tokens 32] [--threads N]

Target (issue 31): all heads patched (``mhsa.causal.patch_heads``) in at most 0.5x the time of one
hooked forward per head, on the embedded MiniLM (a sentence of ``--tokens`` tokens, one word
swapped; metric: cosine to the clean embedding) and on ``toy:induction`` (a repeat and the
repeat broken; metric: a logit difference).

Baseline ("hooked forwards", as ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos``
runs): one clean forward caching every layer's concatenated heads (a pre-hook on each output
projection), then for each head one corrupted forward of the model's own eager attention with a
pre-hook writing the clean slice of that head into its output projection's input, and the metric
of each. Both sides include the clean and corrupted runs.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import torch.nn.functional as F

import mhsa
from bench.bench_attend import text_of
from bench.common import median_times, print_table


def _output_projection(lm: mhsa.engine.LoadedModel, layer: int) -> torch.nn.Module:
    """The module whose input is ``layer``'s concatenated heads (BERT, GPT-2, Llama)."""
    model = lm.model
    if hasattr(model, "layers"):
        return model.layers[layer].self_attn.o_proj
    if hasattr(model, "h"):
        return model.h[layer].attn.c_proj
    return model.encoder.layer[layer].attention.output.dense


def _metric(lm: mhsa.engine.LoadedModel, answer: str | None, wrong: str | None) -> Callable:
    """The metric ``patch_heads`` uses, on the plain model's outputs."""
    if answer is None or wrong is None:

        def cosine(inputs, reference):
            pooled = lm.model(**inputs).last_hidden_state[0].mean(0)
            return pooled if reference is None else F.cosine_similarity(pooled, reference, dim=0)

        return cosine
    a, w = (
        lm.tokenizer(" " + t, add_special_tokens=False)["input_ids"][0] for t in (answer, wrong)
    )

    def logit_difference(inputs, _reference):
        logits = lm.head_model(**inputs).logits[0, -1]
        return logits[a] - logits[w]

    return logit_difference


def hooked_forwards(
    lm: mhsa.engine.LoadedModel, clean: str, corrupted: str, answer: str | None, wrong: str | None
) -> np.ndarray:
    """Every head patched by hand, one hooked forward per head (the baseline)."""
    tok = lm.tokenizer
    ids = [tok(t, return_tensors="pt").to(lm.device) for t in (clean, corrupted)]
    metric = _metric(lm, answer, wrong)
    layers = lm.config.num_hidden_layers
    heads = lm.config.num_attention_heads
    d_head = lm.config.hidden_size // heads
    cache: dict[int, torch.Tensor] = {}

    def keep(layer: int):
        def hook(_m, args):
            cache[layer] = args[0].detach()

        return hook

    out = np.zeros((layers, heads))
    with torch.inference_mode():
        handles = [
            _output_projection(lm, i).register_forward_pre_hook(keep(i)) for i in range(layers)
        ]
        try:
            clean_value = metric(ids[0], None)  # the clean run fills the cache
        finally:
            for h in handles:
                h.remove()
        reference = clean_value if answer is None else None  # encoders: cosine to the clean run
        for layer in range(layers):
            for head in range(heads):
                cols = slice(head * d_head, (head + 1) * d_head)

                def patch(_m, args, layer=layer, cols=cols):
                    x = args[0].clone()
                    x[..., cols] = cache[layer][..., cols]
                    return (x, *args[1:])

                handle = _output_projection(lm, layer).register_forward_pre_hook(patch)
                try:
                    out[layer, head] = float(metric(ids[1], reference))
                finally:
                    handle.remove()
    return out


def _toy_texts(lm: mhsa.engine.LoadedModel) -> tuple[str, str, str, str]:
    """A repeat of 12 symbols up to its 8th, and the same with the symbol before the answer's
    first occurrence replaced; the answer and a wrong one."""
    symbols = sorted(w for w in lm.tokenizer.get_vocab() if not w.startswith("["))
    half = list(np.random.default_rng(0).choice(symbols, size=12, replace=False))
    unused = [s for s in symbols if s not in half]
    broken = [*half[:7], unused[0], *half[8:]]
    return " ".join(half + half[:8]), " ".join(broken + half[:8]), half[8], unused[1]


def _minilm_texts(lm: mhsa.engine.LoadedModel, tokens: int) -> tuple[str, str, None, None]:
    clean = text_of(lm, tokens)
    words = clean.split()
    corrupted = " ".join([*words[:2], "dog", *words[3:]])
    assert len(lm.tokenizer(corrupted)["input_ids"]) == tokens
    return clean, corrupted, None, None


def _case(lm: mhsa.engine.LoadedModel, texts: tuple) -> dict[str, Callable[[], object]]:
    clean, corrupted, answer, wrong = texts
    kwargs = {"model": lm, "answer": answer, "wrong": wrong}
    return {
        "batched": lambda: mhsa.causal.patch_heads(clean, corrupted, **kwargs),
        "hooked": lambda: hooked_forwards(lm, clean, corrupted, answer, wrong),
        "attribution": lambda: mhsa.causal.attribution_patching(clean, corrupted, **kwargs),
    }


def _check(lm: mhsa.engine.LoadedModel, texts: tuple) -> float:
    """Largest difference between the two ways' patched metrics (they must agree)."""
    clean, corrupted, answer, wrong = texts
    ours = mhsa.causal.patch_heads(clean, corrupted, model=lm, answer=answer, wrong=wrong)
    hand = hooked_forwards(lm, clean, corrupted, answer, wrong)
    return float(np.abs(ours["patched"].to_numpy() - hand.reshape(-1)).max())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in ("default", "toy:induction"):
        lm = mhsa.load_model(name, device=args.device)
        texts = _toy_texts(lm) if name.startswith("toy:") else _minilm_texts(lm, args.tokens)
        sync = torch.cuda.synchronize if lm.device.type == "cuda" else None
        t = median_times(_case(lm, texts), repeat=11, budget_s=90, sync=sync)
        tokens = len(lm.tokenizer(texts[0])["input_ids"])
        heads = lm.config.num_hidden_layers * lm.config.num_attention_heads
        rows.append(
            {
                "model": f"{lm.display_name} ({tokens} tokens, {heads} heads)",
                "batched ms": t["batched"] * 1e3,
                "hooked forwards ms": t["hooked"] * 1e3,
                "ratio": t["batched"] / t["hooked"],
                "target": "<= 0.5",
                "attribution ms": t["attribution"] * 1e3,
                "max |diff|": f"{_check(lm, texts):.1e}",
            }
        )
    print(f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    columns = ["model", "batched ms", "hooked forwards ms", "ratio", "target", "attribution ms"]
    print_table(rows, [*columns, "max |diff|"])


if __name__ == "__main__":
    main()

"""Long inputs on a real-size model shape: time and peak memory of ``attend`` with one layer
selected, against the plain transformers sdpa forward.

    python -m bench.bench_long [--tokens 2048 4096] [--layers 4] [--cases plain,...]
    python -m bench.bench_long --tokens 4096 --layers 22 --cases plain,one-layer   # 1.1B shape

A random model of TinyLlama-1.1B's shape (width 2048, 32 heads, 4 key/value heads, feed-forward
5632, vocabulary 32000; ``--layers`` of them), seeded. Every case runs in a fresh subprocess
(``python -m bench.bench_long --child CASE``) that builds the model, runs the case once and
reports the seconds of the forward (wall and this process's CPU time: the machine is shared)
and its peak RSS (``VmHWM``), besides the RSS once the model was built. Cases:

- ``plain``: ``model(input_ids)`` with transformers' sdpa attention (the baseline);
- ``one-layer``: ``attend(layers=<last>)`` with the ``transformers`` engine (the last layer:
  the pass cannot stop early);
- ``one-layer-mhsa``: the same with the ``mhsa`` engine;
- ``all-float16``: ``attend(attention_dtype="float16")``, every layer kept in 16 bits;
- ``all-float32``: ``attend()`` as before this selection existed (every layer, float32).

The targets (issue 41): one layer selected, time <= 1.3x plain and peak <= plain's peak +
1.5x the selected layer's float32 attention; every layer in float16, peak <= plain's peak +
1.2x that attention. The parent prints one row per case with those bounds.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

SHAPE = {
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "intermediate_size": 5632,
    "vocab_size": 32000,
}
CASES = ("plain", "one-layer", "one-layer-mhsa", "all-float16", "all-float32")


def _status_mb(field: str) -> float:
    """One memory line of ``/proc/self/status``, MiB: ``VmHWM`` (this process's peak resident
    memory) or ``VmRSS`` (its resident memory now)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def build(layers: int, tokens: int, device: str = "cpu", dtype=None):
    """The seeded random model (eager attention, as ``load_model`` loads) on ``device`` (in
    ``dtype``, a ``torch.dtype``, when given) and a ``LoadedModel`` around it with the embedded
    model's tokenizer (``bench.bench_long_gpu`` builds its model here too)."""
    import threading

    import torch
    import transformers as tf

    import mhsa
    from mhsa.engine.models.loading import LoadedModel

    torch.manual_seed(0)
    config = tf.LlamaConfig(
        **SHAPE, num_hidden_layers=layers, max_position_embeddings=max(tokens, 2048)
    )
    config._attn_implementation = "eager"
    model = tf.LlamaModel(config)
    if device != "cpu" or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    model = model.eval().requires_grad_(False)
    tokenizer = tf.AutoTokenizer.from_pretrained(mhsa.engine.models.loading.default_model_path())
    return LoadedModel(
        name="tinyllama-shape",
        display_name="tinyllama-shape",
        model=model,
        tokenizer=tokenizer,
        device=torch.device(device),
        num_parameters=sum(p.numel() for p in model.parameters()),
        load_seconds=0.0,
        lock=threading.Lock(),
    )


def long_text(tokens: int) -> str:
    """A text of ``tokens`` words, the same sentence again and again."""
    words = "the model reads a long text and every head looks somewhere else in it".split()
    return " ".join(words[i % len(words)] for i in range(tokens))


def child(case: str, layers: int, tokens: int) -> dict:
    """Run one case in this (fresh) process and report it."""
    import torch

    import mhsa

    lm = build(layers, tokens)
    model_mb = _status_mb("VmRSS")
    text = long_text(tokens)
    last = layers - 1
    runs = {
        "one-layer": lambda: mhsa.attend(text, model=lm, max_tokens=tokens, layers=last),
        "one-layer-mhsa": lambda: mhsa.attend(
            text, model=lm, max_tokens=tokens, layers=last, engine="mhsa"
        ),
        "all-float16": lambda: mhsa.attend(
            text, model=lm, max_tokens=tokens, attention_dtype="float16"
        ),
        "all-float32": lambda: mhsa.attend(text, model=lm, max_tokens=tokens),
    }
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if case == "plain":
        ids = mhsa.engine.encoding.encode(lm, text, None, tokens).inputs["input_ids"]
        lm.model.set_attn_implementation("sdpa")
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with torch.inference_mode():
            lm.model(input_ids=ids, use_cache=False)
        kept = 0.0
    else:
        result = runs[case]()
        kept = result.attention.nbytes / 2**20
    return {
        "case": case,
        "layers": layers,
        "tokens": tokens,
        "wall_s": time.perf_counter() - wall0,
        "cpu_s": time.process_time() - cpu0,
        "model_mb": model_mb,
        "peak_mb": _status_mb("VmHWM"),
        "kept_mb": kept,
    }


def run_case(case: str, layers: int, tokens: int) -> dict:
    command = ["-m", "bench.bench_long", "--child", case]
    out = subprocess.run(
        [sys.executable, *command, "--layers", str(layers), "--tokens", str(tokens)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--cases", default="plain,one-layer,one-layer-mhsa,all-float16")
    parser.add_argument("--child", choices=CASES)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.layers, args.tokens[0])))
        return
    from bench.common import print_table

    heads = SHAPE["num_attention_heads"]
    rows = []
    for tokens in args.tokens:
        layer_mb = heads * tokens * tokens * 4 / 2**20  # one layer's float32 attention
        found = {}
        for case in args.cases.split(","):
            found[case] = run_case(case, args.layers, tokens)
            print(json.dumps(found[case]), file=sys.stderr, flush=True)  # as each ends
        plain = found.get("plain")
        for case, r in found.items():
            row = {
                "case": case,
                "layers": args.layers,
                "tokens": tokens,
                "wall s": r["wall_s"],
                "cpu s": r["cpu_s"],
                "model MB": r["model_mb"],
                "peak MB": r["peak_mb"],
                "kept MB": r["kept_mb"],
                "time / plain": "",
                "peak bound MB": "",
            }
            if plain is not None and case != "plain":
                row["time / plain"] = f"{r['wall_s'] / plain['wall_s']:.2f} wall, " + (
                    f"{r['cpu_s'] / plain['cpu_s']:.2f} cpu"
                )
                extra = 1.5 * layer_mb if case.startswith("one-layer") else 1.2 * r["kept_mb"]
                bound = plain["peak_mb"] + extra
                met = "met" if r["peak_mb"] <= bound else "NOT met"
                row["peak bound MB"] = f"{bound:.0f} ({met})"
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print_table(rows, list(rows[0]))
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\n(largest child's ru_maxrss: {children.ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()

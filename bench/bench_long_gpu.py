"""Long inputs on a GPU: the whole TinyLlama-1.1B shape (22 layers) at 4096 tokens, ``attend``
with one layer selected (and every layer in float16) against the plain sdpa forward, in one
process, same model, interleaved.

    python -m bench.bench_long_gpu [--tokens 4096] [--layers 22] [--dtype float16] [--repeats 3]

Reports each case's median wall time (CUDA synchronised: ``attend`` returns numpy arrays, and
the plain forward is followed by ``torch.cuda.synchronize``), its ratio to the plain forward, and
the peak GPU memory allocated (``torch.cuda.max_memory_allocated``) against the plain forward's
peak plus the selected layer's attention in float32. The model is random (seeded) with
TinyLlama's shape (``bench.bench_long.SHAPE``) in ``--dtype`` on the GPU; the tokenizer is the
embedded model's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench import bench_long


def build(layers: int, tokens: int, dtype: torch.dtype):
    """The seeded random TinyLlama-shape model in ``dtype`` on the GPU (``bench_long.build``)."""
    return bench_long.build(layers, tokens, device="cuda", dtype=dtype)


def main(argv: list[str] | None = None) -> None:
    import mhsa

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--all-float16", action="store_true", help="also every layer in 16 bits")
    args = parser.parse_args(argv)
    lm = build(args.layers, args.tokens, getattr(torch, args.dtype))
    text, n, last = bench_long.long_text(args.tokens), args.tokens, args.layers - 1
    ids = mhsa.engine.encoding.encode(lm, text, None, n).inputs["input_ids"].cuda()

    def plain() -> None:
        lm.model.set_attn_implementation("sdpa")
        try:
            with torch.inference_mode():
                lm.model(input_ids=ids, use_cache=False)
            torch.cuda.synchronize()
        finally:
            lm.model.set_attn_implementation("eager")

    cases = {
        "plain sdpa forward": plain,
        "one layer, transformers": lambda: mhsa.attend(text, model=lm, max_tokens=n, layers=last),
        "one layer, mhsa": lambda: mhsa.attend(
            text, model=lm, max_tokens=n, layers=last, engine="mhsa"
        ),
    }
    if args.all_float16:
        cases["every layer, float16"] = lambda: mhsa.attend(
            text, model=lm, max_tokens=n, attention_dtype="float16"
        )
    times: dict[str, list[float]] = {name: [] for name in cases}
    peaks: dict[str, float] = {}
    for name, run in cases.items():  # warm-up, and each case's peak memory
        torch.cuda.reset_peak_memory_stats()
        run()
        peaks[name] = torch.cuda.max_memory_allocated() / 2**20
    for _ in range(args.repeats):  # interleaved
        for name, run in cases.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    layer_mb = bench_long.SHAPE["num_attention_heads"] * n * n * 4 / 2**20
    base = statistics.median(times["plain sdpa forward"])
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.layers} layers, "
        f"{n} tokens, weights {args.dtype}; one layer's float32 attention {layer_mb:.0f} MiB"
    )
    print(f"{'case':28s} {'median s':>9s} {'x plain':>8s} {'GPU peak MiB':>13s} {'bound':>8s}")
    for name in cases:
        t = statistics.median(times[name])
        bound = peaks["plain sdpa forward"] + 1.5 * layer_mb
        shown = f"{bound:8.0f}" if name.startswith("one layer") else f"{'':8s}"
        print(f"{name:28s} {t:9.3f} {t / base:8.2f} {peaks[name]:13.0f} {shown}")


if __name__ == "__main__":
    main()

"""Our MultiHeadSelfAttention against torch.nn.MultiheadAttention and the bare SDPA limit.

    python -m bench.bench_attention                  # CPU float32, the issue's table
    python -m bench.bench_attention --device cuda --dtype bfloat16 --lengths 128 512 1024 2048 4096

Ratios below 1.0 mean ours is faster. "bare" is F.linear + scaled_dot_product_attention + F.linear
with the same weights: the least any module computing this can do.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from bench.common import median_times, print_table
from mhsa import MultiHeadSelfAttention


def bare_limit(x: torch.Tensor, ours: MultiHeadSelfAttention) -> torch.Tensor:
    b, t, d = x.shape
    h = ours.num_heads
    qkv = F.linear(x, ours.qkv.weight, ours.qkv.bias).view(b, t, 3, h, d // h)  # (B, T, 3, H, Dh)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, Dh)
    ctx = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, Dh)
    return F.linear(ctx.transpose(1, 2).reshape(b, t, d), ours.out.weight, ours.out.bias)


def run(
    device: str,
    dtype: torch.dtype,
    batches: list[int],
    lengths: list[int],
    d_models: list[int],
    heads: int,
    with_weights: bool,
) -> list[dict]:
    sync = torch.cuda.synchronize if device == "cuda" else None
    rows = []
    for d_model in d_models:
        torch.manual_seed(0)
        ref = nn.MultiheadAttention(d_model, heads, batch_first=True).to(device, dtype).eval()
        ours = MultiHeadSelfAttention.from_torch(ref).to(device, dtype).eval()
        for batch in batches:
            for length in lengths:
                x = torch.randn(batch, length, d_model, device=device, dtype=dtype)
                fns = {
                    "ours": lambda: ours(x, need_weights=False),
                    "torch": lambda: ref(x, x, x, need_weights=False),
                    "bare": lambda: bare_limit(x, ours),
                }
                if with_weights:
                    fns["ours_w"] = lambda: ours(x)
                    fns["torch_w"] = lambda: ref(
                        x, x, x, need_weights=True, average_attn_weights=False
                    )
                with torch.inference_mode():
                    t = median_times(fns, sync=sync)
                row = {
                    "d_model": d_model,
                    "batch": batch,
                    "seq": length,
                    "ours ms": t["ours"] * 1e3,
                    "nn.MHA ms": t["torch"] * 1e3,
                    "bare ms": t["bare"] * 1e3,
                    "ours/nn.MHA": t["ours"] / t["torch"],
                    "ours/bare": t["ours"] / t["bare"],
                }
                if with_weights:
                    row |= {
                        "ours+w ms": t["ours_w"] * 1e3,
                        "nn.MHA+w ms": t["torch_w"] * 1e3,
                        "ours+w/nn.MHA+w": t["ours_w"] / t["torch_w"],
                    }
                rows.append(row)
                print(row, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512, 1024])
    p.add_argument("--d-models", type=int, nargs="+", default=[384, 768])
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--no-weights", action="store_true", help="skip the need_weights=True columns")
    a = p.parse_args()
    print(
        f"torch {torch.__version__}, device {a.device}, dtype {a.dtype}, "
        f"threads {torch.get_num_threads()}"
    )
    rows = run(
        a.device,
        getattr(torch, a.dtype),
        a.batches,
        a.lengths,
        a.d_models,
        a.heads,
        not a.no_weights,
    )
    cols = [
        "d_model",
        "batch",
        "seq",
        "ours ms",
        "nn.MHA ms",
        "bare ms",
        "ours/nn.MHA",
        "ours/bare",
    ]
    if not a.no_weights:
        cols += ["ours+w ms", "nn.MHA+w ms", "ours+w/nn.MHA+w"]
    print_table(rows, cols)
    worst = {c: max(r[c] for r in rows) for c in cols if "/" in c}
    print("worst ratios:", {k: round(v, 3) for k, v in worst.items()})


if __name__ == "__main__":
    main()

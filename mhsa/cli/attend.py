"""``attend``: per-head attention of one text, summarised and saved (``mhsa.attend``), and
drawn as a self-contained page (``AttentionResult.to_html``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mhsa.cli.common import add_model_options

#: the views ``--html`` draws (``mhsa.plots.notebook.VIEWS``, not imported: plotly stays out of
#: the command line's start)
VIEWS = ("heads", "line", "neuron")

EXAMPLES = (
    'python -m mhsa attend "The cat sat on the mat." --engine mhsa --out cat.npz',
    'python -m mhsa attend "$(cat long.txt)" --model MODEL --layers 2 --heads 0-7 '
    "--dtype float16 --out long.npz",
    'python -m mhsa attend "The cat sat on the mat." --qk --out cat.npz --html cat.html '
    "--view neuron",
)
HELP = "compute per-head attention of a text and save it"


def add_arguments(attend: argparse.ArgumentParser) -> None:
    from mhsa.engine.extract import ENGINES

    attend.add_argument("text", help="the sentence")
    add_model_options(attend)
    attend.add_argument("--engine", default="transformers", choices=ENGINES)
    attend.add_argument("--max-tokens", type=int, default=None, help="truncate to this many tokens")
    attend.add_argument("--pair", default=None, help="second segment / decoder text")
    attend.add_argument("--seed", type=int, default=0, help="seed of the mhsa-random engine")
    attend.add_argument(
        "--verify",
        action="store_true",
        help="mhsa engine: also run the model's own forward and print the differences",
    )
    attend.add_argument(
        "--norms",
        action="store_true",
        help="also compute attention weighted by value norm (Kobayashi et al. 2020), saved "
        "with --out as the result's norms",
    )
    attend.add_argument(
        "--qk",
        action="store_true",
        help="also keep each head's query and key vectors (one more pass through our module), "
        "saved with --out: the neuron view draws them (mhsa.attend(qk=True))",
    )
    attend.add_argument(
        "--layers",
        default=None,
        help="long inputs: only these layers (2, 0-3,8); the others run a fused kernel",
    )
    attend.add_argument("--heads", default=None, help="only these heads of each layer (0-7)")
    attend.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float16", "bfloat16"),
        help="the weights' storage dtype",
    )
    attend.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the result (.npz; with --layers, --heads or --dtype written layer by layer)",
    )
    attend.add_argument(
        "--html",
        type=Path,
        default=None,
        help="write the result's view as one self-contained HTML page (opens offline)",
    )
    attend.add_argument(
        "--view",
        default="heads",
        choices=VIEWS,
        help="the view --html draws: every head's map, lines between tokens, or the neuron "
        "view (Vig 2019: the query and key vectors; it turns on --qk)",
    )


def _streamed(args: argparse.Namespace) -> bool:
    """A selection written to ``--out``: layer by layer (``mhsa.engine.runs.layer_files``), never
    held."""
    selected = args.layers is not None or args.heads is not None or args.dtype != "float32"
    held = args.verify or args.norms or args.pair or _wants_qk(args) or args.html
    return bool(args.out) and selected and not held


def _wants_qk(args: argparse.Namespace) -> bool:
    """``--qk``, or the neuron view asked for (it draws the vectors)."""
    return bool(args.qk or (args.html and args.view == "neuron"))


def _selection(args: argparse.Namespace) -> dict:
    """The model, engine, device, tokens, layers, heads, dtype and seed that both ways of
    running (``mhsa.attend``, ``mhsa.engine.runs.layer_files.save_layers``) take."""
    return {
        "model": args.model,
        "engine": args.engine,
        "device": args.device,
        "max_tokens": args.max_tokens,
        "layers": args.layers,
        "heads": args.heads,
        "attention_dtype": args.dtype,
        "seed": args.seed,
    }


def _run_streamed(args: argparse.Namespace) -> None:
    from mhsa.engine.runs.layer_files import save_layers

    start = time.perf_counter()
    header = save_layers(args.out, args.text, **_selection(args))
    print(f"model    {header.model} ({header.num_parameters:,} parameters) on {header.device}")
    print(f"tokens   {len(header.tokens)}")
    if header.truncated_tokens:
        print(f"         ({header.truncated_tokens} tokens dropped by truncation)")
    print(f"time     {time.perf_counter() - start:.2f} s, the file written layer by layer")
    print(f"wrote    {args.out}")


def run(args: argparse.Namespace) -> None:
    import mhsa

    if _streamed(args):
        _run_streamed(args)
        return
    r = mhsa.attend(
        args.text,
        text_pair=args.pair,
        verify=args.verify,
        norms=args.norms,
        qk=_wants_qk(args),
        **_selection(args),
    )
    print(f"model    {r.model} ({r.num_parameters:,} parameters) on {r.device}, engine {r.engine}")
    print(f"tokens   {len(r.tokens)}: {' '.join(r.tokens)}")
    if r.truncated_tokens:
        print(f"         ({r.truncated_tokens} tokens dropped by truncation)")
    print(f"shape    {list(r.attention.shape)} [layers, heads, query, key]")
    if r.is_partial or r.attention_dtype != "float32":
        print(f"kept     {r.materialised}")
    print(f"time     load {r.timings['load']:.2f} s, forward {r.timings['forward'] * 1e3:.1f} ms")
    if r.max_abs_diff is not None:
        layers = ", ".join(f"{d:.1e}" for d in r.layer_max_abs_diff or [])
        print(f"agrees   max |ours - model| attention per layer: {layers}")
        for kind in ("decoder", "cross"):  # encoder-decoders: the other two attentions
            diffs = getattr(r, f"{kind}_layer_max_abs_diff")
            if diffs is not None:
                print(
                    f"         {kind} attention per layer: {', '.join(f'{d:.1e}' for d in diffs)}"
                )
        if r.encoder_hidden_max_abs_diff is not None:
            print(f"         encoder final hidden state: {r.encoder_hidden_max_abs_diff:.1e}")
        print(f"         final hidden state: {r.hidden_max_abs_diff:.1e}")
    if r.norms is not None:
        print(f"norms    {list(r.norms.shape)} weight x value norm, largest {r.norms.max():.3g}")
    if r.q is not None and r.k is not None:
        print(f"q, k     {list(r.q.shape)} and {list(r.k.shape)} [layers, heads, token, d_head]")
    if args.out:
        print(f"wrote    {r.save(args.out)}")
    if args.html:
        print(f"wrote    {r.to_html(args.html, args.view)} ({args.view} view)")

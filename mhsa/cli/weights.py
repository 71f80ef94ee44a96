"""``weights``: what each head's weights do, without a text (``mhsa.analysis.weights``): the
copying score of its full OV circuit (Elhage et al. 2021), the tokens its OV circuit raises
most, or the previous-token score of its positional QK pattern, as CSV."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mhsa.cli.common import add_model_options, wrote

EXAMPLES = (
    "python -m mhsa weights --copying --model toy:induction",
    "python -m mhsa weights --top-tokens L1H0 --k 5 --model toy:induction --out top.csv",
)
HELP = "OV and QK circuits from the weights: copying scores, top tokens, positions (CSV)"
DESCRIPTION = (
    "From the weights alone (TransformerLens's weight processing). --copying: each head's "
    "copying score, sum(Re lambda) / sum(|lambda|) over the eigenvalues of its full OV "
    "circuit W_E W_V W_O W_U (W_V W_O for an encoder without an unembedding). --top-tokens "
    "HEAD: for each input token, the output tokens the head's OV circuit raises most. "
    "--positional: each head's previous-token score of its positional QK pattern (learned "
    "absolute positions only; a post-norm encoder's through its embedding LayerNorm). The CSV "
    "goes to --out, else to the standard output."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--copying", action="store_true", help="copying score per head")
    what.add_argument("--top-tokens", metavar="HEAD", help="top tokens of one head (L1H3)")
    what.add_argument(
        "--positional", action="store_true", help="previous-token score of the positional pattern"
    )
    add_model_options(parser)
    parser.add_argument("--k", type=int, default=10, help="top tokens per input token")
    parser.add_argument(
        "--tokens", nargs="+", default=None, help="input tokens (default: the common ones)"
    )
    parser.add_argument(
        "--n-positions", type=int, default=64, help="the positional pattern's first N positions"
    )
    parser.add_argument("--out", type=Path, default=None, help="the CSV (default: stdout)")


def run(args: argparse.Namespace) -> None:
    import mhsa

    lm = mhsa.load_model(args.model, device=args.device)
    if args.copying:
        scores = mhsa.analysis.ov_copying_scores(lm)
        table, what = scores.to_frame(), f"{len(scores)} heads, {scores.attrs['circuit']}"
    elif args.top_tokens is not None:
        table = mhsa.analysis.ov_top_tokens(args.top_tokens, lm, tokens=args.tokens, k=args.k)
        what = f"{args.top_tokens}, {table['input'].nunique()} input tokens"
    else:
        positional = mhsa.analysis.qk_positional_scores(lm, positions=args.n_positions)
        table = positional.previous_token.to_frame()
        what = f"{len(table)} heads, {positional.pattern.shape[-1]} positions"
    index = table.index.name is not None
    if args.out is None:
        table.to_csv(sys.stdout, index=index)
        return
    table.to_csv(args.out, index=index)
    wrote(args.out, what)

"""``qk``: one head's attention scores at one query split into pairs (query part, key part)
of the residual stream entering its layer (``mhsa.analysis.qk_attribution``), as CSV."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mhsa.cli.common import add_model_options, wrote

EXAMPLES = (
    'python -m mhsa qk "ro te mi bu gu ka be pa ku ro te mi bu gu ka" --head L1H3 --query 15 '
    "--model toy:induction --top 5",
)
HELP = "why a head looks where it does: its scores split into residual parts (CSV)"
DESCRIPTION = (
    "The head's pre-softmax scores (scaled, before the mask) from --query (default: the last "
    "token) to every key it reads (a decoder's up to the query, an encoder's all), each split "
    "into pairs of residual parts: input (embeddings), L<l>H<h> (an earlier head), M<l> (an "
    "earlier MLP), bias; each norm's scale frozen at the real stream (a post-norm encoder's: "
    "every norm on the way). Every family: pre-norm decoders and encoders (ModernBERT), "
    "post-norm encoders (the BERT family, DistilBERT, ALBERT), and an encoder-decoder's "
    "encoder (E<l>H<h>) and decoder self-attention (D<l>H<h>, teacher-forced on --target; "
    "T5's relative position bias a term of its own); cross-attention is refused. "
    "--top N: the N largest terms. "
    "The CSV goes to --out, else to the standard output."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="the text")
    parser.add_argument(
        "--head", required=True, help="the head, as L1H3 (encoder-decoders: E1H3, D1H3)"
    )
    parser.add_argument(
        "--target", default=None, help="an encoder-decoder's target text (default: the text)"
    )
    parser.add_argument("--query", type=int, default=None, help="query position (default: last)")
    add_model_options(parser)
    parser.add_argument("--top", type=int, default=None, help="only the N largest terms")
    parser.add_argument("--out", type=Path, default=None, help="the CSV (default: stdout)")


def run(args: argparse.Namespace) -> None:
    import mhsa

    if args.top is not None and args.top < 1:
        raise mhsa.InputError(f"--top must be at least 1, got {args.top}.")
    lm = mhsa.load_model(args.model, device=args.device)
    terms = mhsa.analysis.qk_attribution.qk_attribution(
        args.text, args.head, model=lm, query=args.query, text_pair=args.target
    )
    tokens = terms.attrs["tokens"]
    table = terms.assign(key_token=[tokens[k] for k in terms["key"]])
    if args.top is not None:
        table = table.nlargest(args.top, "score")
    if args.out is None:
        table.to_csv(sys.stdout, index=False)
        return
    table.to_csv(args.out, index=False)
    query = terms.attrs["query"]
    wrote(args.out, f"{len(table)} terms, {args.head} at query {query} ({tokens[query]!r})")

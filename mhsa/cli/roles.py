"""``roles``: what heads do, as the Head roles page shows it: detection scores (previous-token,
duplicate-token, induction heads; TransformerLens's ``detect_head``), attention sinks (Gu et al.
2025) and Q/K/V composition (Elhage et al. 2021), as CSV (``mhsa.analysis.roles``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mhsa.cli.common import add_model_options, wrote
from mhsa.errors import MHSAError

EXAMPLES = (
    'python -m mhsa roles "ba ke mo di ba ke mo di" --model toy:induction --out roles.csv '
    "--sinks sinks.csv --composition composition.csv",
    "python -m mhsa roles --model toy:induction --out induction.csv   # random repeated tokens",
)
HELP = "head roles: detection scores, attention sinks, composition (CSV)"
DESCRIPTION = (
    "Per head: the detection scores of every pattern (previous token, duplicate "
    "token, induction; TransformerLens's detect_head), the mean over the texts; without "
    "texts, the random-token induction test of TransformerLens's demo. --sinks: where "
    "heads sink their attention in each text (Gu et al. 2025). --composition: Q/K/V "
    "composition scores from the weights (Elhage et al. 2021)."
)


def add_arguments(roles: argparse.ArgumentParser) -> None:
    from mhsa.analysis.roles import COMPOSITION_KINDS, ERROR_MEASURES, SINK_THRESHOLD
    from mhsa.engine.extract import ENGINES

    roles.add_argument("texts", nargs="*", help="the texts (none: random repeated tokens)")
    add_model_options(roles)
    roles.add_argument("--engine", default="transformers", choices=ENGINES)
    roles.add_argument("--seed", type=int, default=0, help="random tokens' and mhsa-random's")
    roles.add_argument("--exclude-bos", action="store_true", help="leave out attention to BOS")
    roles.add_argument(
        "--exclude-current-token", action="store_true", help="leave out attention to itself"
    )
    roles.add_argument("--error-measure", default="mul", choices=ERROR_MEASURES)
    roles.add_argument("--out", type=Path, required=True, help="detection scores (.csv)")
    roles.add_argument("--sinks", type=Path, default=None, help="attention sinks per text (.csv)")
    roles.add_argument("--sink-threshold", type=float, default=SINK_THRESHOLD)
    roles.add_argument(
        "--composition", type=Path, default=None, help="composition scores (.csv, tidy)"
    )
    roles.add_argument(
        "--kind",
        nargs="+",
        default=list(COMPOSITION_KINDS),
        choices=COMPOSITION_KINDS,
        help="composition kinds (default: Q K V)",
    )


def run(args: argparse.Namespace) -> None:
    import mhsa
    from mhsa.analysis.roles import DETECTION_PATTERNS

    texts = list(args.texts) or None
    if args.sinks is not None and texts is None:  # before any work
        raise MHSAError("--sinks needs texts: the sinks are read from each text's attention.")
    if args.sinks is not None and not 0.0 <= args.sink_threshold < 1.0:
        raise MHSAError(f"--sink-threshold must be from 0 to below 1, got {args.sink_threshold}.")
    lm = mhsa.load_model(args.model, device=args.device)
    options = {
        "model": lm,
        "engine": args.engine,
        "seed": args.seed,
        "exclude_bos": args.exclude_bos,
        "exclude_current_token": args.exclude_current_token,
        "error_measure": args.error_measure,
    }
    patterns = DETECTION_PATTERNS if texts else ("induction",)
    frames = [mhsa.detect_heads(texts, p, **options)["score"].rename(p) for p in patterns]
    table = frames[0].to_frame().join(frames[1:])
    table.to_csv(args.out, index_label="head")
    wrote(args.out, f"{len(table)} heads, {', '.join(patterns)}")
    if args.sinks is not None:
        _write_sinks(args, lm, texts or [])
    if args.composition is not None:
        _write_composition(args, lm)


def _write_sinks(args: argparse.Namespace, lm, texts: list[str]) -> None:
    import pandas as pd

    import mhsa

    parts = []
    for number, text in enumerate(texts):
        result = mhsa.attend(text, model=lm, engine=args.engine, seed=args.seed)
        sinks = mhsa.analysis.attention_sinks(result, args.sink_threshold)
        parts.append(sinks.table.assign(text=number))
    table = pd.concat(parts, ignore_index=True)
    table.to_csv(args.sinks, index=False)
    wrote(args.sinks, f"{int(table['sink'].sum())} sinks over {len(texts)} texts")


def _write_composition(args: argparse.Namespace, lm) -> None:
    import pandas as pd

    import mhsa

    parts = []
    for kind in args.kind:
        scores = mhsa.analysis.head_composition(lm, kind)  # (writer A, reader B)
        tidy = scores.stack().rename("score").rename_axis(["writer", "reader"]).reset_index()
        parts.append(tidy.assign(kind=kind))
    table = pd.concat(parts, ignore_index=True)[["kind", "writer", "reader", "score"]]
    table.to_csv(args.composition, index=False)
    wrote(args.composition, f"{len(table)} pairs of heads, {' '.join(args.kind)}")

"""``patch``: activation patching per head and per position, and attribution patching, as the
Patching page runs them (``mhsa.causal.patching``), as CSV."""

from __future__ import annotations

import argparse
from pathlib import Path

from mhsa.cli.common import add_patching_inputs, metric_kwargs, wrote
from mhsa.errors import MHSAError

EXAMPLES = (
    'python -m mhsa patch "ba ke mo di fu lo ba ke mo di" "ba ke mo ra fu lo ba ke mo di" '
    "--model toy:induction --answer fu --wrong lo --out heads.csv --attribution attribution.csv "
    "--layer 1 --positions positions.csv",
)
HELP = "activation and attribution patching per head (CSV)"
DESCRIPTION = (
    "Clean into corrupted, as TransformerLens's patching: each head's activation "
    "(--what) taken from the clean run into the corrupted one, the metric measured "
    "(causal LMs: logit(answer) - logit(wrong) at the last position; encoders: --target). "
    "--out: every head at every position; --positions: each head of --layer at each "
    "position; --attribution: attribution patching (Nanda 2023), its first-order estimate."
)


def add_arguments(patch: argparse.ArgumentParser) -> None:
    from mhsa.causal.patching import PATCH_POINTS

    add_patching_inputs(
        patch,
        "the text whose activations are patched in",
        "the text run (as many tokens as the clean one)",
    )
    patch.add_argument("--what", default="z", choices=list(PATCH_POINTS), help="the activation")
    patch.add_argument("--batch-size", type=int, default=16, help="patches per forward pass")
    patch.add_argument("--out", type=Path, default=None, help="per head (.csv)")
    patch.add_argument("--layer", type=int, default=None, help="--positions: the layer")
    patch.add_argument("--positions", type=Path, default=None, help="per head and position (.csv)")
    patch.add_argument(
        "--attribution", type=Path, default=None, help="attribution patching per head (.csv)"
    )


def run(args: argparse.Namespace) -> None:
    import mhsa

    if args.out is None and args.positions is None and args.attribution is None:
        raise MHSAError(
            "Nothing to write: give --out, --positions (with --layer) or --attribution."
        )
    if args.positions is not None and args.layer is None:
        raise MHSAError("--positions patches one layer's heads: give --layer.")
    if args.batch_size < 1:
        raise MHSAError(f"--batch-size must be at least 1, got {args.batch_size}.")
    lm = mhsa.load_model(args.model, device=args.device)
    options = {"model": lm, **metric_kwargs(args), "what": args.what}
    pair = (args.clean, args.corrupted)
    if args.out is not None:
        table = mhsa.causal.patch_heads(*pair, batch_size=args.batch_size, **options)
        table.to_csv(args.out, index_label="name")
        _summary(args.out, table, f"{len(table)} heads")
    if args.positions is not None:
        table = mhsa.causal.patch_positions(
            *pair, args.layer, batch_size=args.batch_size, **options
        )
        table.to_csv(args.positions, index=False)
        _summary(args.positions, table, f"layer {args.layer}, {len(table)} heads x positions")
    if args.attribution is not None:
        table = mhsa.causal.attribution_patching(*pair, **options)
        table.to_csv(args.attribution, index_label="name")
        _summary(args.attribution, table, f"{len(table)} heads")


def _summary(path: Path, table, what: str) -> None:
    attrs = table.attrs
    wrote(
        path,
        f"{what}; {attrs['metric']}: clean {attrs['clean']:.4g}, corrupted "
        f"{attrs['corrupted']:.4g}",
    )

"""``info``: the model's layers, heads and sizes (``LoadedModel.facts``)."""

from __future__ import annotations

import argparse

from mhsa.cli.common import add_model_options

EXAMPLES = ("python -m mhsa info --model default",)
HELP = "print the model's layers, heads and sizes"


def add_arguments(info: argparse.ArgumentParser) -> None:
    add_model_options(info)


def run(args: argparse.Namespace) -> None:
    import mhsa

    for key, value in mhsa.load_model(args.model, device=args.device).facts().items():
        print(f"{key:14} {value:,}" if isinstance(value, int) else f"{key:14} {value}")

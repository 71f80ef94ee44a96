"""``train``: a toy model trained through our module and saved with its card
(``mhsa.training.train``, ``mhsa.training.card.save_model``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mhsa.errors import MHSAError

EXAMPLES = ("python -m mhsa train induction --out data/toy/induction --seed 0",)
HELP = "train a small transformer on a toy task through our module and save it"
DESCRIPTION = (
    "Train a small Llama-style or GPT-2 model (a BART encoder-decoder for "
    "reverse-seq2seq) on a toy task, its attention running as our MultiHeadSelfAttention, "
    "and save it (config, weights, tokenizer, model card) as a transformers folder. The "
    "defaults are the shipped induction recipe (for reverse-seq2seq: in the bart family)."
)


def add_arguments(train: argparse.ArgumentParser) -> None:
    """``train TASK --out FOLDER``: a toy model trained through our module, saved with its card."""
    from mhsa.engine.models.loading import DEVICES
    from mhsa.training import MODEL_FAMILIES, TASKS, TrainConfig

    d = TrainConfig()
    train.add_argument("task", choices=list(TASKS))
    train.add_argument("--out", dest="folder", type=Path, required=True, help="folder to write")
    train.add_argument("--seed", type=int, default=d.seed)
    train.add_argument(
        "--family",
        choices=list(MODEL_FAMILIES),
        help=f"default: {d.family}, or bart for an encoder-decoder task",
    )
    for name in ("layers", "heads", "width", "steps", "batch", "warmup"):
        train.add_argument(f"--{name}", type=int, default=getattr(d, name))
    train.add_argument("--lr", type=float, default=d.lr)
    train.add_argument("--mlp", action="store_true", help="train the MLPs (default: outputs zero)")
    train.add_argument("--device", default=d.device, choices=DEVICES)


def run(args: argparse.Namespace) -> None:
    from mhsa.training import TrainConfig, default_family, save_model, train

    options = ("task", "seed", "layers", "heads", "width", "steps", "batch", "warmup")
    config = TrainConfig(
        **{k: getattr(args, k) for k in options},
        family=args.family or default_family(args.task),
        lr=args.lr,
        mlp=args.mlp,
        device=args.device,
    )
    try:
        config.check()  # before any work
    except ValueError as e:
        raise MHSAError(str(e)) from e

    def show(s) -> None:
        if s.anti_diagonal_scores is None:
            heads = (
                f"previous-token {s.previous_token_scores[0].max():.2f}  induction "
                f"{s.induction_scores[1:].max() if len(s.induction_scores) > 1 else 0:.2f}"
            )
        else:
            heads = f"anti-diagonal {s.anti_diagonal_scores.max():.2f}"
        print(
            f"step {s.step:5}  loss {s.loss:6.3f}  accuracy {s.accuracy:.3f}  {heads}"
            f"  {s.elapsed:6.1f} s",
            file=sys.stderr,
        )

    result = train(config, on_snapshot=show, snapshot_every=100)
    print(f"accuracy {result.accuracy:.3f} in {result.seconds:.1f} s")
    if result.phase_change_step is not None:
        print(f"phase change at step {result.phase_change_step}")
    print(f"wrote    {save_model(result, args.folder)}")

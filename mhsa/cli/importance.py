"""``importance``: how much each head matters over a corpus (``mhsa.causal.head_importance``,
``corpus_importance``), with the pruning curve (``mhsa.causal.pruning_curve``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mhsa.cli.common import (
    add_corpus_arguments,
    check_corpus_args,
    on_ray,
    progress_bar,
    read_corpus_args,
    report_problems,
    used_entries,
)
from mhsa.errors import MHSAError

EXAMPLES = ("python -m mhsa importance data/sentences.txt --method ablation --out importance.csv",)
HELP = "how much each head matters over a corpus (knock-outs or gradients)"
DESCRIPTION = (
    "Head importance (Michel et al. 2019) over a corpus, one sentence per line; "
    "for --target similarity, two sentences per line separated by a tab."
)


def add_arguments(importance: argparse.ArgumentParser) -> None:
    from mhsa.causal.importance import METHODS
    from mhsa.causal.metrics import TARGET_SPECS

    add_corpus_arguments(
        importance,
        "text file (one sentence, or two tab-separated ones, per line), folder, .parquet",
    )
    importance.add_argument("--method", default="ablation", choices=list(METHODS))
    importance.add_argument(
        "--target",
        default=None,
        choices=list(TARGET_SPECS),
        help="default: lm-loss with a language-model head, else similarity for pairs, else "
        "embedding",
    )
    importance.add_argument("--normalize", action="store_true", help="per-layer l2 normalisation")
    importance.add_argument("--max-tokens", type=int, default=None)
    importance.add_argument("--out", type=Path, required=True, help="importance table (.csv)")
    importance.add_argument(
        "--pruning", type=Path, default=None, help="also write the pruning curve (.csv)"
    )
    importance.add_argument(
        "--seed", type=int, default=0, help="seed of the pruning curve's random order"
    )


def run(args: argparse.Namespace) -> None:
    options = check_corpus_args(args)
    corpus = read_corpus_args(args)
    tabbed = all("\t" in e.text for e in corpus.entries)
    if args.target == "similarity" or (args.target is None and tabbed):
        corpus = read_corpus_args(args, pairs=True)  # bad pairs are reported by line
    if args.pruning and args.ray is not None:
        raise MHSAError("--pruning runs on this machine: leave out --ray, or --pruning.")
    options.update(method=args.method, target=args.target, max_tokens=args.max_tokens)
    curve = None
    if args.ray is not None:
        acc, problems = on_ray(args, "importance", corpus, options)
        table = acc.frame(normalize=args.normalize) if acc.count else None
    else:
        table, curve, problems = _importance_here(args, corpus, options)
    report_problems(problems, args.problems)
    _write_importance(args, table, curve)


def _importance_here(args: argparse.Namespace, corpus, options: dict) -> tuple:
    """Head importance (and with ``--pruning`` the curve) on this machine, behind a progress
    bar: ``(table or None when no sentence was usable, curve or None, problems)``."""
    import mhsa
    from mhsa.causal.importance import corpus_importance

    model = mhsa.load_model(args.model, device=args.device)
    problems = list(corpus.problems)
    curve = None
    bar, progress = progress_bar("importance")
    with bar:
        if args.one_by_one:  # the reference: head_importance, one text at a time
            options.pop("batch_tokens", None)
            table = mhsa.causal.head_importance(
                used_entries(corpus, problems), model=model, normalize=args.normalize, **options
            )
        else:
            acc = corpus_importance(
                corpus.entries, model=model, problems=problems, progress=progress, **options
            )
            table = acc.frame(normalize=args.normalize) if acc.count else None
        if args.pruning and table is not None:
            bar.reset()
            bar.set_description("pruning")
            curve = mhsa.causal.pruning_curve(
                used_entries(corpus, problems),
                model=model,
                target=table.attrs["target"],
                importance=table,
                seed=args.seed,
                max_tokens=args.max_tokens,
                progress=progress,
            )
    return table, curve, problems


def _write_importance(args: argparse.Namespace, table, curve) -> None:
    """The importance table (and the pruning curve) written, with a summary line each."""
    if table is None:
        raise MHSAError("No sentence of the corpus could be used (see the list above).")
    table.to_csv(args.out, index_label="name")
    target, texts = table.attrs["target"], table.attrs["texts"]
    print(f"wrote {args.out} ({texts} texts, {len(table)} heads, {args.method}, {target})")
    top = table.sort_values("importance", ascending=False).head(5)
    print("most important: " + ", ".join(f"{n} {v:.3g}" for n, v in top["importance"].items()))
    if curve is not None:
        curve.to_csv(args.pruning, index=False)
        print(f"wrote {args.pruning}")

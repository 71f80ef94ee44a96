"""``stats``: per-head statistics over a corpus (``mhsa.corpus.stats.corpus_stats``), here or on
Ray."""

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
)
from mhsa.errors import MHSAError

EXAMPLES = (
    "python -m mhsa stats data/sentences.txt --out stats.csv --similarity sim.csv",
    "python -m mhsa stats corpus/ --out stats.csv --ray            # a local Ray instance",
    "python -m mhsa stats big.parquet --column text --out stats.csv --ray auto   # a cluster",
)
HELP = "per-head statistics over a corpus (text file, folder of .txt files or Parquet)"


def add_arguments(stats: argparse.ArgumentParser) -> None:
    from mhsa.engine.extract import ENGINES

    add_corpus_arguments(stats, "text file (one sentence per line), folder, .parquet")
    stats.add_argument("--engine", default="transformers", choices=ENGINES)
    stats.add_argument("--max-tokens", type=int, default=None)
    stats.add_argument("--word-level", action="store_true", help="merge sub-words into words first")
    stats.add_argument("--out", type=Path, required=True, help="statistics table (.csv)")
    stats.add_argument(
        "--similarity", type=Path, default=None, help="also write heads x heads JS (.csv)"
    )


def run(args: argparse.Namespace) -> None:
    import mhsa
    from mhsa.corpus.stats import corpus_stats

    options = check_corpus_args(args)
    corpus = read_corpus_args(args)
    options.update(
        engine=args.engine,
        word_level=args.word_level,
        similarity="js" if args.similarity else None,
        max_tokens=args.max_tokens,
    )
    if args.ray is not None:
        result = on_ray(args, "stats", corpus, options)
    else:
        model = mhsa.load_model(args.model, device=args.device)
        bar, progress = progress_bar("sentences")
        with bar:
            result = corpus_stats(
                corpus.entries,
                model=model,
                batched=not args.one_by_one,
                progress=progress,
                **options,
            )
        result.problems[:0] = corpus.problems
    report_problems(result.problems, args.problems)
    if result.used == 0:
        raise MHSAError("No sentence of the corpus could be used (see the list above).")
    result.stats.frame().to_csv(args.out, index_label="name")
    print(f"wrote {args.out} ({result.used} sentences, {len(result.stats.frame())} heads)")
    if result.similarity is not None:
        result.similarity.frame().to_csv(args.similarity)
        print(f"wrote {args.similarity}")

"""What the commands share: the parser that fails in one line, the model and corpus options,
the progress bar, the report of unused entries, and the check of the files to write."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from mhsa.errors import MHSAError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "OUTPUTS",
    "Parser",
    "add_command",
    "add_corpus_arguments",
    "add_corpus_options",
    "add_metric_options",
    "add_model_options",
    "add_patching_inputs",
    "check_corpus_args",
    "check_outputs",
    "metric_kwargs",
    "on_ray",
    "progress_bar",
    "read_corpus_args",
    "report_problems",
    "used_entries",
    "wrote",
]

#: the options that name files a command writes (checked before any work)
OUTPUTS = (
    "out",
    "similarity",
    "pruning",
    "problems",
    "sinks",
    "composition",
    "positions",
    "attribution",
    "routes",
    "curve",
    "html",
)


class Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_command(subparsers: argparse._SubParsersAction, command: ModuleType) -> None:
    """The subcommand of a command module (its name): ``--help`` gives its ``HELP`` and
    ``DESCRIPTION`` and ends with its ``EXAMPLES``, ``add_arguments`` adds its arguments and
    ``args.run`` is its ``run``."""
    examples = command.EXAMPLES
    epilog = "example" + ("s" if len(examples) > 1 else "") + ":\n"
    epilog += "".join(f"  {e}\n" for e in examples)
    parser = subparsers.add_parser(
        command.__name__.rsplit(".", 1)[-1],
        help=command.HELP,
        description=getattr(command, "DESCRIPTION", None),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_arguments(parser)
    parser.set_defaults(run=command.run)


def add_corpus_arguments(parser: argparse.ArgumentParser, corpus_help: str) -> None:
    """The arguments of a command over a corpus: its ``corpus`` (``corpus_help``), then the
    model's and the corpus's options."""
    parser.add_argument("corpus", type=Path, help=corpus_help)
    add_model_options(parser)
    add_corpus_options(parser)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """--model and --device: every subcommand loads a model."""
    from mhsa.engine.models.loading import DEVICES

    parser.add_argument(
        "--model",
        default="default",
        help="'default' (embedded all-MiniLM-L6-v2), a model id or a folder",
    )
    parser.add_argument("--device", default="auto", choices=DEVICES)


def add_metric_options(parser: argparse.ArgumentParser, *, targets: bool = True) -> None:
    """What is measured (``mhsa.causal.metrics``): the logit difference of two answer words for
    causal
    language models, or (``targets``) an embedding target for encoders."""
    parser.add_argument(
        "--answer", default=None, help="causal LMs: the right next word (one token after a space)"
    )
    parser.add_argument("--wrong", default=None, help="causal LMs: the competing next word")
    if targets:
        from mhsa.causal.metrics import PATCH_TARGETS

        parser.add_argument(
            "--target",
            default=None,
            choices=list(PATCH_TARGETS),
            help="encoders: what is measured (default embedding)",
        )
        parser.add_argument(
            "--pair",
            "--text-pair",
            dest="pair",
            default=None,
            help="--target similarity: the other sentence",
        )
    parser.add_argument("--max-tokens", type=int, default=None, help="truncate to this many tokens")


def add_patching_inputs(
    parser: argparse.ArgumentParser, clean: str, corrupted: str, *, targets: bool = True
) -> None:
    """A patching run's inputs: its two texts (``clean`` and ``corrupted``, their helps), the
    model's options and what is measured (``add_metric_options``)."""
    parser.add_argument("clean", help=clean)
    parser.add_argument("corrupted", help=corrupted)
    add_model_options(parser)
    add_metric_options(parser, targets=targets)


def metric_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The options ``add_metric_options`` added, as the library's keyword arguments
    (``answer``, ``wrong``, ``max_tokens``; with targets, ``target`` and ``text_pair``)."""
    kwargs = {"answer": args.answer, "wrong": args.wrong, "max_tokens": args.max_tokens}
    if hasattr(args, "target"):
        kwargs.update(target=args.target, text_pair=args.pair)
    return kwargs


def add_corpus_options(parser: argparse.ArgumentParser) -> None:
    """How a corpus is read, batched, spread over Ray, and where its unused entries go."""
    parser.add_argument(
        "--column", default="text", help="Parquet: the column of sentences (default: text)"
    )
    parser.add_argument(
        "--one-by-one",
        action="store_true",
        help="one sentence per forward pass (the reference the batched default must equal)",
    )
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        help="padded tokens per forward pass (default: 2048 on a CPU, 8192 on a GPU)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on Ray: no address starts a local instance; 'auto' or host:port joins a "
        "cluster (pip install -r requirements-ray.txt)",
    )
    parser.add_argument("--workers", type=int, default=None, help="Ray: actors (models loaded)")
    parser.add_argument("--shard-size", type=int, default=256, help="Ray: sentences per actor call")
    parser.add_argument(
        "--problems",
        type=Path,
        default=None,
        help="write the entries that were not used, with place and reason (.csv)",
    )


def progress_bar(desc: str):
    """A tqdm bar on stderr and the ``progress(done, total)`` that moves it."""
    from tqdm import tqdm

    bar = tqdm(total=0, desc=desc, unit="sent", file=sys.stderr)  # the rate: sentences/s

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    return bar, progress


def read_corpus_args(args: argparse.Namespace, pairs: bool = False):
    from mhsa.engine.runs.batches import read_corpus

    return read_corpus(args.corpus, column=args.column, pairs=pairs)


def report_problems(problems: list, path: Path | None) -> None:
    """Every entry that was not used: counted and listed, never dropped silently."""
    import pandas as pd

    if path is not None:
        frame = pd.DataFrame([(p.where, p.reason) for p in problems], columns=["where", "reason"])
        frame.to_csv(path, index=False)
        print(f"wrote {path} ({len(problems)} entries not used)")
    if not problems:
        return
    print(f"{len(problems)} entries not used:", file=sys.stderr)
    for p in problems[:20]:
        print(f"  {p.where}: {p.reason}", file=sys.stderr)
    if len(problems) > 20:
        rest = "" if path else " (--problems FILE lists them all)"
        print(f"  ... and {len(problems) - 20} more{rest}", file=sys.stderr)


def check_corpus_args(args: argparse.Namespace) -> dict:
    for option in ("batch_tokens", "max_tokens", "workers", "shard_size"):
        value = getattr(args, option, None)
        if value is not None and value < 1:  # before the model loads or Ray starts
            raise MHSAError(f"--{option.replace('_', '-')} must be at least 1, got {value}.")
    if args.ray is not None and args.one_by_one:
        raise MHSAError("--one-by-one runs on this machine: leave out --ray.")
    return {} if args.batch_tokens is None else {"batch_tokens": args.batch_tokens}


def on_ray(args: argparse.Namespace, kind: str, corpus, options: dict):
    from mhsa.corpus.distributed import RayTask, connect, run_on_ray

    connect(args.ray or None)  # before the bar: a dead address is one line, at once
    bar, progress = progress_bar(f"{kind} on Ray")
    with bar:
        return run_on_ray(
            RayTask(kind, args.model, options),
            corpus,
            address=args.ray or None,
            workers=args.workers,
            shard_size=args.shard_size,
            gpus=None if args.device == "auto" else args.device == "cuda",
            progress=progress,
        )


def used_entries(corpus, problems: list) -> list:
    """The corpus's items minus those reported as problems (what the importance averaged)."""
    bad = {p.where for p in problems}
    return [(e.text, e.pair) if e.pair else e.text for e in corpus.entries if e.where not in bad]


def check_outputs(args: argparse.Namespace) -> None:
    """Every file the command will write can be written, checked before any work (a corpus run
    would otherwise end in a traceback after its last sentence)."""
    for option in OUTPUTS:
        path = getattr(args, option, None)
        if path is None:
            continue
        flag = f"--{option}"
        if path.is_dir():
            raise MHSAError(f"{flag} {path} is a folder: give a file name.")
        folder = path.parent
        if not folder.is_dir():
            raise MHSAError(f"{flag} {path}: the folder {folder} does not exist.")
        if not os.access(folder, os.W_OK):
            raise MHSAError(f"{flag} {path}: the folder {folder} is not writable.")


def wrote(path: Path, what: str) -> None:
    """The summary line of a written file."""
    print(f"wrote {path} ({what})")


def write_frame(frame: pd.DataFrame, out: Path | None, *, as_json: bool = False) -> None:
    """A result table to ``out`` (CSV, or JSON lines), or to standard output when None."""
    text = frame.to_json(orient="records", lines=True) if as_json else frame.to_csv(index=False)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"wrote {out} ({len(frame)} rows)", file=sys.stderr)

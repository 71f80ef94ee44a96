"""``explain``: what each head of an atlas does, as the program that best reproduces its
attention, scored on held-out texts (``mhsa.explain.explain_heads``); or one typed hypothesis
scored for one head (``score_program``). Tables as CSV (or JSON lines) on stdout or in
``--out``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mhsa.cli.common import write_frame
from mhsa.errors import MHSAError

EXAMPLES = (
    "python -m mhsa explain minilm-brown --out explanations.csv",
    "python -m mhsa explain atlases/minilm --heads L3H4,L0H1 --no-faithfulness",
    'python -m mhsa explain default --head L3H4 --program "when(NOUN, pos(DET, left, nearest))"',
)
HELP = "explain heads by attention programs (offset(-1), induction, pos(DET, left, nearest) ...)"
DESCRIPTION = (
    "ATLAS is an atlas's folder, the name of one of the app's atlases (python -m mhsa atlas build "
    "--default writes minilm-brown and toy-induction; 'default' and 'toy:induction' name them "
    "by model), or an atlas's id in the store (MHSA_STORE). Without --program: every head (or "
    "--heads) explained, one row each (head, program, description, iou, accuracy, baseline, "
    "baseline_accuracy, auc, faithfulness, texts), saved into the atlas's folder when every head "
    "is explained. With --head and --program: that program's scores for that head."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("atlas", help="the atlas: a folder, an atlas's name, or a store id")
    parser.add_argument(
        "--heads", default=None, help="the heads to explain, as L3H4,L0H1 (default: every head)"
    )
    parser.add_argument("--head", default=None, help="with --program: the head scored, as L3H4")
    parser.add_argument(
        "--program",
        default=None,
        help='a hypothesis to score, as "when(NOUN, pos(DET, left, nearest)) | first"',
    )
    parser.add_argument(
        "--held-out", type=float, default=0.25, help="share of the texts scored (default 0.25)"
    )
    parser.add_argument("--top", type=int, default=3, help="programs kept per head (default 3)")
    parser.add_argument(
        "--no-faithfulness",
        action="store_true",
        help="skip faithfulness (the forward passes with the head's pattern replaced)",
    )
    parser.add_argument(
        "--no-save", action="store_true", help="do not save the explanations in the atlas"
    )
    parser.add_argument("--json", action="store_true", help="JSON lines instead of CSV")
    parser.add_argument("--out", type=Path, default=None, help="write here instead of stdout")


def open_atlas_named(name: str):
    """The atlas ``name`` names: a folder; one of the app's atlases by folder name
    (``mhsa.atlas.shipped.list_atlases``) or by its model (``DEFAULT_ATLASES``); or an
    ``atlas`` entry of the store.

    Raises:
        MHSAError: nothing of that name (the message lists the atlases there are), or an atlas
            that cannot be opened.
    """
    from mhsa.atlas import open_atlas
    from mhsa.atlas.shipped import DEFAULT_ATLASES, list_atlases

    path = Path(name)
    if path.is_dir():
        return open_atlas(path)
    found = list_atlases()
    key = DEFAULT_ATLASES.get(name, name)
    if key in found:
        atlas = found[key]
        if isinstance(atlas, MHSAError):
            raise atlas
        return atlas
    store = _store_atlas(name)
    if store is not None:
        return open_atlas(store)
    known = ", ".join(sorted(found)) or "none (python -m mhsa atlas build --default builds them)"
    raise MHSAError(
        f"No atlas {name!r}: give an atlas's folder, or one of the app's atlases: {known}."
    )


def _store_atlas(name: str) -> Path | None:
    """The folder of the store's ``atlas`` entry ``name`` (or ``atlas/<id>``), else None."""
    from mhsa.engine.models.store import store_root

    root = store_root()
    entry = name.removeprefix("atlas/")
    if root is None or not entry or "/" in entry or entry.startswith("."):
        return None
    folder = Path(root) / "atlas" / entry
    return folder if (folder / "manifest.json").is_file() else None


def _heads(text: str | None) -> list[str] | None:
    if text is None:
        return None
    from mhsa.heads import parse_head_label

    heads = [h.strip() for h in text.split(",") if h.strip()]
    if not heads:
        raise MHSAError("--heads names no head: give labels as L3H4,L0H1.")
    for h in heads:
        try:
            parse_head_label(h)
        except ValueError as e:
            raise MHSAError(f"--heads: {e}") from None
    return heads


def _check(args: argparse.Namespace) -> None:
    """The options' combinations, before any work."""
    if args.program is not None and args.head is None:
        raise MHSAError("--program needs --head: the head it is scored for, as L3H4.")
    if args.head is not None and args.program is None:
        raise MHSAError("--head goes with --program; to explain some heads, give --heads L3H4,...")
    if args.program is not None and args.heads is not None:
        raise MHSAError("Give either --heads (explain them) or --head with --program, not both.")
    if not 0 < args.held_out < 1:
        raise MHSAError(f"--held-out must be between 0 and 1, got {args.held_out}.")
    if args.top < 1:
        raise MHSAError(f"--top must be at least 1, got {args.top}.")


def run(args: argparse.Namespace) -> None:
    import pandas as pd

    _check(args)
    heads = _heads(args.heads)
    if args.program is not None:
        from mhsa.explain import parse_program, score_program

        program = parse_program(args.program)  # a bad program: one message, before any work
        atlas = open_atlas_named(args.atlas)
        scores = score_program(atlas, args.head, program, faithfulness=not args.no_faithfulness)
        frame = pd.DataFrame([{"head": args.head, **scores.to_dict()}])
        print(f"{args.head}: {program.describe()}", file=sys.stderr)
    else:
        from mhsa.explain import explain_heads

        atlas = open_atlas_named(args.atlas)
        explained = explain_heads(
            atlas,
            heads=heads,
            held_out=args.held_out,
            top=args.top,
            faithfulness=not args.no_faithfulness,
            progress=True,
            save=heads is None and not args.no_save,
        )
        frame = explained.table
        for notice in explained.notices:
            print(notice, file=sys.stderr)
        for row in explained.together.itertuples(index=False):
            value = f"{row.faithfulness:.3f}" if row.faithfulness == row.faithfulness else row.note
            print(f"{row.what} replaced at once: faithfulness {value}", file=sys.stderr)
    write_frame(frame, args.out, as_json=args.json)

"""``atlas``: build a head atlas over a corpus, and read one: a head's top pairs, a search by
token and offset, similar contexts (``mhsa.atlas``). Tables as CSV (or JSON) on stdout or in
``--out``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mhsa.cli.common import write_frame
from mhsa.errors import MHSAError

EXAMPLES = (
    "python -m mhsa atlas build data/sentences.txt --out atlases/minilm",
    "python -m mhsa atlas build --default      # the app's atlases: MiniLM on the Brown Corpus, "
    "toy:induction on its task",
    "python -m mhsa atlas top atlases/minilm L3H4 --by norm",
    "python -m mhsa atlas search atlases/minilm L3H4 --query-token the --offset -1",
    "python -m mhsa atlas search atlases/minilm L3H4 --query-tag NOUN --key-tag DET",
    "python -m mhsa atlas similar atlases/minilm 12 3 --head L3H4",
)
HELP = "head atlases: what each head does over a whole corpus (build, top, search, similar)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = actions.add_parser("build", help="build an atlas (resumes a stopped build)")
    build.add_argument(
        "corpus",
        nargs="?",
        type=Path,
        help='text file, one text a line; or .jsonl of {"text", "words", "tags"} (tagged)',
    )
    build.add_argument("--out", type=Path, help="the atlas's folder")
    build.add_argument(
        "--default",
        action="store_true",
        help="build the app's atlases where the app reads them (MHSA_ATLAS_DIR, else the "
        "store's _atlases: MHSA_STORE or the folder scripts/run-app.sh gives its server)",
    )
    build.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="MODEL",
        help="with --default: this shipped atlas alone (repeat for several)",
    )
    build.add_argument(
        "--background",
        action="store_true",
        help="with --default: start the build in a process of its own and return (its progress "
        "in the atlas's folder, shown by the Head atlas page); never started twice",
    )
    build.add_argument("--as-background", action="store_true", help=argparse.SUPPRESS)
    build.add_argument(
        "--no-explain",
        action="store_true",
        help="with --default: do not explain the atlas's heads after the build (by default they "
        "are, with mhsa.explain, so that the Head atlas page opens with them)",
    )
    build.add_argument(
        "--sentences",
        type=int,
        default=None,
        help="with --default: Brown Corpus sentences (default 4000; 0: all)",
    )
    build.add_argument("--model", default="default")
    build.add_argument("--top-k", type=int, default=32)
    build.add_argument("--layers", type=int, nargs="+", default=None)
    build.add_argument("--heads", type=int, nargs="+", default=None)
    build.add_argument("--batch-tokens", type=int, default=None)
    build.add_argument("--ray", action="store_true", help="compute the shards on Ray")
    build.add_argument("--workers", type=int, default=2, help="Ray actors")
    build.add_argument("--restart", action="store_true", help="do not resume a stopped build")
    build.add_argument(
        "--part",
        choices=("encoder", "decoder"),
        default=None,
        help="an encoder-decoder's encoder or decoder self-attention alone (default: both)",
    )
    top = actions.add_parser("top", help="a head's strongest pairs")
    _reader(top)
    top.add_argument("head", help="as L3H4 (encoder-decoders: E0H1, D0H1)")
    top.add_argument("--by", choices=("weight", "norm"), default="weight")
    top.add_argument("-k", type=int, default=10)
    search = actions.add_parser("search", help="tokens whose strongest key matches")
    _reader(search)
    search.add_argument("head", help="as L3H4")
    search.add_argument("--query-token", default=None)
    search.add_argument("--key-token", default=None)
    search.add_argument("--offset", type=int, default=None, help="key - query (-1: previous)")
    search.add_argument(
        "--query-tag", default=None, help="the query's part of speech (Universal tag: NOUN, ...)"
    )
    search.add_argument("--key-tag", default=None, help="the strongest key's part of speech")
    search.add_argument("-k", type=int, default=20)
    similar = actions.add_parser("similar", help="contexts whose head outputs are nearest")
    _reader(similar)
    similar.add_argument("text_id", type=int)
    similar.add_argument("position", type=int)
    similar.add_argument(
        "--head",
        action="append",
        default=None,
        help="a head (repeat for several; none: every head)",
    )
    similar.add_argument("-k", type=int, default=10)


def _reader(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("atlas", type=Path, help="the atlas's folder")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of CSV")
    parser.add_argument("--out", type=Path, default=None, help="write here instead of stdout")


def run(args: argparse.Namespace) -> None:
    from mhsa.atlas import open_atlas

    if args.action == "build":
        _build(args)
        return
    atlas = open_atlas(args.atlas)
    if args.action == "top":
        frame = atlas.top(args.head, k=args.k, by=args.by)
    elif args.action == "search":
        frame = atlas.search(
            args.head,
            query_token=args.query_token,
            key_token=args.key_token,
            offset=args.offset,
            k=args.k,
            query_tag=args.query_tag,
            key_tag=args.key_tag,
        )
    else:
        heads = None if not args.head else (args.head[0] if len(args.head) == 1 else args.head)
        frame = atlas.similar(args.text_id, args.position, head=heads, k=args.k)
    write_frame(frame, args.out, as_json=args.json)


def _build(args: argparse.Namespace) -> None:
    from mhsa.atlas import build_atlas
    from mhsa.atlas.shipped import build_default_atlases

    if args.default:
        from mhsa.atlas.shipped import build_in_background, run_background_build

        if args.as_background:  # the process build_in_background starts
            for model in args.only or []:
                run_background_build(model, args.sentences)
                if not args.no_explain:
                    _explain_shipped(model)
            return
        if args.background:
            for model in args.only or ["default"]:
                state = build_in_background(model, sentences=args.sentences)
                print(f"{model}: {state}", file=sys.stderr)
            return
        built = build_default_atlases(sentences=args.sentences, models=args.only)
        for name, folder in built.items():
            if not args.no_explain:
                _explain_shipped(name)
            print(f"{name}: {folder}", file=sys.stderr)
        return
    if args.corpus is None or args.out is None:
        raise MHSAError("atlas build needs a CORPUS and --out (or --default).")
    atlas = build_atlas(
        args.corpus,
        args.out,
        model=args.model,
        top_k=args.top_k,
        layers=args.layers,
        heads=args.heads,
        batch_size=args.batch_tokens,
        ray=args.ray,
        workers=args.workers,
        resume=not args.restart,
        part=args.part,
    )
    print(f"wrote {args.out}: {atlas}", file=sys.stderr)


def _explain_shipped(model: str) -> None:
    """Explain every head of the shipped atlas of ``model`` (``mhsa.explain.explain_heads``,
    saved in its folder) unless explanations of this build are there already."""
    import mhsa.explain
    from mhsa.atlas import open_atlas
    from mhsa.atlas.shipped import DEFAULT_ATLASES, atlas_dir

    atlas = open_atlas(atlas_dir() / DEFAULT_ATLASES[model])
    if mhsa.explain.saved(atlas) is None:
        mhsa.explain.explain_heads(atlas, progress=False, save=True)
        print(f"{model}: every head explained", file=sys.stderr)

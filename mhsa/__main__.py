"""Command line: ``python -m mhsa {attend,info,stats,importance} ...`` without the browser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mhsa.errors import MHSAError

_EPILOG = """examples:
  python -m mhsa attend "The cat sat on the mat." --engine mhsa --out cat.npz
  python -m mhsa info --model default
  python -m mhsa stats corpus.txt --out stats.csv --similarity sim.csv
  python -m mhsa importance corpus.txt --method ablation --out importance.csv
"""


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m mhsa",
        description="Multi-head self-attention explorer: per-head attention from real models.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from mhsa.extract import ENGINES
    from mhsa.models import DEVICES

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--model",
            default="default",
            help="'default' (embedded all-MiniLM-L6-v2), a model id or a folder",
        )
        sp.add_argument("--device", default="auto", choices=DEVICES)

    a = sub.add_parser("attend", help="compute per-head attention of a text and save it")
    a.add_argument("text", help="the sentence")
    common(a)
    a.add_argument("--engine", default="transformers", choices=ENGINES)
    a.add_argument("--max-tokens", type=int, default=None, help="truncate to this many tokens")
    a.add_argument("--pair", default=None, help="second segment / decoder text")
    a.add_argument("--seed", type=int, default=0, help="seed of the mhsa-random engine")
    a.add_argument(
        "--verify",
        action="store_true",
        help="mhsa engine: also run the model's own forward and print the differences",
    )
    a.add_argument("--out", type=Path, default=None, help="write the result (.npz)")

    i = sub.add_parser("info", help="print the model's layers, heads and sizes")
    common(i)

    s = sub.add_parser("stats", help="per-head statistics over a corpus (one sentence per line)")
    s.add_argument("corpus", type=Path, help="text file, one sentence per line")
    common(s)
    s.add_argument("--engine", default="transformers", choices=ENGINES)
    s.add_argument("--max-tokens", type=int, default=None)
    s.add_argument("--word-level", action="store_true", help="merge sub-words into words first")
    s.add_argument("--out", type=Path, required=True, help="statistics table (.csv)")
    s.add_argument(
        "--similarity", type=Path, default=None, help="also write heads x heads JS (.csv)"
    )
    from mhsa.importance import METHODS, TARGETS

    m = sub.add_parser(
        "importance",
        help="how much each head matters over a corpus (knock-outs or gradients)",
        description="Head importance (Michel et al. 2019) over a corpus, one sentence per line; "
        "for --target similarity, two sentences per line separated by a tab.",
    )
    m.add_argument(
        "corpus", type=Path, help="text file, one sentence (or tab-separated pair) per line"
    )
    common(m)
    m.add_argument("--method", default="ablation", choices=list(METHODS))
    m.add_argument(
        "--target",
        default=None,
        choices=list(TARGETS),
        help="default: lm-loss with a language-model head, else similarity for pairs, else "
        "embedding",
    )
    m.add_argument("--normalize", action="store_true", help="per-layer l2 normalisation")
    m.add_argument("--max-tokens", type=int, default=None)
    m.add_argument("--out", type=Path, required=True, help="importance table (.csv)")
    m.add_argument("--pruning", type=Path, default=None, help="also write the pruning curve (.csv)")
    m.add_argument("--seed", type=int, default=0, help="seed of the pruning curve's random order")
    return p


def _attend(args: argparse.Namespace) -> None:
    import mhsa

    r = mhsa.attend(
        args.text,
        model=args.model,
        engine=args.engine,
        device=args.device,
        max_tokens=args.max_tokens,
        text_pair=args.pair,
        seed=args.seed,
        verify=args.verify,
    )
    print(f"model    {r.model} ({r.num_parameters:,} parameters) on {r.device}, engine {r.engine}")
    print(f"tokens   {len(r.tokens)}: {' '.join(r.tokens)}")
    if r.truncated_tokens:
        print(f"         ({r.truncated_tokens} tokens dropped by truncation)")
    print(f"shape    {list(r.attention.shape)} [layers, heads, query, key]")
    print(f"time     load {r.timings['load']:.2f} s, forward {r.timings['forward'] * 1e3:.1f} ms")
    if r.max_abs_diff is not None:
        layers = ", ".join(f"{d:.1e}" for d in r.layer_max_abs_diff or [])
        print(f"agrees   max |ours - model| attention per layer: {layers}")
        print(f"         final hidden state: {r.hidden_max_abs_diff:.1e}")
    if args.out:
        print(f"wrote    {r.save(args.out)}")


def _info(args: argparse.Namespace) -> None:
    import mhsa

    for key, value in mhsa.load_model(args.model, device=args.device).facts().items():
        print(f"{key:14} {value:,}" if isinstance(value, int) else f"{key:14} {value}")


def _corpus(path: Path) -> list[str]:
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except OSError as e:
        raise MHSAError(f"Cannot read {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise MHSAError(f"{path} is not UTF-8 text.") from e
    sentences = [ln for ln in lines if ln]
    if not sentences:
        raise MHSAError(f"{path} holds no sentences (one per line).")
    return sentences


def _stats(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    import mhsa
    from mhsa.stats import HeadSimilarityAccumulator, HeadStatsAccumulator

    sentences = _corpus(args.corpus)
    model = mhsa.load_model(args.model, device=args.device)
    stats = HeadStatsAccumulator(word_level=args.word_level)
    sim = HeadSimilarityAccumulator("js") if args.similarity else None
    for text in tqdm(sentences, desc="sentences", unit="sent", file=sys.stderr):
        result = mhsa.attend(text, model=model, engine=args.engine, max_tokens=args.max_tokens)
        stats.add(result)  # only running sums are kept: memory does not grow with the corpus
        if sim is not None:
            sim.add(result.to_words() if args.word_level else result)
    stats.frame().to_csv(args.out, index_label="name")
    print(f"wrote {args.out} ({stats.count} sentences, {len(stats.frame())} heads)")
    if sim is not None:
        sim.frame().to_csv(args.similarity)
        print(f"wrote {args.similarity}")


def _importance(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    import mhsa

    items: list[str | tuple[str, str]] = []
    for line in _corpus(args.corpus):
        first, tab, second = line.partition("\t")
        items.append((first.strip(), second.strip()) if tab and second.strip() else first)
    model = mhsa.load_model(args.model, device=args.device)
    with tqdm(total=len(items), desc="importance", unit="step", file=sys.stderr) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        table = mhsa.head_importance(
            items,
            model=model,
            method=args.method,
            target=args.target,
            normalize=args.normalize,
            max_tokens=args.max_tokens,
            progress=progress,
        )
        curve = None
        if args.pruning:
            bar.reset()
            bar.set_description("pruning")
            curve = mhsa.pruning_curve(
                items,
                model=model,
                target=args.target,
                importance=table,
                seed=args.seed,
                max_tokens=args.max_tokens,
                progress=progress,
            )
    table.to_csv(args.out, index_label="name")
    target = table.attrs["target"]
    print(f"wrote {args.out} ({len(items)} texts, {len(table)} heads, {args.method}, {target})")
    top = table.sort_values("importance", ascending=False).head(5)
    print("most important: " + ", ".join(f"{n} {v:.3g}" for n, v in top["importance"].items()))
    if curve is not None:
        curve.to_csv(args.pruning, index=False)
        print(f"wrote {args.pruning}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        {"attend": _attend, "info": _info, "stats": _stats, "importance": _importance}[
            args.command
        ](args)
    except MHSAError as e:
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())

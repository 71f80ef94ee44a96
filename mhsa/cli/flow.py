"""``flow``: direct logit attribution (CSV) and information-flow routes (JSON) of a text, as the
Information flow page computes them (``mhsa.causal.attribution``, ``mhsa.causal.flow``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mhsa.cli.common import add_model_options, wrote
from mhsa.errors import MHSAError

EXAMPLES = (
    'python -m mhsa flow "ba ke mo di lu ba ke mo" --model toy:induction --answer di '
    "--wrong lu --out dla.csv --routes routes.json",
)
HELP = "direct logit attribution (CSV) and information-flow routes (JSON)"
DESCRIPTION = (
    "For pre-norm decoders (GPT-2, the Llama family, the toy models). --out: "
    "each component's direct contribution to logit(answer) - logit(wrong) at the last "
    "token (TransformerLens's logit_attrs). --routes: the information-flow routes to the "
    "last token (Ferrando & Voita 2024, the LLM Transparency Tool's graph)."
)


def add_arguments(flow: argparse.ArgumentParser) -> None:
    flow.add_argument("text", help="the text")
    add_model_options(flow)
    flow.add_argument("--answer", default=None, help="--out: the right next word (one token)")
    flow.add_argument("--wrong", default=None, help="--out: the competing next word")
    flow.add_argument("--max-tokens", type=int, default=None, help="keep this many tokens")
    flow.add_argument("--out", type=Path, default=None, help="direct logit attribution (.csv)")
    flow.add_argument("--routes", type=Path, default=None, help="information-flow routes (.json)")
    flow.add_argument("--threshold", type=float, default=0.04, help="routes: edges kept above")
    flow.add_argument(
        "--no-renormalize",
        dest="renormalize",
        action="store_false",
        help="routes: keep edges above the threshold without renormalising",
    )
    flow.add_argument(
        "--output-token",
        type=int,
        nargs="+",
        default=None,
        help="routes: the positions whose routes are drawn (default: the last)",
    )
    flow.add_argument("--top-k", type=int, default=3, help="routes: promoted tokens per node")


def run(args: argparse.Namespace) -> None:
    import mhsa

    if args.out is None and args.routes is None:
        raise MHSAError("Nothing to write: give --out (with --answer and --wrong) or --routes.")
    if args.out is not None and (args.answer is None or args.wrong is None):
        raise MHSAError("--out attributes logit(answer) - logit(wrong): give --answer and --wrong.")
    lm = mhsa.load_model(args.model, device=args.device)
    if args.out is not None:
        dla = mhsa.causal.head_attribution(
            args.text, model=lm, answer=args.answer, wrong=args.wrong, max_tokens=args.max_tokens
        )
        dla.frame().to_csv(args.out, index=False)
        wrote(
            args.out, f"{dla.norm}, components sum {dla.total:.4g}, logit diff {dla.logit_diff:.4g}"
        )
    if args.routes is not None:
        graph = mhsa.causal.information_flow(
            args.text,
            model=lm,
            threshold=args.threshold,
            renormalize=args.renormalize,
            outputs=args.output_token,
            max_tokens=args.max_tokens,
            top_k=args.top_k,
        )
        args.routes.write_text(json.dumps(routes_json(graph), indent=1), encoding="utf-8")
        wrote(args.routes, f"{len(graph.nodes)} nodes, {len(graph.edges)} edges")


def routes_json(graph: Any) -> dict[str, Any]:
    """A ``mhsa.causal.FlowGraph`` as JSON values: nodes by their LLM Transparency Tool names
    (``X0_3``, ``A1_2``, ``M1_2``, ``I1_2``), edges between those names."""
    return {
        "tokens": list(graph.tokens),
        "layers": graph.layers,
        "outputs": list(graph.outputs),
        "threshold": graph.threshold,
        "renormalize": graph.renormalize,
        "nodes": [
            {
                "name": n.name,
                "kind": n.kind,
                "layer": n.layer,
                "token": n.token,
                "promoted": list(graph.promoted.get(n.name, ())),
            }
            for n in graph.nodes
        ],
        "edges": [
            {
                "source": e.source.name,
                "target": e.target.name,
                "weight": e.weight,
                "kind": e.kind,
                "heads": list(e.heads),
                "residual": e.residual,
            }
            for e in graph.edges
        ],
    }

"""``circuit``: every edge's score between the model's nodes (EAP, EAP-IG or exact), as the
Circuits page computes them (``mhsa.circuits``), as CSV; with ``--top``, the faithfulness of the
top edges and MIB's curve."""

from __future__ import annotations

import argparse
from pathlib import Path

from mhsa.cli.common import add_patching_inputs, metric_kwargs, wrote
from mhsa.errors import MHSAError

EXAMPLES = (
    'python -m mhsa circuit "ba ke mo di fu lo ni pa su te ba ke mo di fu" '
    '"ba ke mo di ra lo ni pa su te ba ke mo di fu" --model toy:induction --answer lo '
    "--wrong ba --method eap-ig --out edges.csv --top 20 --curve curve.csv",
    'python -m mhsa circuit "The cat sat on the mat." "The dog sat on the mat." '
    "--target embedding --method eap-ig --out edges.csv --top 20",
)
HELP = "edge scores between heads, MLPs, the embeddings and the logits (CSV)"
DESCRIPTION = (
    "Edges of the circuit graph (EAP-IG's: a head's q, k and v inputs each read "
    "their own copy of the residual), scored by edge attribution patching (eap), EAP with "
    "integrated gradients (eap-ig) or each edge patched alone (exact), with the metric "
    "logit(answer) - logit(wrong) at the last position (causal LMs) or, for encoders, "
    "patching's --target: the cosine of the sentence embedding with the clean run's "
    "(embedding; eap needs similarity) or with --text-pair's (similarity). --out: one row "
    "per edge, largest |score| first; --top N: the faithfulness of the top N edges; "
    "--curve: f at MIB's sizes, with CPR and CMD. Pre-norm causal language models (GPT-2, "
    "Llama, Qwen, Gemma, Phi-3, the parallel-block GPT-J, GPT-NeoX/Pythia, Phi, Falcon; toy "
    "models) and BERT-family encoders (BERT, RoBERTa, ELECTRA, MiniLM)."
)


def add_arguments(circuit: argparse.ArgumentParser) -> None:
    from mhsa.circuits import EDGE_METHODS

    add_patching_inputs(
        circuit,
        "the text the model runs",
        "the text a corrupted edge takes its source from",
    )
    circuit.add_argument("--method", default="eap-ig", choices=list(EDGE_METHODS))
    circuit.add_argument("--steps", type=int, default=5, help="eap-ig: integrated-gradient steps")
    circuit.add_argument("--out", type=Path, required=True, help="the edges (.csv)")
    circuit.add_argument("--top", type=int, default=None, help="print f of the top N edges")
    circuit.add_argument("--curve", type=Path, default=None, help="MIB's curve (.csv)")


def run(args: argparse.Namespace) -> None:
    import mhsa

    if args.top is not None and args.top < 1:
        raise MHSAError(f"--top must be at least 1, got {args.top}.")
    lm = mhsa.load_model(args.model, device=args.device)
    options = {"model": lm, **metric_kwargs(args)}
    pair = (args.clean, args.corrupted)
    scores = mhsa.circuits.edge_attribution(*pair, method=args.method, steps=args.steps, **options)
    table = mhsa.circuits.top_edges(scores, len(scores))
    table.to_csv(args.out, index=False)
    attrs = scores.attrs
    wrote(
        args.out,
        f"{len(table)} edges by {args.method}; {attrs['metric']}: clean {attrs['clean']:.4g}, "
        f"corrupted {attrs['corrupted']:.4g}",
    )
    if args.top is not None:
        top = min(args.top, len(scores))
        f = mhsa.circuits.circuit_faithfulness(
            *pair, mhsa.circuits.top_edges(scores, top), **options
        )
        print(f"faithfulness of the top {top} edges: {f:.4f}")
    if args.curve is not None:
        curve = mhsa.circuits.faithfulness_curve(*pair, scores, **options)
        curve.points.to_csv(args.curve, index=False)
        wrote(args.curve, f"MIB's sizes; CPR {curve.cpr:.4f}, CMD {curve.cmd:.4f}")

"""EAP's gradients at every target input of a pre-norm model, without a copy of the residual
stream per target.

``get_scores_eap`` (hannamw/EAP-IG ``src/eap/attribute.py``) takes dm/d(in_v) at each target
input v, each head's q, k and v reading its own copy of the residual (TransformerLens's
``use_split_qkv_input``). ``mhsa.circuits.runs``'s probe builds those copies, a zero added to
each, and differentiates with respect to the zeros: a layer's 3H copies are ``[B, 3H, T, D]``,
kept through the backward pass for every layer at once (58 GB for a 1.1B model at 512 tokens,
BENCHMARKS.md §19). At the clean run every copy equals the residual, so the same gradient
follows from the plain forward:

- a head's query input: ``J_norm(x)^T (dm/dQ_h W_Q^h)``, the vector-Jacobian product of the
  layer's attention norm at its input ``x`` with the gradient at our module's per-head Q (its
  observation point "per-head Q", before RoPE and any q/k norm) mapped back through that
  head's slice of W_Q; likewise k and v;
- an MLP's or the logits' input: the gradient at a view of the tensor its norm reads that
  nothing else reads (the residual's skip connection keeps the original), which is dm/d of a
  zero added there.

The plain pass keeps ``[B, H, T, Dh]`` per head part and one ``[B, T, D]`` per MLP; the norms'
products run one layer and one part at a time after the backward pass, and each target's
gradient is turned into its edges' scores (sum over positions of the source's corrupted minus
clean output, dot the gradient) at once, so no ``[targets, T, D]`` tensor is ever whole.
Tested against autograd by hand on the plain transformers models (``tests/test_circuits.py``,
``tests/test_circuits_families.py``) and against the probe's scores (``TAPPED_GRADIENTS`` off).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mhsa.circuits.pairs import CircuitPair
from mhsa.circuits.runs import CircuitRun, Tap, run_circuit

__all__ = ["tapped_scores"]


def _head_gradients(tap: Tap, grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[3H, T, D]``: dm/d(each head's q, k, v input) of ``tap``'s layer, summed over rows."""
    assert tap.x is not None and tap.norm is not None
    x = tap.x.detach()
    parts = []
    for g, w in zip(grads, tap.weights, strict=True):
        cotangent = torch.einsum("bhtk,hkd->bhtd", g, w.to(g.dtype))  # (B, H, T, D)
        with torch.inference_mode(False), torch.enable_grad():
            copies = x[:, None].expand(-1, cotangent.shape[1], -1, -1).clone()
            copies.requires_grad_(True)
            (through,) = torch.autograd.grad(tap.norm(copies), copies, cotangent)
        parts.append(through.sum(0))
    return torch.cat(parts)


def tapped_scores(
    pair: CircuitPair,
    diff: Callable[[], torch.Tensor],
    embeddings: torch.Tensor | None,
    rows: int,
) -> torch.Tensor:
    """``[sources, targets]`` (float64): for each edge (u, v) of the graph, ``diff[u] .
    dm/d in_v`` summed over ``rows`` runs of the clean text (with ``embeddings`` ``[rows, T,
    D]`` in place of its own, when given: EAP-IG's steps); 0 off the graph's edges. ``diff()``:
    ``[sources, T D]`` float64, each source's corrupted minus clean output, asked for after the
    backward pass (so that it need not sit beside the pass's activations). One forward and one
    backward of the plain model; lock held."""
    graph = pair.graph
    run = CircuitRun(graph.upstream, tap=True, embeddings=embeddings)
    with torch.inference_mode(False), torch.enable_grad():
        value = pair.measure(run_circuit(pair.wired, run, pair.ids(rows))).sum()
        tensors = [t for tap in run.taps for t in tap.tensors]
        grads = torch.autograd.grad(value, tensors, allow_unused=True)
    # an input nothing reads (an MLP frozen at zero output) has no gradient: zero
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, tensors, strict=True)]
    differences = diff()
    scores = torch.zeros(
        differences.shape[0], len(graph.upstream), dtype=torch.float64, device=differences.device
    )
    first = 0
    for tap in run.taps:
        mine = grads[first : first + len(tap.tensors)]
        first += len(tap.tensors)
        if tap.norm is None:
            per_target = mine[0].detach().sum(0, keepdim=True)  # (1, T, D)
        else:
            per_target = _head_gradients(tap, mine)  # (3H, T, D)
        p = graph.upstream[tap.start]  # every target of a tap has the same sources
        cols = slice(tap.start, tap.start + tap.count)
        scores[:p, cols] = differences[:p] @ per_target.flatten(1).double().T
    return scores

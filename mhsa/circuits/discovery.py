"""Circuits: which edges between heads carry the answer, and how faithful a small set of them is.

Patching (``mhsa.causal.patching``) scores nodes; this module scores *edges*, as edge attribution
patching (Syed et al. 2023, "Attribution Patching Outperforms Automated Circuit Discovery"),
EAP-IG (Hanna et al. 2024, "Have Faith in Faithfulness") and the MIB benchmark's circuit track
(Mueller et al. 2025) do, following their code: hannamw/EAP-IG ``src/eap/graph.py`` (the graph),
``src/eap/attribute.py`` (``get_scores_eap``, ``get_scores_eap_ig``, ``get_scores_exact``),
``src/eap/evaluate.py`` (``evaluate_graph``) and MIB's ``evaluate_area_under_curve`` (the
faithfulness curve, CPR and CMD).

The graph: nodes ``input`` (the residual entering layer 0: the embeddings), each head
``L{l}H{h}``, each MLP ``M{l}`` and ``logits``. An edge runs from every node into every node
downstream of it: into a head's query, key or value input (each reads its own copy of the
residual, TransformerLens's split q/k/v input), an MLP's input or the logits' input (the last
residual, before the final norm). A head's output is ``z_h W_O^h`` (the output bias is in no
node); a head feeds its own layer's MLP and everything above. GPT-2 small has 32,491 edges, as
MIB counts them.

Scores, with m the metric logit(answer) - logit(wrong) at the last position and ``a_u`` a
source's output:

- ``"eap"``: ``sum over positions of (a_u(corrupted) - a_u(clean)) . dm/d in_v`` at the clean
  run (``get_scores_eap``): the first-order estimate of the exact score, for every edge from one
  clean forward, one corrupted forward and one backward.
- ``"eap-ig"``: the same with the gradient averaged over the runs whose embeddings are
  ``corrupted + (k / steps) (clean - corrupted)`` for k = 0 .. steps - 1 (``get_scores_eap_ig``);
  the steps run side by side as one batch.
- ``"exact"``: m with that edge alone carrying the corrupted activation, minus m of the clean
  run (``get_scores_exact``); ``path_patch`` of the edge.

On encoders (the BERT family: BERT, RoBERTa, ELECTRA, MiniLM) m is patching's embedding target
(``mhsa.causal.metrics.PATCH_TARGETS``): "embedding", the cosine of the sentence embedding with the
clean run's (1 for the clean run), or "similarity", with that of a second sentence
``text_pair``; each target reads its own copy of the post-norm chain (``mhsa.circuits.postnorm``,
our definition). The gradient of "embedding" is zero at the clean run, so plain EAP refuses it.

Everything runs through our module (``mhsa.engine.runs.swap``, wired by ``mhsa.circuits.runs``) with
the
model's own weights, on pre-norm causal language models (GPT-2, the Llama family, the toy
models), the parallel-block families GPT-J, GPT-NeoX, Phi and Falcon (whose MLP reads the
layer's input, so that a head feeds only the MLPs of the layers above it) and BERT-family
encoders. Circuits evaluated together (a faithfulness curve, exact scores) run as the rows of
one batch, each row with its own corrupted edges, as leave-one-out batches heads.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from mhsa.circuits.graph import CircuitGraph
from mhsa.circuits.pairs import (
    EAP_ONE_PASS_MAX,
    CircuitPair,
    circuit_pair,
    probe_gradients,
    run_pair,
)
from mhsa.circuits.postnorm import PostNormModel, postnorm_edge_scores, rows_per_pass
from mhsa.circuits.runs import CircuitModel, CircuitRun, circuit_model, run_circuit
from mhsa.circuits.taps import tapped_scores
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.result import html_view
from mhsa.engine.runs.swap import OurBlock, OurPass
from mhsa.errors import InputError
from mhsa.registry import lookup

__all__ = [
    "EAP_ONE_PASS_MAX",
    "EDGE_METHODS",
    "MIB_PERCENTAGES",
    "CircuitGraph",
    "FaithfulnessCurve",
    "PathPatch",
    "circuit_faithfulness",
    "circuit_graph",
    "edge_attribution",
    "edge_attribution_ids",
    "faithfulness_curve",
    "path_patch",
    "top_edges",
]

Progress = Callable[[int, int], None]

#: the scoring methods of ``edge_attribution``, by name
EDGE_METHODS: dict[str, str] = {
    "eap": "edge attribution patching: (corrupted - clean source output) . gradient at the "
    "target input, at the clean run (get_scores_eap)",
    "eap-ig": "EAP with integrated gradients: the gradient averaged over embeddings interpolated "
    "from the corrupted to the clean text (get_scores_eap_ig)",
    "exact": "each edge patched alone: m with the edge carrying the corrupted activation minus "
    "m of the clean run (get_scores_exact)",
}
#: pre-norm models take EAP's and EAP-IG's gradients from a plain pass with taps
#: (``mhsa.circuits.taps``) unless the pair's own pass has them (small models); False: from the
#: probe's copy of the residual per target (the reference ``bench.bench_circuits`` compares with)
TAPPED_GRADIENTS = True
#: the circuit sizes of MIB's faithfulness curve, as fractions of all edges
MIB_PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def circuit_graph(model: str | LoadedModel = DEFAULT_MODEL) -> CircuitGraph:
    """The circuit graph of ``model``.

    Raises:
        UnsupportedModelError: a model circuits cannot run on (the message says which tools
            need what).
    """
    lm = resolve_model(model)
    with lm.lock:
        wired = circuit_model(lm)
    return wired.graph


def _check_whole(value: object, what: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise InputError(f"{what} must be a whole number of at least {low}, got {value!r}.")
    return int(value)


# --- scores ------------------------------------------------------------------------------------


def _gradients(pair: CircuitPair, embeddings: torch.Tensor | None, rows: int) -> torch.Tensor:
    """``[targets, T, D]``: dm/d(each target input), summed over ``rows`` runs of the clean
    text (with ``embeddings`` in place of its own, when given). One forward and one backward."""
    run = CircuitRun(pair.graph.upstream, probe=True, embeddings=embeddings)
    with torch.inference_mode(False), torch.enable_grad():
        value = pair.measure(run_circuit(pair.wired, run, pair.ids(rows))).sum()
        return probe_gradients(value, run.zeros, None)


def _gradient_runs(
    pair: CircuitPair, method: str, steps: int, batch: int
) -> list[tuple[torch.Tensor | None, int]]:
    """The runs of the clean text whose gradients the method sums: ``(embeddings, rows)`` per
    pass; EAP: the text itself, once; EAP-IG: ``steps`` rows of embeddings from the corrupted
    text's towards the clean text's, ``batch`` per pass."""
    if method == "eap":
        return [(None, 1)]
    clean, corrupted = pair.acts_clean[0], pair.acts_corrupted[0]  # the input node
    alphas = torch.arange(steps, dtype=clean.dtype, device=clean.device) / steps
    if isinstance(pair.wired, PostNormModel):  # every row carries every target's copy
        batch = min(batch, rows_per_pass(pair.wired, clean.shape[0], probe=True))
    chunks = [alphas[i : i + batch] for i in range(0, steps, batch)]
    return [
        (corrupted + chunk[:, None, None] * (clean - corrupted), len(chunk)) for chunk in chunks
    ]


def _differences(pair: CircuitPair) -> torch.Tensor:
    """``[sources, T D]``: each source's output on the corrupted text minus on the clean one."""
    return (pair.acts_corrupted - pair.acts_clean).flatten(1)


def _summed(
    fn: Callable[[torch.Tensor | None, int], torch.Tensor],
    runs: Sequence[tuple[torch.Tensor | None, int]],
    progress: Progress | None,
) -> torch.Tensor:
    """``fn(embeddings, rows)`` summed over ``runs`` (at least one), ``progress`` after each."""
    total = torch.zeros(0)
    for done, run in enumerate(runs, start=1):
        part = fn(*run)
        total = part if done == 1 else total + part
        if progress is not None:
            progress(done, len(runs))
    return total


def _attribution(pair: CircuitPair, method: str, steps: int, batch: int, progress) -> np.ndarray:
    """``[sources, targets]`` EAP or EAP-IG scores."""
    graph, scale = pair.graph, 1 / steps if method == "eap-ig" else 1.0
    runs = (
        []
        if method == "eap" and pair.grads is not None
        else _gradient_runs(pair, method, steps, batch)
    )
    if runs and TAPPED_GRADIENTS and isinstance(pair.wired, CircuitModel):  # no copy per target
        # (sources, T D) in float64, made once, after the first backward pass (not beside it)
        diff = functools.cache(lambda: _differences(pair).double())
        scores = _summed(lambda e, rows: tapped_scores(pair, diff, e, rows), runs, progress)
        return np.where(graph.mask, (scores * scale).cpu().numpy(), 0.0)
    diff = _differences(pair)
    if runs:
        grads = _summed(lambda e, rows: _gradients(pair, e, rows), runs, progress)
    else:  # the pair's own pass had them
        grads = pair.grads
        if progress is not None:
            progress(1, 1)
    grads = grads * scale
    if isinstance(pair.wired, PostNormModel):  # (probe rows, T D), about 6x the targets: float32
        scores = postnorm_edge_scores(graph.layers, graph.heads, diff, grads.flatten(1))
        return np.where(graph.mask, scores.double().cpu().numpy(), 0.0)
    diff, grads = diff.double(), grads.flatten(1).double()  # (targets, T D)
    # only the edges: each run of targets with the same upstream sources is one product (about
    # half the work of all sources x all targets)
    upstream = graph.upstream
    scores = torch.zeros(diff.shape[0], grads.shape[0], dtype=torch.float64, device=diff.device)
    start = 0
    for end in range(1, len(upstream) + 1):
        if end == len(upstream) or upstream[end] != upstream[start]:
            p = upstream[start]
            scores[:p, start:end] = diff[:p] @ grads[start:end].T
            start = end
    return np.where(graph.mask, scores.cpu().numpy(), 0.0)


def _exact(pair: CircuitPair, batch: int, progress) -> np.ndarray:
    """``[sources, targets]``: m with each edge alone corrupted, minus m_clean."""
    graph = pair.graph
    s, t = np.nonzero(graph.mask)
    scores = np.zeros(graph.mask.shape)
    chunks = [range(i, min(i + batch, len(s))) for i in range(0, len(s), batch)]
    for done, chunk in enumerate(chunks, start=1):
        corrupt = np.zeros((len(chunk), *graph.mask.shape), dtype=np.float32)
        corrupt[np.arange(len(chunk)), s[chunk.start : chunk.stop], t[chunk.start : chunk.stop]] = 1
        with torch.inference_mode():
            values = pair.corrupted_runs(corrupt)
        scores[s[chunk.start : chunk.stop], t[chunk.start : chunk.stop]] = values - pair.m_clean
        if progress is not None:
            progress(done, len(chunks))
    return scores


def edge_attribution(
    clean: str,
    corrupted: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    target: str | None = None,
    text_pair: str | None = None,
    method: str = "eap",
    steps: int = 5,
    max_tokens: int | None = None,
    batch_size: int = 32,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """A score for every edge of the circuit graph (see the module's docstring).

    ``"eap"`` and ``"eap-ig"`` follow hannamw/EAP-IG's ``get_scores_eap`` and
    ``get_scores_eap_ig`` (activation difference corrupted - clean, the gradient at the clean
    text's run, or averaged over ``steps`` runs whose embeddings go from the corrupted text's
    towards the clean text's); ``"exact"`` is ``get_scores_exact``: m with the edge carrying the
    corrupted activation, minus m of the clean run (``path_patch`` of each edge). A negative
    score is an edge whose corruption lowers logit(answer) - logit(wrong).

    Args:
        clean: the text the model runs.
        corrupted: the text whose activations a corrupted edge carries; as many tokens.
        model: a pre-norm causal LM (``"toy:induction"``, a GPT-2, Llama-family, GPT-J,
            GPT-NeoX, Phi or Falcon model id or folder) or a BERT-family encoder
            (``"default"``, MiniLM), or a ``LoadedModel``.
        answer, wrong: words that are each exactly one token after a space (causal LMs).
        target: encoders: ``"embedding"`` (the default; cosine of the sentence embedding with
            the clean run's) or ``"similarity"`` (with ``text_pair``'s), as patching's
            ``mhsa.causal.metrics.PATCH_TARGETS``; plain ``"eap"`` refuses ``"embedding"``, whose
            gradient is zero at the clean run.
        text_pair: the second sentence of the target ``"similarity"``.
        method: ``"eap"``, ``"eap-ig"`` or ``"exact"`` (``EDGE_METHODS``).
        steps: EAP-IG's steps.
        max_tokens: truncate both texts to this many tokens.
        batch_size: runs side by side in one forward pass (IG steps; exact edges).
        progress: ``progress(done, total)`` after each pass; raising from it stops.

    Returns:
        One row per edge: ``source``, ``target``, ``input`` ("q"/"k"/"v" into a head, ""
        otherwise) and ``score``. ``attrs``: ``method``, ``steps``, ``metric``, ``clean`` and
        ``corrupted`` (m of the two runs), ``clean_tokens``, ``corrupted_tokens``, ``model``,
        ``layers``, ``heads``.

    Raises:
        UnsupportedModelError: the model is not a pre-norm causal LM our module runs (the
            message says which tools need what).
        InputError: an unknown method, steps or batch size below 1, answer/wrong as for
            patching, texts of different token counts (both token lists named), texts that
            give the same metric.
    """
    lookup(EDGE_METHODS, method, "edge-scoring method")
    steps = _check_whole(steps, "steps")
    batch_size = _check_whole(batch_size, "batch_size")
    lm = resolve_model(model)
    with lm.lock:
        pair = circuit_pair(
            lm,
            clean,
            corrupted,
            answer,
            wrong,
            max_tokens,
            method == "eap",
            target,
            text_pair,
            method,
        )
        if method == "exact":
            scores = _exact(pair, batch_size, progress)
        else:
            scores = _attribution(pair, method, steps, batch_size, progress)
    frame = pair.graph.edges(scores)
    frame.attrs.update(pair.attrs(), method=method, steps=steps if method == "eap-ig" else None)
    return frame


def edge_attribution_ids(
    lm: LoadedModel,
    clean_ids: torch.Tensor,
    corrupted_ids: torch.Tensor,
    answer_id: int,
    wrong_id: int,
    *,
    method: str = "eap",
    steps: int = 5,
    blocks: list[OurBlock] | None = None,
    running: OurPass | None = None,
) -> pd.DataFrame:
    """``edge_attribution`` on token ids ``[1, T]`` and answer ids: a training run's fixed
    probe pair (``blocks``: the run's modules, already standing in the model with the pass
    ``running``). Returns ``edge_attribution``'s table.

    Raises:
        InputError: ids of different shapes, an unknown method, or a pair giving the same
            metric; UnsupportedModelError as ``edge_attribution``.
    """
    lookup(EDGE_METHODS, method, "edge-scoring method")
    steps = _check_whole(steps, "steps")
    if clean_ids.dim() != 2 or clean_ids.shape != corrupted_ids.shape or len(clean_ids) != 1:
        raise InputError(
            f"Give two id tensors of one row and the same length, got {list(clean_ids.shape)} "
            f"and {list(corrupted_ids.shape)}."
        )
    with lm.lock:
        wired = circuit_model(lm, blocks, running)
        names = getattr(lm.tokenizer, "convert_ids_to_tokens", None)

        def strings(ids: torch.Tensor) -> list[str]:
            return list(names(ids[0].tolist())) if names else [str(i) for i in ids[0].tolist()]

        metric = f"logit(#{answer_id}) − logit(#{wrong_id}) at the last position"
        pair = run_pair(
            wired,
            {"input_ids": clean_ids},
            {"input_ids": corrupted_ids},
            int(answer_id),
            int(wrong_id),
            metric,
            (strings(clean_ids), strings(corrupted_ids)),
            method == "eap",
        )
        if method == "exact":
            with torch.inference_mode():
                scores = _exact(pair, 32, None)
        else:
            scores = _attribution(pair, method, steps, 32, None)
    frame = pair.graph.edges(scores)
    frame.attrs.update(pair.attrs(), method=method, steps=steps if method == "eap-ig" else None)
    return frame


# --- circuits and their faithfulness -------------------------------------------------------------


def top_edges(scores: pd.DataFrame, n: int) -> pd.DataFrame:
    """The ``n`` edges of largest ``|score|`` (MIB's ``apply_topn`` with ``absolute=True``),
    largest first; ties keep the table's order."""
    n = _check_whole(n, "The number of edges", 0)
    order = np.argsort(-scores["score"].abs().to_numpy(), kind="stable")
    return scores.iloc[order[:n]]


def _faithfulness(pair: CircuitPair, chosen: Sequence[np.ndarray], batch: int) -> np.ndarray:
    """f of each circuit (``[sources, targets]`` masks), ``batch`` circuits per pass."""
    mask = pair.graph.mask
    values = []
    for i in range(0, len(chosen), batch):
        corrupt = np.stack([mask & ~c for c in chosen[i : i + batch]]).astype(np.float32)
        with torch.inference_mode():
            values.append(pair.corrupted_runs(corrupt))
    m = np.concatenate(values)
    return (m - pair.m_corrupted) / (pair.m_clean - pair.m_corrupted)


def circuit_faithfulness(
    clean: str,
    corrupted: str,
    edges: pd.DataFrame | Iterable[Sequence[Any]],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    target: str | None = None,
    text_pair: str | None = None,
    max_tokens: int | None = None,
) -> float:
    """How much of the clean behaviour a circuit keeps: ``f = (m_circuit - m_corrupted) /
    (m_clean - m_corrupted)``, where m_circuit runs the clean text with every edge *not* in
    ``edges`` carrying its source's activation from the corrupted text (EAP-IG's
    ``evaluate_graph`` with ``intervention="patching"``). Every edge gives 1, no edge 0.

    Args:
        edges: rows ``(source, target, input)``, or a table with those columns (as
            ``edge_attribution`` returns, or ``top_edges`` of it).
        the rest: as ``edge_attribution``.

    Raises:
        InputError: an edge not in the graph; and as ``edge_attribution``.
    """
    lm = resolve_model(model)
    with lm.lock:
        pair = circuit_pair(
            lm, clean, corrupted, answer, wrong, max_tokens, False, target, text_pair
        )
        return float(_faithfulness(pair, [pair.graph.selection(edges)], 1)[0])


@dataclass(frozen=True)
class FaithfulnessCurve:
    """Faithfulness of the top-n edges at several n (MIB's ``evaluate_area_under_curve``).

    Attributes:
        points: one row per circuit: ``fraction`` (of all edges), ``edges`` (n), ``mib``
            (one of MIB's sizes, else an extra n asked for) and ``faithfulness``.
        cpr: MIB's CPR: the area under f over MIB's fractions (trapezoids, linear scale);
            higher is better.
        cmd: MIB's CMD: the area under |1 - f| there; lower is better.
        clean, corrupted: m of the two runs.
        total: the graph's number of edges.
    """

    points: pd.DataFrame
    cpr: float
    cmd: float
    clean: float
    corrupted: float
    total: int

    def _repr_html_(self) -> str:
        """In a notebook: f against the edges kept, and the points
        (``mhsa.plots.notebook_results.faithfulness_html``)."""
        return html_view("faithfulness curve")(self)


def _areas(fractions: Sequence[float], f: Sequence[float]) -> tuple[float, float]:
    """MIB's area under f and under |1 - f| (trapezoids over the fractions)."""
    x, y = np.asarray(fractions, float), np.asarray(f, float)
    widths = np.diff(x)
    under = float(np.sum(widths * (y[:-1] + y[1:]) / 2))
    from_one = float(np.sum(widths * (np.abs(1 - y[:-1]) + np.abs(1 - y[1:])) / 2))
    return under, from_one


def faithfulness_curve(
    clean: str,
    corrupted: str,
    scores: pd.DataFrame,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    target: str | None = None,
    text_pair: str | None = None,
    extra: Sequence[int] = (),
    max_tokens: int | None = None,
    batch_size: int = 16,
) -> FaithfulnessCurve:
    """f of the top-n edges by ``|score|`` at MIB's sizes (``int(fraction * edges)`` for each
    of ``MIB_PERCENTAGES``), with CPR and CMD as MIB computes them, and at the ``extra`` n
    (the page's chosen n). All the circuits run as rows of one batch (``batch_size`` per pass).

    MIB prunes each circuit (``Graph.prune``) before evaluating it; that removes edges from
    nodes no input reaches or that reach no output, which carry the corrupted activation (or
    none that matters) either way, so f is the same.

    Args:
        scores: ``edge_attribution``'s table (for this model).
        extra: more n to evaluate (each clamped to 0 .. all edges).
        the rest: as ``edge_attribution``.

    Raises:
        InputError: a scores table of another graph; and as ``edge_attribution``.
    """
    batch_size = _check_whole(batch_size, "batch_size")
    lm = resolve_model(model)
    with lm.lock:
        pair = circuit_pair(
            lm, clean, corrupted, answer, wrong, max_tokens, False, target, text_pair
        )
        total = pair.graph.n_edges
        if len(scores) != total:
            raise InputError(
                f"The scores table has {len(scores)} edges; {pair.wired.lm.display_name}'s "
                f"graph has {total}: score this model's edges first."
            )
        counts = [int(p * total) for p in MIB_PERCENTAGES]
        counts += [min(max(int(n), 0), total) for n in extra]
        chosen = pair.graph.top_masks(scores, counts)
        f = _faithfulness(pair, chosen, batch_size)
    mib = len(MIB_PERCENTAGES)
    cpr, cmd = _areas(MIB_PERCENTAGES, f[:mib])
    points = pd.DataFrame(
        {
            "fraction": [*MIB_PERCENTAGES, *(n / total for n in counts[mib:])],
            "edges": counts,
            "mib": [True] * mib + [False] * (len(counts) - mib),
            "faithfulness": f,
        }
    )
    return FaithfulnessCurve(points, cpr, cmd, pair.m_clean, pair.m_corrupted, total)


# --- one edge -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PathPatch:
    """One edge path-patched: the clean run with only ``sender -> receiver (input)`` carrying
    the sender's output from the corrupted text.

    Attributes:
        sender, receiver, input: the edge.
        patched: m of that run; clean, corrupted: m of the two plain runs.
        score: ``patched - clean`` (the edge's ``"exact"`` score).
        effect: ``score / (corrupted - clean)``: the share of the whole clean-to-corrupted
            change this one edge makes (1: all of it).
    """

    sender: str
    receiver: str
    input: str
    patched: float
    clean: float
    corrupted: float

    @property
    def score(self) -> float:
        return self.patched - self.clean

    @property
    def effect(self) -> float:
        return self.score / (self.corrupted - self.clean)

    def _repr_html_(self) -> str:
        """In a notebook: the three runs' metric as bars, and the numbers
        (``mhsa.plots.notebook_results.path_patch_html``)."""
        return html_view("path patch")(self)


def path_patch(
    clean: str,
    corrupted: str,
    sender: str,
    receiver: str,
    input: str = "",
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    target: str | None = None,
    text_pair: str | None = None,
    max_tokens: int | None = None,
) -> PathPatch:
    """Path patching of one edge, TransformerLens's convention (Wang et al. 2022, IOI; the
    ARENA path-patching exercises): the clean run, with the receiver's ``input`` (q, k or v of
    a head; "" for an MLP or the logits) reading the sender's output from the corrupted run
    along this one path, and the sender's output on every other path, and every other node's
    on every path, as the clean run has them; the nodes after the receiver are recomputed.

    Raises:
        InputError: no such edge (the message says what there is); and as ``edge_attribution``.
    """
    lm = resolve_model(model)
    with lm.lock:
        pair = circuit_pair(
            lm, clean, corrupted, answer, wrong, max_tokens, False, target, text_pair
        )
        u, v = pair.graph.edge(sender, receiver, input)
        corrupt = np.zeros((1, *pair.graph.mask.shape), dtype=np.float32)
        corrupt[0, u, v] = 1
        with torch.inference_mode():
            patched = float(pair.corrupted_runs(corrupt)[0])
    return PathPatch(sender, receiver, input or "", patched, pair.m_clean, pair.m_corrupted)

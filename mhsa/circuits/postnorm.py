"""Circuit runs on post-norm encoders (the BERT family: BERT, RoBERTa, ELECTRA, MiniLM).

The graph is EAP-IG's (hannamw/EAP-IG ``src/eap/graph.py``), as for pre-norm models
(``mhsa.circuits.runs``): sources ``input``, each head's ``z_h W_O^h`` and each MLP's output;
targets each head's q, k and v input, each MLP's input and ``logits`` (here: the last hidden
state that the sentence embedding pools). What a target *reads* is our definition, since a
post-norm stream is not a sum of node outputs (Kobayashi et al. 2021, "Incorporating Residual
and Normalization Layers into Analysis of Masked Language Models", decompose it through the
norms instead). In layer l, with input ``x_l`` (``x_0``: the embeddings' output, the ``input``
node)::

    y_l     = LN_a(sum_h a_{l,h} + b_O + x_l)      a_{l,h} = z_h W_O^h; b_O in no node
    x_{l+1} = LN_m(mlp_l + y_l)                    mlp_l = output.dense(intermediate(y_l))

Each target v reads its OWN COPY of that chain, recomputed with the norms on the copy::

    x^v_0     = input (the corrupted run's when the edge input -> v is corrupted)
    y^v_j     = LN_a(sum_h ã_{j,h} + b_O + x^v_j)          for each layer j below v
    x^v_{j+1} = LN_m(m̃_j + y^v_j)

(MLP l reads ``y^v_l``, with the heads of layer l), where ``ã_u`` is this run's output of source
u, or the corrupted run's when the edge u -> v is corrupted. A head's q, k and v are projected
from its own copies (no norm before attention in post-norm: ``q = x^v W_Q^h + b_Q^h``). With
nothing corrupted every copy is the real forward, so f(all edges) = 1 and f(no edge) = 0.

EAP's score of u -> v is ``Δa_u . dm/d(a_u as read by v's copy)``: the gradient at u's write
point in v's copy (the pre-LN_a sum of layer j for a head of layer j: all heads of a layer share
it; the pre-LN_m sum of layer j for MLP j; ``x^v_0`` for the input). A zero added at every write
point of every copy (``probe_layout``) gives all of them from one backward.

The copies of every target not yet reached advance together, one layer at a time (``[B, targets
above, T, D]``), so a run makes as many norm calls as the plain forward, on about L (3H + 1) / 2
times the rows on average; with nothing corrupted and no probe they are one, the plain stream.
A run that corrupts edges and probes nothing (faithfulness, exact scores) keeps a copy only for
a row's target whose edges so far are mixed: one none of whose edges is corrupted reads the
row's own stream, one all of whose edges are corrupted the corrupted run's (``_Mixed``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mhsa.causal.metrics import sentence_embedding
from mhsa.circuits.graph import CircuitGraph, graph_of
from mhsa.engine.attention.core import attention_core, combine_masks
from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.runs.swap import OurBlock
from mhsa.engine.stream.hooks import StopPass, before, hooked

__all__ = [
    "PostNormModel",
    "embedding_metric",
    "is_post_norm_encoder",
    "pooled",
    "postnorm_edge_scores",
    "postnorm_model",
    "probe_layout",
    "rows_per_pass",
    "run_postnorm",
]

#: the copies one pass may hold at once (float32 values of every row's copies, summed over the
#: layers; autograd keeps about three times that): rows beyond it run in chunks
COPY_BUDGET_BYTES = 1 << 30

#: runs that corrupt edges (and probe nothing) carry a copy only for a row's target whose edges
#: so far are mixed (``mhsa.circuits.postnorm``'s docstring); False: every target's copy (the
#: reference the tests and ``bench.bench_circuits`` compare with)
COPIES_ONLY_WHERE_MIXED = True

#: the bits of the integer key that tells those copies apart (``_distinct``); a key that does not
#: fit is a row of integers (slower)
KEY_BITS = 62

#: what a post-norm encoder's circuits need, for messages
POST_NORM_LAYOUT = (
    "circuits on encoders follow the BERT family's post-norm layers (BERT, RoBERTa, ELECTRA, "
    "MiniLM: attention.output.LayerNorm, intermediate, output.dense and output.LayerNorm)"
)


class _Run(Protocol):
    """What a run asks (``mhsa.circuits.runs.CircuitRun``'s fields)."""

    upstream: Sequence[int]
    corrupt: torch.Tensor | None
    corrupted: torch.Tensor | None
    probe: bool
    embeddings: torch.Tensor | None
    acts: list[torch.Tensor]
    zeros: list[torch.Tensor]


@dataclass(frozen=True, eq=False)
class PostNormModel:
    """A BERT-family encoder's parts that a circuit run touches (``postnorm_model``).

    Attributes:
        lm: the model.
        blocks: our module in every attention block.
        layers: the encoder's layers.
        ln_attn, ln_mlp: per layer, LN_a (``attention.output.LayerNorm``) and LN_m
            (``output.LayerNorm``).
        mlps: per layer, ``output.dense(intermediate(.))`` as a function.
        w_qkv: per layer, ``(W_Q, W_K, W_V)`` per head ``[H, Dh, D]`` and biases ``[H, 1, Dh]``.
        w_o: per layer, each head's slice of W_O ``[H, Dh, D]``; b_o: W_O's bias ``[D]``.
        num_layers, num_heads: the graph's shape.
    """

    lm: LoadedModel
    blocks: list[OurBlock]
    layers: list[nn.Module]
    ln_attn: list[nn.Module]
    ln_mlp: list[nn.Module]
    mlps: list[Callable[[torch.Tensor], torch.Tensor]]
    w_qkv: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]]
    w_o: list[torch.Tensor]
    b_o: list[torch.Tensor]
    num_layers: int
    num_heads: int

    @property
    def graph(self) -> CircuitGraph:
        """The model's circuit graph (sequential: a head feeds its own layer's MLP)."""
        return graph_of(self.num_layers, self.num_heads)


def is_post_norm_encoder(lm: LoadedModel, blocks: Sequence[OurBlock]) -> bool:
    """An encoder (no next-token head, not an encoder-decoder; attention not causal): the
    post-norm wiring's candidates (``postnorm_model`` then checks the BERT family's layout)."""
    return (
        not lm.is_encoder_decoder
        and lm.lm_head != "causal"
        and bool(blocks)
        and not blocks[0].causal
    )


def _mlp(layer: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda y: layer.output.dense(layer.intermediate(y))


def postnorm_model(
    lm: LoadedModel, blocks: list[OurBlock], unsupported: Callable[[str], Exception]
) -> PostNormModel:
    """``lm``'s parts for circuit runs; ``unsupported(why)`` makes the error for a layout
    outside the BERT family's. Caller holds ``lm.lock``."""
    layers, ln_attn, ln_mlp, mlps, w_qkv, w_o, b_o = [], [], [], [], [], [], []
    with torch.inference_mode(False), torch.no_grad():
        for block in blocks:
            layer = getattr(*block.layer_place)
            attention, out = block.original, getattr(layer, "output", None)
            parts = (
                getattr(getattr(attention, "output", None), "LayerNorm", None),
                getattr(layer, "intermediate", None),
                getattr(out, "dense", None),
                getattr(out, "LayerNorm", None),
            )
            if getattr(layer, "attention", None) is not attention or not all(
                isinstance(p, nn.Module) for p in parts
            ):
                raise unsupported(f"a layout outside the BERT family's ({POST_NORM_LAYOUT})")
            ours = block.ours
            if ours.groups != 1:
                raise unsupported("grouped-query attention in an encoder")
            (q, k, v, o), (bq, bk, bv, bo) = ours.projections()
            h = ours.num_heads
            biases = tuple(None if b is None else b.reshape(h, 1, -1) for b in (bq, bk, bv))
            w_qkv.append((tuple(w.reshape(h, -1, w.shape[-1]) for w in (q, k, v)), biases))
            w_o.append(o.T.contiguous().reshape(h, -1, o.shape[0]))  # (H, Dh, D)
            b_o.append(torch.zeros(o.shape[0]) if bo is None else bo.detach())
            layers.append(layer)
            ln_attn.append(parts[0])
            ln_mlp.append(parts[3])
            mlps.append(_mlp(layer))
    parts = (layers, ln_attn, ln_mlp, mlps, w_qkv, w_o, b_o)
    return PostNormModel(lm, list(blocks), *parts, len(blocks), blocks[0].ours.num_heads)


# --- write points and probes -------------------------------------------------------------------


def _sources_at(w: int, heads: int) -> slice:
    if w == 0:
        return slice(0, 1)
    layer, mlp = divmod(w - 1, 2)
    first = 1 + layer * (heads + 1)
    return slice(first + heads, first + heads + 1) if mlp else slice(first, first + heads)


def probe_layout(layers: int, heads: int) -> list[tuple[int, int, int]]:
    """``(write point, first target, targets)`` of each probe zero a probing run adds, in
    order: ``x_0`` of every target's copy; then per layer l its pre-LN_a sum in the copies of
    its MLP and every target above, and its pre-LN_m sum in those of every target above (the
    graph orders targets by layer, each layer's MLP after its heads, so each is a run)."""
    group = 3 * heads + 1
    targets = layers * group + 1
    out = [(0, 0, targets)]
    for layer in range(layers):
        mlp, above = layer * group + 3 * heads, (layer + 1) * group
        out += [(1 + 2 * layer, mlp, targets - mlp), (2 + 2 * layer, above, targets - above)]
    return out


def postnorm_edge_scores(
    layers: int, heads: int, diff: torch.Tensor, grads: torch.Tensor
) -> torch.Tensor:
    """``[sources, targets]``: ``diff [sources, T D]`` (a source's corrupted - clean output)
    times the gradient at its write point in each target's copy (``grads [probes' targets,
    T D]``, the probes of ``probe_layout`` in order); 0 where there is no edge."""
    targets = layers * (3 * heads + 1) + 1
    scores = torch.zeros(diff.shape[0], targets, dtype=diff.dtype, device=diff.device)
    row = 0
    for w, first, n in probe_layout(layers, heads):
        scores[_sources_at(w, heads), first : first + n] = diff[_sources_at(w, heads)] @ (
            grads[row : row + n].T
        )
        row += n
    return scores


# --- a run --------------------------------------------------------------------------------------


def embedded(
    model: PostNormModel, inputs: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x_0`` (what the model gives layer 0: embeddings, and ELECTRA's projection) and the
    attention mask the model gives its layers (None: attend everywhere)."""
    got: list[Any] = []

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        mask = args[1] if len(args) > 1 else kwargs.get("attention_mask")
        got.extend((hidden, mask if isinstance(mask, torch.Tensor) else None))
        raise StopPass  # the rest of the model is ours

    device = model.lm.device
    with hooked([before(model.layers[0], hook, kwargs=True)], stop=True):
        model.lm.model(**{k: v.to(device) for k, v in inputs.items()})
    return got[0], got[1]


@dataclass
class _Copies:
    """The copies of every target above the current layer, advanced one layer at a time
    (``[B, n, T, D]``; one column, the plain stream, when nothing is corrupted or probed)."""

    run: _Run
    heads: int
    shared: bool  # nothing corrupted, no probe: every copy is the plain stream

    def add(
        self, x: torch.Tensor, w: int, first: int, also: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` (the copies of targets ``first ..``, ``[B, n, T, D]``) plus ``also`` (``[B, T,
        D]``, what every copy adds there) and the corrupted edges at write point ``w``; when
        probing, kept in ``run.zeros`` for the gradient there (autograd gives it for the sum
        itself as for a zero added to it). The corrupted edges and ``also`` go in with ``x`` in
        one batched product (``baddbmm``): these sums are the copies' main memory traffic."""
        run, (b, n, t, d) = self.run, x.shape
        mask = None
        if not self.shared and run.corrupt is not None and run.corrupted is not None:
            sources = _sources_at(w, self.heads)
            mask = run.corrupt[:, sources, first : first + n]  # (B, s, n)
            mask = mask if bool(mask.any()) else None
        if mask is not None:
            acts = torch.stack(run.acts[sources], dim=1)  # (B, s, T, D)
            diffs = (run.corrupted[None, sources].to(acts.dtype) - acts).flatten(2)  # (B, s, TD)
            weights = mask.to(acts.dtype).transpose(1, 2)  # (B, n, s)
            if also is not None:
                diffs = torch.cat([diffs, also.flatten(1)[:, None]], 1)  # (B, s + 1, TD)
                weights = torch.cat([weights, weights.new_ones(b, n, 1)], 2)
            base = x[:, :1] if x.stride(1) == 0 else x  # an expanded x_0: broadcast, not copied
            x = torch.baddbmm(base.reshape(b, base.shape[1], -1), weights, diffs).view(b, n, t, d)
        elif also is not None:
            x = x + also[:, None]
        if run.probe and w == 0:  # x_0 (an expanded view, maybe of no grad): a zero added
            zero = torch.zeros(x.shape, dtype=x.dtype, device=x.device, requires_grad=True)
            x = x + zero
            run.zeros.append(zero)
        elif run.probe:  # a fresh sum downstream of that zero: its gradient is the probe's
            run.zeros.append(x)
        return x


def _heads(model: PostNormModel, layer: int, x: torch.Tensor) -> list[torch.Tensor]:
    """Q, K, V ``[B, H, T, Dh]`` of ``layer``: each head's from its own copies (``x [B, 3H,
    T, D]``: every head's q copy, then k, then v), or all from one stream (``x [B, 1, T, D]``)."""
    weights, biases = model.w_qkv[layer]
    heads, out = model.num_heads, []
    for part, (w, b) in enumerate(zip(weights, biases, strict=True)):
        if x.shape[1] == 1:
            y = torch.einsum("btd,hkd->bhtk", x[:, 0], w.to(x.dtype))  # (B, H, T, Dh)
        else:
            copies = x[:, part * heads : (part + 1) * heads]  # (B, H, T, D)
            y = torch.einsum("bhtd,hkd->bhtk", copies, w.to(x.dtype))
        out.append(y if b is None else y + b.to(y.dtype))
    return out


def rows_per_pass(model: PostNormModel, tokens: int, probe: bool) -> int:
    """How many rows of ``tokens`` tokens keep a pass within ``COPY_BUDGET_BYTES`` (at least
    one): each row's copies hold ``sum over layers of the targets above`` streams of ``[T, D]``
    (MiniLM: 783 of them), three times that with autograd."""
    group, d = 3 * model.num_heads + 1, model.w_o[0].shape[-1]
    targets = model.num_layers * group + 1
    streams = sum(targets - layer * group for layer in range(model.num_layers))
    row = streams * tokens * d * 4 * (3 if probe else 1)
    return max(1, COPY_BUDGET_BYTES // row)


def run_postnorm(
    model: PostNormModel, run: _Run, inputs: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """``inputs`` through ``model`` wired as ``run`` asks (a ``mhsa.circuits.runs.CircuitRun``);
    returns the logits node's copy of the last hidden state ``[B, T, D]`` and fills ``run``
    (``acts``; ``zeros`` in ``probe_layout``'s order). Caller holds the lock and picks the grad
    mode. Rows beyond ``rows_per_pass`` run in chunks (not when probing: the caller chunks)."""
    rows, tokens = inputs["input_ids"].shape
    step = rows_per_pass(model, tokens, False)
    if run.probe or rows <= step or run.corrupt is None or not bool(run.corrupt.any()):
        return _run_rows(model, run, inputs)
    outs, parts = [], []
    for start in range(0, rows, step):
        cut = slice(start, start + step)
        part = dataclasses.replace(
            run,  # type: ignore[type-var]
            corrupt=run.corrupt[cut],
            embeddings=None if run.embeddings is None else run.embeddings[cut],
            acts=[],
            zeros=[],
        )
        outs.append(_run_rows(model, part, {k: v[cut] for k, v in inputs.items()}))
        parts.append(part.acts)
    run.acts.extend(torch.cat(acts) for acts in zip(*parts, strict=True))
    return torch.cat(outs)


def _start(
    model: PostNormModel, run: _Run, inputs: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x_0`` of the run's rows (kept as the input node's activation) and the attention mask
    as our module folds it (None: attend everywhere)."""
    x0, mask = embedded(model, inputs)
    if mask is not None:  # the model's (padding) mask, as our module folds it
        t = x0.shape[1]
        mask = combine_masks(
            mask, None, is_causal=False, q_len=t, k_len=t, device=x0.device, dtype=x0.dtype
        )
    if run.embeddings is not None:
        x0 = run.embeddings.to(x0.dtype)
    run.acts.append(x0)
    return x0, mask


def _run_rows(model: PostNormModel, run: _Run, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``run_postnorm`` in one pass.

    The copies of every target not yet reached advance together through each layer (one
    LayerNorm over ``[B, targets above, T, D]`` per norm), so a run costs as many norm calls as
    the plain forward, on more rows. Attention runs through our module's core
    (``mhsa.engine.attention.core.attention_core``) on each head's Q, K and V projected from its own
    copies."""
    corrupted = run.corrupt is not None and bool(run.corrupt.any())
    if corrupted and not run.probe and run.corrupted is not None and COPIES_ONLY_WHERE_MIXED:
        return _run_mixed(model, run, inputs)
    x0, mask = _start(model, run, inputs)
    heads, group = model.num_heads, 3 * model.num_heads + 1
    targets = model.num_layers * group + 1
    copies = _Copies(run, heads, shared=not (run.probe or corrupted))
    x = x0[:, None]  # (B, 1, T, D): the plain stream
    if not copies.shared:
        x = copies.add(x.expand(-1, targets, -1, -1), 0, 0)  # (B, targets, T, D)
    for layer, block in enumerate(model.blocks):
        first = layer * group
        # split, not sliced: a slice's backward fills a whole tensor of zeros per slice
        inputs, rest = (x, x) if copies.shared else x.split([3 * heads, x.shape[1] - 3 * heads], 1)
        q, k, v = _heads(model, layer, inputs)
        context, _ = attention_core(q, k, v, mask, scale=block.ours.scale, need_weights=False)
        outs = torch.einsum("bhtk,hkd->bhtd", context, model.w_o[layer].to(context.dtype))
        run.acts.extend(outs.unbind(1))
        attn = outs.sum(1) + model.b_o[layer].to(outs.dtype)
        # rest: the MLP's copy and those above
        y = model.ln_attn[layer](copies.add(rest, 1 + 2 * layer, first + 3 * heads, attn))
        own, above = (y, y) if copies.shared else y.split([1, y.shape[1] - 1], 1)
        mlp = model.mlps[layer](own[:, 0])
        run.acts.append(mlp)
        x = model.ln_mlp[layer](copies.add(above, 2 + 2 * layer, first + group, mlp))
    return x[:, 0]


class _Mixed:
    """The copies of a run that corrupts edges, only where a row's target needs its own.

    Through write point w (sources ``0 .. end(w)`` in the graph's order), target v's copy in row
    b depends only on which of the edges from those sources into v the row corrupts. None of
    them: it is the row's own stream (the chain of this row's source outputs, one per row). All
    of them: it is the corrupted run's stream (every source carries its corrupted output, so the
    chain is the corrupted forward's, rebuilt here from the pair's corrupted outputs). Only a
    mixed target needs a copy of its own: it branches off one of the two at the first write
    point where its edges become mixed, and stays mixed. At MIB's smallest circuits nearly every
    target reads the corrupted stream, at the largest the row's own.

    Mixed targets of a row that read the same stream and whose edges at a write point agree
    share one copy there (their values are equal), until their edges differ.

    ``pool [P + B + 1, T, D]`` holds, at the current point, the P copies (in row order; ``where
    [B, targets]`` says which a row's mixed target reads), then each row's own stream, then the
    corrupted one."""

    def __init__(self, model: PostNormModel, run: _Run, x0: torch.Tensor) -> None:
        if run.corrupt is None or run.corrupted is None:
            raise ValueError("a run with corrupted edges and the corrupted run's outputs")
        self.run, self.heads, self.rows = run, model.num_heads, len(x0)
        self.corrupted_acts: torch.Tensor = run.corrupted  # (sources, T, D)
        corrupt = run.corrupt.detach().cpu().numpy() > 0  # (B, sources, targets)
        self.corrupt, self.counts = corrupt, corrupt.cumsum(1, dtype=np.int32)
        self.pool = torch.cat([x0, run.corrupted[:1].to(x0.dtype)])  # no copy yet
        self.where = np.full(corrupt.shape[::2], -1)  # (B, targets): a pair's row in the pool

    def _status(self, end: int, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(mixed, none)`` ``[B, n]`` for targets ``first ..`` over sources ``0 .. end``."""
        count = self.counts[:, end - 1, first : first + n]
        return (count > 0) & (count < end), count == 0

    def _index(self, rows: np.ndarray, old: np.ndarray, none: np.ndarray) -> np.ndarray:
        """Rows of the pool: a target's copy (``old`` >= 0), else its row's own stream
        (``none``), else the corrupted stream."""
        own = len(self.pool) - 1 - self.rows
        return np.where(old >= 0, old, np.where(none, own + rows, len(self.pool) - 1))

    def read(self, end: int, first: int, n: int) -> torch.Tensor:
        """``[B, n, T, D]`` (``[B, 1, T, D]`` when all read their row's own): what targets
        ``first ..`` read, all of whose sources are ``0 .. end``."""
        mixed, none = self._status(end, first, n)
        own = self.pool[len(self.pool) - 1 - self.rows : -1]
        if none.all():
            return own[:, None]
        rows = np.arange(self.rows)[:, None]
        index = self._index(rows, np.where(mixed, self.where[:, first : first + n], -1), none)
        index_t = torch.from_numpy(index.reshape(-1)).to(self.pool.device)
        return self.pool[index_t].view(self.rows, n, *own.shape[1:])

    def advance(
        self, w: int, first: int, also: torch.Tensor, also_corrupted: torch.Tensor, norm
    ) -> None:
        """Through write point ``w`` (targets ``first ..``): every stream adds ``also``
        (``[B, T, D]``; the corrupted one ``also_corrupted``), each copy its row's corrupted
        edges there too (one product per row), then all go through ``norm`` in one call."""
        sources, b = _sources_at(w, self.heads), self.rows
        mixed, _ = self._status(sources.stop, first, self.counts.shape[2] - first)
        rows, targets = np.nonzero(mixed)
        targets += first
        before = self.counts[rows, sources.start - 1, targets] == 0  # nothing corrupted yet
        index = self._index(rows, self.where[rows, targets], before)
        edges = self.corrupt[
            rows[:, None], np.arange(sources.start, sources.stop), targets[:, None]
        ]
        # targets of a row that read the same stream and whose edges here agree share a copy
        placed, (first_of, which) = (rows, targets), _distinct(rows, index, edges, len(self.pool))
        rows, index, edges = rows[first_of], index[first_of], edges[first_of]
        p = len(rows)
        out = self.pool.new_empty((p + b + 1, *self.pool.shape[1:]))
        index_t = torch.from_numpy(index).to(self.pool.device)
        torch.index_select(self.pool, 0, index_t, out=out[:p])
        torch.add(self.pool[-1 - b : -1], also, out=out[p : p + b])
        torch.add(self.pool[-1], also_corrupted, out=out[-1])
        acts = torch.stack(self.run.acts[sources], dim=1)  # (B, s, T, D)
        corrupted = self.corrupted_acts[sources].to(acts.dtype)
        diffs = torch.cat([(corrupted[None] - acts).flatten(2), also.flatten(1)[:, None]], 1)
        weights = torch.from_numpy(np.concatenate([edges, np.ones((p, 1), bool)], 1))
        weights = weights.to(out.device, out.dtype)  # (P, s + 1): this point's edges, and also
        flat, starts = out.view(len(out), -1), np.searchsorted(rows, np.arange(b + 1))
        for row in range(b):  # a row's copies add also and its corrupted edges: one product
            lo, hi = starts[row], starts[row + 1]
            if hi > lo:
                flat[lo:hi].addmm_(weights[lo:hi], diffs[row])  # (P_b, s + 1) x (s + 1, T D)
        self.pool = norm(out)
        self.where[:] = -1
        self.where[placed] = which.reshape(-1)


def _distinct(
    rows: np.ndarray, index: np.ndarray, edges: np.ndarray, streams: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(first, which)``: the first of each distinct ``(row, index, edges)`` (in row order)
    and which of them each is; one integer key per row while it fits in ``KEY_BITS``."""
    bits, top = edges.shape[1], int(rows.max()) + 1 if len(rows) else 1
    if top * streams < 2 ** (KEY_BITS - bits):
        key = (rows * streams + index) << bits | (edges @ (1 << np.arange(bits)))
        _, first, which = np.unique(key, return_index=True, return_inverse=True)
    else:
        keys = np.concatenate([rows[:, None], index[:, None], edges], 1)
        _, first, which = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    return first, which.reshape(-1)


def _run_mixed(model: PostNormModel, run: _Run, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``_run_rows`` of a run that corrupts edges and probes nothing, with copies only where a
    row's target has mixed edges (``_Mixed``): at MIB's smallest circuits nearly every target
    reads the corrupted run's stream, at the largest the row's own, and neither needs a copy."""
    x0, mask = _start(model, run, inputs)
    heads, group = model.num_heads, 3 * model.num_heads + 1
    streams = _Mixed(model, run, x0)
    corrupted = streams.corrupted_acts
    for layer, block in enumerate(model.blocks):
        first, w = layer * group, 1 + 2 * layer
        x = streams.read(_sources_at(w - 1, heads).stop, first, 3 * heads)  # (B, 3H or 1, T, D)
        q, k, v = _heads(model, layer, x)
        context, _ = attention_core(q, k, v, mask, scale=block.ours.scale, need_weights=False)
        outs = torch.einsum("bhtk,hkd->bhtd", context, model.w_o[layer].to(context.dtype))
        run.acts.extend(outs.unbind(1))
        b_o = model.b_o[layer].to(outs.dtype)
        attn = outs.sum(1) + b_o
        attn_corrupted = corrupted[_sources_at(w, heads)].to(outs.dtype).sum(0) + b_o
        streams.advance(w, first + 3 * heads, attn, attn_corrupted, model.ln_attn[layer])
        y = streams.read(_sources_at(w, heads).stop, first + 3 * heads, 1)[:, 0]
        mlp = model.mlps[layer](y)
        run.acts.append(mlp)
        mlp_corrupted = corrupted[_sources_at(w + 1, heads)][0].to(mlp.dtype)
        streams.advance(w + 1, first + group, mlp, mlp_corrupted, model.ln_mlp[layer])
    end = _sources_at(2 * model.num_layers, heads).stop
    return streams.read(end, model.num_layers * group, 1)[:, 0]


def pooled(hidden: torch.Tensor, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``[rows, D]``: the sentence embedding of each row of a last hidden state ``[rows, T, D]``
    (``mhsa.causal.metrics.sentence_embedding``: the attention-mask-weighted mean)."""
    return sentence_embedding(_Hidden(hidden), inputs).float()


def embedding_metric(
    hidden: torch.Tensor, inputs: Mapping[str, torch.Tensor], reference: torch.Tensor
) -> torch.Tensor:
    """``[rows]``: cos(sentence embedding of each row of ``hidden [rows, T, D]``, ``reference
    [D]``): patching's encoder metric (``mhsa.causal.metrics.PatchMetric``, ``PATCH_TARGETS``)."""
    return F.cosine_similarity(pooled(hidden, inputs), reference.float()[None], dim=-1)


@dataclass(frozen=True)
class _Hidden:
    """A model output holding only ``last_hidden_state`` (what ``sentence_embedding`` reads)."""

    last_hidden_state: torch.Tensor

"""Runs of a model wired as a circuit graph: every receiver input reads its own copy of the
residual stream (TransformerLens's ``use_split_qkv_input``), so that one edge can carry another
activation than the others, and a zero added to each copy gives the gradient at that input.

The graph (``mhsa.circuits.CircuitGraph``) is EAP-IG's (hannamw/EAP-IG ``src/eap/graph.py``):
sources ``input`` (the residual entering layer 0), each head's output ``z_h W_O^h`` (the output
bias in no node) and each MLP's output; targets each head's query, key and value inputs, each
MLP's input and the logits' input (the last residual, before the final norm). A pre-norm layer
reads ``ln_1(x)`` for its attention and ``ln_2(x + attn)`` for its MLP; a parallel layer
(GPT-J, GPT-NeoX with ``use_parallel_residual``, Phi, Falcon) reads ``ln_m(x)``, of the layer's
input, for its MLP (EAP-IG's ``parallel_attn_mlp``: the MLP reads no head of its own layer;
``mhsa.circuits.layers`` finds each layer's norms).
Here each head's q, k and v input is ``ln_1`` of its own copy of ``x``, projected with that
head's slice of W_Q, W_K, W_V, and put in place of our module's per-head Q, K, V
(``mhsa.engine.attention.core``
observation points "per-head Q", "per-head K", "per-head V"; grouped-query attention runs
ungrouped, each query head with its own copy of its key/value head's weights, as
TransformerLens's ``ungroup_grouped_query_attention``).

A run may corrupt edges (``evaluate_graph``'s input construction in ``src/eap/evaluate.py``):
target v's input is ``x_v + sum over the corrupted edges (u, v) of (a_u(corrupted) - a_u(this
run))``, so such an edge carries the source's activation from the corrupted text while every
other edge carries this run's. Each row of a batch has its own set of corrupted edges.

Post-norm encoders (the BERT family) have no such sum: their targets read their own copies of
the chain of norms instead (``mhsa.circuits.postnorm``, our definition); ``circuit_model`` picks
the wiring and ``run_circuit`` / ``run_pair`` run either.

A clean and a corrupted text run once, side by side, is ``mhsa.circuits.pairs``'s
(``CircuitPair``, ``run_pair``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mhsa.circuits.graph import CircuitGraph, graph_of
from mhsa.circuits.layers import is_parallel, layer_norms, per_head, ungrouped
from mhsa.circuits.postnorm import (
    PostNormModel,
    is_post_norm_encoder,
    postnorm_model,
    run_postnorm,
)
from mhsa.engine.families.layout import final_norm_of, mlp_of
from mhsa.engine.models.loading import LoadedModel, last_logits_only
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks, run_with_our_blocks
from mhsa.engine.stream.hooks import Hook, after, before, hooked
from mhsa.errors import UnsupportedModelError

__all__ = [
    "TOOLS_NEEDING_PRE_NORM",
    "CircuitModel",
    "CircuitRun",
    "Tap",
    "circuit_model",
    "run_circuit",
]

TOOLS_NEEDING_PRE_NORM = (
    "Circuits (edge attribution, faithfulness, path patching) run on causal language models with "
    "pre-norm layers (GPT-2, the Llama family: Llama, Qwen2, Qwen3, Mistral, Gemma, Phi-3; the "
    "parallel-block GPT-J, GPT-NeoX/Pythia, Phi and Falcon; toy models such as toy:induction), "
    "scored by logit(answer) - logit(wrong), and on BERT-family encoders (BERT, RoBERTa, "
    "ELECTRA, MiniLM), scored by the embedding targets; direct logit attribution and "
    "information flow need the causal pre-norm ones. Patching, head importance and every "
    "attention view run on it."
)


def _unsupported(lm: LoadedModel, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"{lm.display_name}: {why}. {TOOLS_NEEDING_PRE_NORM}")


@dataclass(frozen=True, eq=False)
class CircuitModel:
    """A pre-norm causal LM's parts that a circuit run touches (from ``circuit_model``).

    Attributes:
        lm: the model.
        blocks: our module in every attention block (grouped-query attention ungrouped).
        layers, ln1, ln2: per layer, the whole layer and its two norms.
        final_norm: the norm before the unembedding.
        w_qkv: per layer, ``(W_Q, W_K, W_V)`` per head ``[H, Dh, D]`` and their biases
            ``[H, 1, Dh]`` (or None).
        w_o: per layer, each head's slice of W_O ``[H, Dh, D]``.
        running: the pass of ``blocks`` already standing in the model (a training run's):
            runs put their observers into it instead of swapping blocks in.
        parallel: the layers feed attention and MLP the same input (GPT-J, GPT-NeoX with
            ``use_parallel_residual``, Phi, Falcon): ``ln2`` is then the norm the MLP reads of
            the layer's input, and a head feeds only the MLPs of the layers above it.
    """

    lm: LoadedModel
    blocks: list[OurBlock]
    layers: list[nn.Module]
    ln1: list[nn.Module]
    ln2: list[nn.Module]
    final_norm: nn.Module
    w_qkv: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]]
    w_o: list[torch.Tensor]
    running: OurPass | None = None
    parallel: bool = False

    @property
    def graph(self) -> CircuitGraph:
        """The model's circuit graph."""
        return graph_of(len(self.blocks), self.num_heads, self.parallel)

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def num_heads(self) -> int:
        return self.blocks[0].ours.num_heads


def _check(lm: LoadedModel) -> None:
    if lm.is_encoder_decoder:
        raise _unsupported(lm, "an encoder-decoder (its decoder also reads the encoder's output)")
    if lm.lm_head != "causal" or lm.head_model is None:
        raise _unsupported(lm, "no next-token (causal language-model) head")


def circuit_model(
    lm: LoadedModel, blocks: list[OurBlock] | None = None, running: OurPass | None = None
) -> CircuitModel | PostNormModel:
    """``lm``'s parts for circuit runs, built once and kept in ``lm.cache``; caller holds
    ``lm.lock``. With ``blocks`` (a training run's, standing in the model with the pass
    ``running``): built from them afresh (their weights move), and run in place. A BERT-family
    encoder gets the post-norm wiring (``mhsa.circuits.postnorm``).

    Raises:
        UnsupportedModelError: a model our module cannot run (the swap's message), an
            encoder-decoder, a decoder without a next-token head, an encoder outside the BERT
            family, norms after a decoder's attention or MLP (Gemma 2, OLMo 2), or a decoder
            layout without the norms and MLP found by name; the message says which tools need
            what.
    """
    key = "circuit-model"
    if blocks is None and key in lm.cache:
        return lm.cache[key]
    if blocks is None and not lm.is_encoder_decoder and lm.lm_head != "causal":
        plain = _our_blocks(lm)
        if is_post_norm_encoder(lm, plain):
            encoder = postnorm_model(lm, plain, lambda why: _unsupported(lm, why))
            lm.cache[key] = encoder
            return encoder
    _check(lm)
    if blocks is None:
        blocks = _our_blocks(lm)
    if not blocks[0].causal:
        raise _unsupported(lm, "an encoder a training run stands in")
    if running is not None and blocks[0].ours.groups > 1:
        raise _unsupported(lm, "grouped-query attention in a run that is already going")
    model = _wired(lm, blocks, running)
    if running is None:
        lm.cache[key] = model
    return model


def _our_blocks(lm: LoadedModel) -> list[OurBlock]:
    try:
        return our_blocks(lm)
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"Circuits run through our module: {e}") from e


def _wired(lm: LoadedModel, plain: list[OurBlock], running: OurPass | None) -> CircuitModel:
    layers, ln1, ln2, blocks, w_qkv, w_o = [], [], [], [], [], []
    parallel = {is_parallel(block) for block in plain}
    if len(parallel) > 1:
        raise _unsupported(lm, "parallel and sequential layers in one model")
    with torch.inference_mode(False), torch.no_grad():
        for block in plain:
            outer, name = block.layer_place
            layer = getattr(outer, name)
            norms = layer_norms(layer, is_parallel(block), lambda why: _unsupported(lm, why))
            ours = ungrouped(block.ours)
            (q, k, v, o), (bq, bk, bv, _) = ours.projections()
            h = ours.num_heads
            biases = tuple(None if b is None else b.reshape(h, 1, -1) for b in (bq, bk, bv))
            w_qkv.append((tuple(per_head(w, h) for w in (q, k, v)), biases))
            w_o.append(per_head(o.T.contiguous(), h))  # (H, Dh, D)
            layers.append(layer)
            ln1.append(norms[0])
            ln2.append(norms[1])
            blocks.append(block if ours is block.ours else block.with_module(ours))
    final = final_norm_of(lm)
    wired = (layers, ln1, ln2, final, w_qkv, w_o)
    return CircuitModel(lm, blocks, *wired, running, parallel=parallel.pop())


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (x, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": x}


@dataclass
class Tap:
    """Where a tapped run (``CircuitRun(tap=True)``) finds the gradients of ``count`` targets
    from column ``start`` on.

    An MLP's or the logits' input: ``tensors`` holds one view of the tensor its norm reads, that
    nothing else reads (so its gradient is the target's: dm/d of a zero added there). A layer's
    3H head inputs (q of every head, then k, then v): ``tensors`` holds our module's per-head
    Q, K and V, ``[B, H, T, Dh]``; the target's gradient is that of the norm ``norm`` at the
    layer's input ``x`` with the cotangent ``dm/dQ_h W_Q^h`` (likewise K, V; ``weights`` the
    per-head ``(W_Q, W_K, W_V)``, ``[H, Dh, D]`` each).
    """

    start: int
    count: int
    tensors: list[torch.Tensor]
    x: torch.Tensor | None = None
    norm: nn.Module | None = None
    weights: tuple[torch.Tensor, ...] = ()


@dataclass
class CircuitRun:
    """One forward pass (B rows) of a ``CircuitModel``, and what it leaves.

    Args (fields set by the caller):
        corrupt: ``[B, sources, targets]``: 1 where the row's edge carries the corrupted
            activation (None: no edge does).
        corrupted: ``[sources, T, D]`` every source's activation on the corrupted text.
        probe: add a zero to every target input and keep it, for gradients.
        embeddings: ``[B, T, D]`` put in place of the residual entering layer 0 (IG steps).
        upstream: per target, how many sources feed it (the graph's prefix lengths).
        tap: instead of the probe's copies, keep the tensors whose gradients give dm/d(each
            target input) (``Tap``; ``mhsa.circuits.taps``): pre-norm models only.

    Filled by the pass: ``acts`` (each source's activation ``[B, T, D]``, in the graph's order;
    a tapped run keeps none but the input), ``zeros`` (the added zeros, ``[B, n, T, D]`` per
    group of targets, in order) and ``taps``.
    """

    upstream: Sequence[int]
    corrupt: torch.Tensor | None = None
    corrupted: torch.Tensor | None = None
    probe: bool = False
    embeddings: torch.Tensor | None = None
    tap: bool = False
    acts: list[torch.Tensor] = field(default_factory=list)
    zeros: list[torch.Tensor] = field(default_factory=list)
    taps: list[Tap] = field(default_factory=list)
    _x: dict[int, torch.Tensor] = field(default_factory=dict)
    _y: torch.Tensor | None = None
    _next: int = 0

    def tapped(self, count: int, tensor: torch.Tensor, **head_parts: Any) -> torch.Tensor:
        """Keep ``tensor`` as the tap of the next ``count`` targets (see ``Tap``)."""
        self.taps.append(Tap(self._next, count, [tensor], **head_parts))
        self._next += count
        return tensor

    def extra(self, count: int, like: torch.Tensor) -> torch.Tensor | None:
        """What the next ``count`` targets' inputs get added (``[B, count, T, D]``): the
        corrupted edges' differences, and the probe's zero; None when nothing."""
        cols = slice(self._next, self._next + count)
        p = self.upstream[self._next]
        self._next += count
        added: torch.Tensor | None = None
        if self.corrupt is not None and self.corrupted is not None:
            mask = self.corrupt[:, :p, cols].to(like.dtype)
            if bool(mask.any()):
                diffs = self.corrupted[None, :p] - torch.stack(self.acts[:p], dim=1)  # (B,p,T,D)
                added = torch.einsum("bptd,bpn->bntd", diffs, mask)
        if self.probe:
            b, t, d = like.shape
            zero = torch.zeros(b, count, t, d, dtype=like.dtype, device=like.device)
            zero.requires_grad_(True)
            self.zeros.append(zero)
            added = zero if added is None else added + zero
        return added


def _layer_pre_hook(run: CircuitRun, layer: int) -> Callable[..., Any]:
    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        x = _hidden(args, kwargs)
        changed = None
        if layer == 0:
            if run.embeddings is not None:
                x = run.embeddings.to(x.dtype)
                changed = _with_hidden(args, kwargs, x)
            if run.tap and not x.requires_grad:  # the gradients start here (a copy: the
                x = x.detach().clone().requires_grad_(True)  # IG steps may be inference tensors)
                changed = _with_hidden(args, kwargs, x)
            run.acts.append(x)  # the input node
        run._x[layer] = x
        return changed

    return hook


def _observer(model: CircuitModel, run: CircuitRun, layer: int) -> Callable[..., Any]:
    (w_q, w_k, w_v), (b_q, b_k, b_v) = model.w_qkv[layer]
    heads = model.num_heads
    ln1, w_o = model.ln1[layer], model.w_o[layer]

    def project(part: int, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor | None:
        if run._y is None:
            return None
        y = run._y[:, part * heads : (part + 1) * heads]  # (B, H, T, D)
        out = torch.einsum("bhtd,hkd->bhtk", y, w.to(y.dtype))  # (B, H, T, Dh)
        return out if b is None else out + b.to(out.dtype)

    def observe(name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        if run.tap and name == "per-head Q":
            run.tapped(3 * heads, tensor, x=run._x[layer], norm=ln1, weights=(w_q, w_k, w_v))
            return None
        if run.tap and name in ("per-head K", "per-head V"):
            run.taps[-1].tensors.append(tensor)
            return None
        if name == "per-head Q":
            x = run._x[layer]
            extra = run.extra(3 * heads, x)  # q of every head, then k, then v
            run._y = None if extra is None else ln1(x[:, None] + extra)  # (B, 3H, T, D)
            return project(0, w_q, b_q)
        if name == "per-head K":
            return project(1, w_k, b_k)
        if name == "per-head V":
            return project(2, w_v, b_v)
        if name == "per-head context" and not run.tap:  # a tapped run needs no sources
            outs = torch.einsum("bhtk,hkd->bhtd", tensor, w_o.to(tensor.dtype))
            run.acts.extend(outs.unbind(1))
        return None

    return observe


def _ln2_pre_hook(run: CircuitRun) -> Callable[..., Any]:
    def hook(_module: nn.Module, args: tuple) -> tuple | None:
        if run.tap:  # a view that only this norm reads: its gradient is the target's
            return (run.tapped(1, args[0].view_as(args[0])), *args[1:])
        extra = run.extra(1, args[0])
        return None if extra is None else (args[0] + extra[:, 0], *args[1:])

    return hook


def _parallel_mlp_pre_hook(run: CircuitRun, layer: int, norm: nn.Module) -> Callable[..., Any]:
    """A parallel layer's MLP input: ``norm`` of the layer's input plus the corrupted edges'
    differences (and the probe's zero), recomputed from the layer's input ``x`` that the layer
    pre-hook kept, as EAP-IG's ``parallel_attn_mlp`` graphs wire it (the MLP reads ``x``, not
    the residual after attention)."""

    def hook(_module: nn.Module, args: tuple) -> tuple | None:
        x = run._x[layer]
        if run.tap:
            return (norm(run.tapped(1, x.view_as(x))), *args[1:])
        extra = run.extra(1, x)
        return None if extra is None else (norm(x + extra[:, 0]), *args[1:])

    return hook


def _mlp_hook(run: CircuitRun, copy: bool) -> Callable[..., None]:
    """Keeps the MLP's output (a copy where the layer adds to it in place: Falcon's
    ``mlp_output += attention_output``)."""

    def hook(_module: nn.Module, _args: tuple, output: Any) -> None:
        if run.tap:  # a tapped run needs no sources
            return
        out = output[0] if isinstance(output, tuple) else output
        run.acts.append(out.clone() if copy else out)

    return hook


def run_circuit(
    model: CircuitModel | PostNormModel, run: CircuitRun, inputs: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """``inputs`` through ``model`` wired as ``run`` asks; returns the logits ``[B, T, V]``
    (``[B, 1, V]``, the last position's, where the head takes ``logits_to_keep``; an encoder:
    the logits node's last hidden state ``[B, T, D]``, ``run_postnorm``) and fills ``run``.
    Caller holds the lock (and picks the grad mode)."""
    if isinstance(model, PostNormModel):
        return run_postnorm(model, run, inputs)
    hooks: list[Hook] = []
    for i, layer in enumerate(model.layers):
        mlp = mlp_of(layer)
        hooks.append(before(layer, _layer_pre_hook(run, i), kwargs=True))
        if model.parallel:
            hooks.append(before(mlp, _parallel_mlp_pre_hook(run, i, model.ln2[i])))
        else:
            hooks.append(before(model.ln2[i], _ln2_pre_hook(run)))
        hooks.append(after(mlp, _mlp_hook(run, model.parallel)))
    hooks.append(before(model.final_norm, _ln2_pre_hook(run)))
    observers = {b.layer: _observer(model, run, i) for i, b in enumerate(model.blocks)}
    with hooked(hooks):
        if model.running is None:  # the metric reads the last position's logits only
            our_pass = OurPass(need_weights=False, observers=observers)
            out = run_with_our_blocks(
                model.lm, model.blocks, our_pass, inputs, with_head=True, last_logits=True
            )
        else:  # our blocks already stand in the model: observe through their pass
            kept = model.running.observers
            model.running.observers = observers
            try:
                device = model.lm.device
                last = last_logits_only(model.lm.head_model)
                out = model.lm.head_model(**{k: v.to(device) for k, v in inputs.items()}, **last)
            finally:
                model.running.observers = kept
    return out.logits

"""Run a transformers model through our module: each supported attention block is swapped, for one
forward pass, for an ``OurBlock`` around ``MultiHeadSelfAttention`` loaded with that block's
weights (``mhsa.engine.families.registry`` says how, per family).

Words used here: "ours" / "our module" is the project's ``MultiHeadSelfAttention``; "the model's
block" (``OurBlock.original``) is the model's eager attention block that ours stands in for.

Every layer's attention output then comes from our module and feeds the next layer; the model's
embeddings, feed-forward layers and norms stay the model's. The swap happens under the model's
lock in a context manager that always puts the model's blocks back, also when the forward raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention, Observer
from mhsa.engine.families.record import Family
from mhsa.engine.models.loading import LoadedModel, last_logits_only
from mhsa.engine.runs.block_search import (
    block_kinds,
    check_model,
    find_blocks,
    in_call_order,
    layer_counts,
    unsupported,
)
from mhsa.engine.stream.hooks import Hook, after, before, hooked
from mhsa.errors import UnsupportedModelError

__all__ = [
    "BLOCK_KINDS",
    "OurBlock",
    "OurPass",
    "forward_through_ours",
    "our_blocks",
    "our_blocks_of",
    "run_with_our_blocks",
    "store_our_weights",
    "through_our_module",
    "tile_rows",
    "trainable_our_blocks",
]


@dataclass
class OurPass:
    """What one forward pass through our modules asks of them, and what they leave.

    Attributes:
        gates: per layer (``OurBlock.layer``: for encoder-decoders the encoder's blocks, then
            the decoder's self-attention, then its cross-attention), head gates ``[H]`` or
            ``[B, H]`` (layers not listed: all heads on).
        need_weights: compute per-head weights (else the fused kernel runs).
        weights_out: optional preallocated ``[layers, B, H, T, T]`` buffer that receives each
            layer's weights.
        observers: per layer, an observer of our module's intermediates.
        weights: per layer, the weights our module returned (filled during the pass).
        fan_out: ``(layer, rows)``: the hidden states entering that layer (batch B) are repeated
            into ``rows`` copies, which the layers from there on carry side by side (with
            ``gates`` of shape ``[rows * B, H]``: one knock-out per copy; row r * B + b is
            sentence b of copy r).
        replay: per layer, an output of that whole layer recorded earlier (``record``) for the
            same input, returned without computing the layer (the layers below a knock-out).
        record: when a dict, receives every layer's output.
        sinks: per layer, a callable that receives the layer's weights ``[B, H, T, S]`` as
            soon as they are computed (those layers compute weights, the others run the fused
            kernel unless ``need_weights``); its weights are then not kept in ``weights``
            (long inputs: ``mhsa.engine.runs.partial`` keeps the selected heads of the selected
            layers
            only).
        buffers: per layer, a preallocated ``[B, H, T, S]`` tensor the weights are computed
            into (beside ``weights_out``, for a few layers).
        head_chunks: per layer, ``(chunks, take)``: the layer's output comes from the fused
            kernel, and its weights a chunk of query heads at a time
            (``MultiHeadSelfAttention.head_weights``), each handed to ``take(chunk,
            weights)``: one layer's weights of every head never exist at once.
    """

    gates: Mapping[int, torch.Tensor] = field(default_factory=dict)
    need_weights: bool = True
    weights_out: torch.Tensor | None = None
    observers: Mapping[int, Observer] = field(default_factory=dict)
    weights: dict[int, torch.Tensor | None] = field(default_factory=dict)
    fan_out: tuple[int, int] | None = None
    replay: Mapping[int, Any] = field(default_factory=dict)
    record: dict[int, Any] | None = None
    sinks: Mapping[int, Callable[[torch.Tensor], None]] = field(default_factory=dict)
    head_chunks: Mapping[int, tuple[list[list[int]], Callable[..., None]]] = field(
        default_factory=dict
    )
    buffers: Mapping[int, torch.Tensor] = field(default_factory=dict)

    def buffer_for(self, layer: int) -> torch.Tensor | None:
        """The preallocated weights buffer of ``layer``, if any."""
        if self.weights_out is not None:
            return self.weights_out[layer]
        return self.buffers.get(layer)


class _Replay(nn.Module):
    """Stands in for a whole layer: returns what the layer returned earlier for this input.
    Other attributes are the layer's (a model's loop may read them: ModernBERT's
    ``attention_type``)."""

    def __init__(self, output: Any, layer: nn.Module) -> None:
        super().__init__()
        self._output = (output,)  # a tuple: tensors inside are not registered as buffers
        self._layer = (layer,)  # likewise: not a submodule

    def forward(self, *_args: Any, **_kwargs: Any) -> Any:
        return self._output[0]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            layer = self.__dict__.get("_layer")
            if layer is None:
                raise
            return getattr(layer[0], name)


def _repeat_hidden(rows: int) -> Callable[..., Any]:
    """Forward pre-hook: the layer's hidden states (batch B) repeated into ``rows`` copies."""

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (args[0].repeat(rows, *[1] * (args[0].dim() - 1)), *args[1:]), kwargs
        hidden = kwargs["hidden_states"]
        return args, {**kwargs, "hidden_states": hidden.repeat(rows, *[1] * (hidden.dim() - 1))}

    return hook


def tile_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` (batch B on its first axis) repeated to ``rows`` rows as a fan-out lays them out:
    row r * B + b is sentence b (``Tensor.repeat``); as it is when the batch already has
    ``rows`` rows or is one row that broadcasts."""
    if x.shape[0] in (1, rows):
        return x
    return x.repeat(rows // x.shape[0], *[1] * (x.dim() - 1))


def _rows_like(x: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """A per-sentence tensor our block receives (mask, positions) laid out for ``rows`` rows
    after a fan-out; absent and 1-D ones (positions without a batch axis) as they are."""
    return x if x is None or x.dim() < 2 else tile_rows(x, rows)


def _recorder(record: dict[int, Any], layer: int) -> Callable[..., None]:
    def hook(_module: nn.Module, _args: Any, output: Any) -> None:
        record[layer] = output

    return hook


#: the kinds of attention block, in the order an encoder-decoder model's blocks are numbered:
#: "self" (encoder-only and decoder-only models), "encoder" (an encoder-decoder's encoder
#: self-attention), "decoder" (its decoder's causal self-attention), "cross" (queries from the
#: decoder, keys and values from the encoder's output)
BLOCK_KINDS = ("self", "encoder", "decoder", "cross")


class OurBlock(nn.Module):
    """Stands in for one of the model's attention blocks: our module, then the family's finish.

    Takes the arguments the model's layer gives its attention block (hidden states, the model's
    attention mask, position ids; the encoder's output as ``key_value_states`` for
    cross-attention; T5's ``mask`` and ``position_bias``) and returns what the block would
    (``(output, weights)``, or the family's ``returns``).

    Attributes:
        layer: the block's number among all the model's blocks (the key of ``OurPass``'s
            per-layer maps): the layer itself for encoders and decoders; for encoder-decoders
            the encoder's blocks, then the decoder's self-attention, then its cross-attention.
        kind: one of ``BLOCK_KINDS``.
        index: the layer the block sits in, counted within its kind.
    """

    def __init__(
        self,
        family: Family,
        original: nn.Module,
        ours: MultiHeadSelfAttention,
        *,
        layer: int,
        place: tuple[nn.Module, str],
        layer_place: tuple[nn.Module, str],
        kind: str = "self",
        index: int | None = None,
    ) -> None:
        super().__init__()
        self.ours = ours
        self.family = family
        self.layer = layer
        self.kind = kind
        self.index = layer if index is None else index
        self.causal = family.causal(original) and kind != "cross"
        # plain tuples: not registered as submodules (no second copy in .modules() / .to())
        self._original = (original,)
        self.place = place  # where the model's block sits: (parent, attribute)
        self.layer_place = layer_place  # where the whole layer (the block's parent) sits
        self.our_pass: OurPass | None = None

    @property
    def original(self) -> nn.Module:
        """The model's eager attention block that ours stands in for."""
        return self._original[0]

    def with_module(self, ours: MultiHeadSelfAttention) -> OurBlock:
        """The same block standing in at the same place, with another module of ours."""
        return OurBlock(
            self.family,
            self.original,
            ours,
            layer=self.layer,
            place=self.place,
            layer_place=self.layer_place,
            kind=self.kind,
            index=self.index,
        )

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: Any = None, *_args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor | None, ...]:
        our_pass = self.our_pass
        if our_pass is None:
            raise RuntimeError("OurBlock runs only inside through_our_module(...)")
        _no_cached_tokens(kwargs.get("past_key_values", kwargs.get("layer_past")))
        rows = hidden_states.shape[0]
        memory = _rows_like(self._memory(kwargs), rows)
        if not isinstance(attention_mask, torch.Tensor):
            attention_mask = kwargs.get("mask")  # T5 calls it mask
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None
        mask = _rows_like(mask, rows)
        bias = self._score_bias(kwargs.get("position_bias"), hidden_states, memory)
        buffer = our_pass.buffer_for(self.layer)
        sink = our_pass.sinks.get(self.layer)
        chunked = our_pass.head_chunks.get(self.layer)
        out, weights = self.ours(
            hidden_states,
            mask=_added(mask, bias),  # the model's mask: padding, causal, sliding window
            is_causal=self.causal and mask is None,
            positions=_rows_like(kwargs.get("position_ids"), rows),
            head_gates=our_pass.gates.get(self.layer),
            need_weights=our_pass.need_weights or buffer is not None or sink is not None,
            observe=our_pass.observers.get(self.layer),
            weights_out=buffer,
            memory=memory,
        )
        if chunked is not None:  # the output above came from the fused kernel
            self.ours.head_weights(
                hidden_states,
                *chunked,
                mask=_added(mask, bias),
                is_causal=self.causal and mask is None,
                positions=_rows_like(kwargs.get("position_ids"), rows),
            )
        if sink is not None and weights is not None:
            sink(weights)
        else:
            our_pass.weights[self.layer] = weights
        if self.family.finish is not None:
            out = self.family.finish(self.original, out, hidden_states)
        if self.family.returns is not None:
            return self.family.returns(out, weights, bias)
        return out, weights

    def _memory(self, kwargs: dict[str, Any]) -> torch.Tensor | None:
        """The encoder's output a cross-attention block attends to (``key_value_states``).

        Raises:
            UnsupportedModelError: a block given ``encoder_hidden_states`` (cross-attention
                inside a self-attention layout, as BERT or GPT-2 decoders have).
            RuntimeError: a cross-attention block called without the encoder's output, or a
                self-attention block with it.
        """
        if kwargs.get("encoder_hidden_states") is not None:
            raise UnsupportedModelError(
                "Our module stands in for the cross-attention of encoder-decoder models "
                "(BART, T5 families), not for cross-attention added to encoders or decoders."
            )
        memory = kwargs.get("key_value_states")
        if (memory is not None) != (self.kind == "cross"):
            raise RuntimeError(
                f"the {self.kind} attention block of layer {self.index} was called "
                f"{'with' if memory is not None else 'without'} the encoder's output"
            )
        return memory

    def _score_bias(
        self, given: Any, hidden: torch.Tensor, memory: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The family's bias on the scores (T5's relative position bias), else None."""
        if self.family.score_bias is None:
            return None
        given = given if isinstance(given, torch.Tensor) else None
        keys = hidden if memory is None else memory
        return self.family.score_bias(self.original, given, hidden.shape[1], keys.shape[1])


def _added(mask: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor | None:
    """The model's mask with a score bias added (both float masks); either alone as it is."""
    if bias is None:
        return mask
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return bias.masked_fill(~mask, float("-inf"))
    return bias + mask


def _no_cached_tokens(cache: Any) -> None:
    """Our blocks run whole sequences: a cache already holding earlier tokens would be ignored.

    Raises:
        UnsupportedModelError: the cache holds tokens (step-by-step generation).
    """
    seen = getattr(cache, "get_seq_length", None)
    if seen is not None and int(seen()) > 0:
        raise UnsupportedModelError(
            "Our module runs whole sequences, not a cache of earlier tokens: run the model "
            "with use_cache=False, or over the whole text at once."
        )


def _build_blocks(lm: LoadedModel, only: frozenset[int] | None = None) -> list[OurBlock]:
    """Our block for every attention block (``only``: for those layers, ``OurBlock.layer``)."""
    check_model(lm)
    try:
        found = in_call_order(lm.model, find_blocks(lm.model))
    except ValueError as e:
        raise unsupported(lm, str(e)) from e
    if not found:
        raise unsupported(lm, "no attention block of a supported layout")
    kinds = block_kinds(lm, found)
    for kind, want in layer_counts(lm).items():
        have = kinds.count(kind)
        if want is not None and have != want:
            what = "layers" if kind == "self" else f"{kind} attention layers"
            raise unsupported(lm, f"{have} of its {want} {what} have a supported block")
    # encoder-decoders: the encoder's blocks, then the decoder's self-, then its cross-attention
    order = sorted(range(len(found)), key=lambda i: (BLOCK_KINDS.index(kinds[i]), i))
    places = {id(child): (m, a) for m in lm.model.modules() for a, child in m.named_children()}
    blocks: list[OurBlock] = []
    loaded: dict[int, MultiHeadSelfAttention] = {}  # a block called in several layers: one module
    for number, i in enumerate(order):
        family, block, parent, attr = found[i]
        if only is not None and number not in only:
            continue
        if any(p.device.type == "meta" for p in block.parameters()):
            raise unsupported(
                lm,
                f"layer {number}'s attention weights were offloaded by device_map (they sit on "
                "the meta device until accelerate moves them in): our module needs them in "
                "memory. Give device_map room for that layer on a device (max_memory), or use "
                "the transformers engine without selecting it",
            )
        try:
            # gradients flow through our modules (to head gates), never into their weights
            if id(block) not in loaded:
                loaded[id(block)] = family.load(block, lm.model).eval().requires_grad_(False)
            ours = loaded[id(block)]
        except ValueError as e:
            raise unsupported(lm, str(e)) from e
        blocks.append(
            OurBlock(
                family,
                block,
                ours,
                layer=number,
                place=(parent, attr),
                layer_place=places[id(parent)],
                kind=kinds[i],
                index=sum(kinds[j] == kinds[i] for j in order[:number]),
            )
        )
    return blocks


def our_blocks(lm: LoadedModel, seed: int | None = None) -> list[OurBlock]:
    """Our module for every attention block of ``lm``: with the block's weights (``seed=None``)
    or fresh xavier weights drawn from ``seed`` (the same shapes, heads and rotary positions).

    Built once per model and seed and kept in ``lm.cache`` (bounded); callers hold ``lm.lock``.

    Raises:
        UnsupportedModelError: naming the supported families.
    """
    key = ("our-blocks", seed)
    if key not in lm.cache:
        # ordinary tensors even when called under inference_mode: gradients (head importance,
        # training) must be able to flow through these modules later
        with torch.inference_mode(False), torch.no_grad():
            lm.cache[key] = _build_our_blocks(lm, seed)
    return lm.cache[key]


def our_blocks_of(lm: LoadedModel, layers: frozenset[int]) -> list[OurBlock]:
    """Our module (the model's weights) for the attention blocks of ``layers`` alone: the
    blocks ``our_blocks`` keeps when it has built them, else built for these layers only (not
    kept: a large model's long input needs a copy of a few layers' weights, not of all).
    Callers hold ``lm.lock``.

    Raises:
        UnsupportedModelError: naming the supported families.
    """
    kept = lm.cache.get(("our-blocks", None))
    if kept is not None:
        return [b for b in kept if b.layer in layers]
    with torch.inference_mode(False), torch.no_grad():
        return _build_blocks(lm, layers)


def trainable_our_blocks(lm: LoadedModel) -> list[OurBlock]:
    """Our module for every attention block of ``lm``, with the block's weights, in training mode
    and with gradients on its weights: for training through our module. Built afresh on every
    call (never cached: the weights move away from the model's); ``store_our_weights`` writes them
    back into the model's own blocks.

    Raises:
        UnsupportedModelError: naming the supported families.
    """
    with torch.inference_mode(False), torch.no_grad():
        blocks = _build_blocks(lm)
    for block in blocks:
        block.ours.train().requires_grad_(True)
    return blocks


@torch.no_grad()
def store_our_weights(blocks: list[OurBlock]) -> None:
    """Write each of our modules' weights into the model's own attention block it stands in for
    (its family's ``store``: the inverse of the weight mapping it was loaded with)."""
    for block in blocks:
        if block.family.store is None:
            raise UnsupportedModelError(
                f"{block.family.name}: writing weights back is not supported"
            )
        block.family.store(block.ours, block.original)


def _build_our_blocks(lm: LoadedModel, seed: int | None) -> list[OurBlock]:
    if seed is None:
        return _build_blocks(lm)
    trained = our_blocks(lm, None)
    seeds = [k for k in lm.cache if k[0] == "our-blocks" and k[1] is not None]
    if len(seeds) >= _MAX_SEEDS_CACHED:
        del lm.cache[seeds[0]]  # oldest random seed first: the cache stays bounded
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh: dict[int, MultiHeadSelfAttention] = {}  # layers sharing a module keep sharing it
        for b in trained:
            if id(b.ours) not in fresh:
                fresh[id(b.ours)] = b.ours.fresh_copy().eval().requires_grad_(False)
    return [b.with_module(fresh[id(b.ours)]) for b in trained]


_MAX_SEEDS_CACHED = 4


@contextmanager
def through_our_module(
    lm: LoadedModel, blocks: list[OurBlock], our_pass: OurPass
) -> Iterator[OurPass]:
    """Within the block, ``lm.model``'s attention blocks are ``blocks`` (ours), doing
    ``our_pass``.

    The caller holds ``lm.lock`` (the model is shared). The model's blocks are always put back.
    """
    swapped: list[OurBlock] = []
    replaced: list[tuple[nn.Module, str, nn.Module]] = []
    hooks: list[Hook] = []
    calls: dict[int, list[OurBlock]] = {}  # the model's block -> ours, in the order it is called
    for block in blocks:
        calls.setdefault(id(block.original), []).append(block)
    try:
        for block in blocks:
            turns = calls[id(block.original)]
            if len(turns) > 1:  # one block of the model called in several layers (ALBERT)
                if block is turns[0]:
                    swapped.extend(turns)
                    replaced.append(_take_turns(turns, our_pass))
                continue
            parent, attr = block.place
            block.our_pass = our_pass
            setattr(parent, attr, block)
            swapped.append(block)
            layer = parent  # the whole layer around the attention block
            if our_pass.record is not None:
                hooks.append(after(layer, _recorder(our_pass.record, block.layer)))
            if our_pass.fan_out is not None and our_pass.fan_out[0] == block.layer:
                hook = _repeat_hidden(our_pass.fan_out[1])
                hooks.append(before(layer, hook, kwargs=True))
            if block.layer in our_pass.replay:
                outer, name = block.layer_place
                replaced.append((outer, name, layer))
                setattr(outer, name, _Replay(our_pass.replay[block.layer], layer))
        with hooked(hooks):
            yield our_pass
    finally:
        for outer, name, layer in replaced:
            setattr(outer, name, layer)
        for block in swapped:
            parent, attr = block.place
            setattr(parent, attr, block.original)
            block.our_pass = None


class _InTurn(nn.Module):
    """Stands in for a layer the model calls several times (ALBERT's shared layers): its k-th
    call is layer ``turns[k]``, with that block of ours in the attention block's place, and
    does what ``OurPass`` asks of that layer (replay, fan-out, record)."""

    def __init__(self, layer: nn.Module, turns: list[OurBlock], our_pass: OurPass) -> None:
        super().__init__()
        self._parts = (layer, turns, our_pass)  # a tuple: not registered as submodules
        self.calls = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        layer, turns, our_pass = self._parts
        block = turns[self.calls % len(turns)]
        self.calls += 1
        if block.layer in our_pass.replay:
            return our_pass.replay[block.layer]
        if our_pass.fan_out is not None and our_pass.fan_out[0] == block.layer:
            args, kwargs = _repeat_hidden(our_pass.fan_out[1])(layer, args, kwargs)
        parent, attr = block.place
        setattr(parent, attr, block)
        out = layer(*args, **kwargs)
        if our_pass.record is not None:
            our_pass.record[block.layer] = out
        return out


def _take_turns(turns: list[OurBlock], our_pass: OurPass) -> tuple[nn.Module, str, nn.Module]:
    """Put an ``_InTurn`` in the place of the layer ``turns`` share; ``(outer, name, layer)``
    to put the layer back."""
    for block in turns:
        block.our_pass = our_pass
    outer, name = turns[0].layer_place
    layer = getattr(outer, name)
    setattr(outer, name, _InTurn(layer, turns, our_pass))
    return outer, name, layer


def run_with_our_blocks(
    lm: LoadedModel,
    blocks: list[OurBlock],
    our_pass: OurPass,
    inputs: Mapping[str, torch.Tensor],
    *,
    with_head: bool = False,
    last_logits: bool = False,
) -> Any:
    """``lm.model(**inputs)`` with ``blocks`` standing in for its attention blocks, doing
    ``our_pass``; returns the model's outputs (``with_head``: the language-model head's, with
    ``logits``; ``last_logits``: of the last position only where the head can, see
    ``last_logits_only``). The caller holds ``lm.lock``."""
    module = lm.head_model if with_head else lm.model
    if module is None:
        raise UnsupportedModelError(f"{lm.display_name!r} has no language-model head.")
    options = last_logits_only(module) if with_head and last_logits else {}
    with through_our_module(lm, blocks, our_pass):
        tensors = {k: v.to(lm.device) for k, v in inputs.items()}
        return module(**tensors, **options, return_dict=True)


def forward_through_ours(
    lm: LoadedModel,
    inputs: Mapping[str, torch.Tensor],
    our_pass: OurPass,
    *,
    seed: int | None = None,
) -> Any:
    """``run_with_our_blocks`` with every attention block ours (``seed``: fresh weights), under
    ``lm.lock``; returns the model's outputs (``last_hidden_state``...)."""
    with lm.lock:
        return run_with_our_blocks(lm, our_blocks(lm, seed), our_pass, inputs)

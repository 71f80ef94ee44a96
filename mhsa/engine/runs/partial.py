"""A forward pass that materialises the selected layers' and heads' attention only.

Every block not selected runs the fused kernel and keeps nothing: the model's own sdpa under
the ``transformers`` engine (its attention implementation switched for the one pass), our
module's sdpa backend under the ``mhsa`` engines. A selected layer's block is our module
(``mhsa.engine.runs.swap.OurBlock``, the block's weights) computing its weights explicitly, as
Neuronpedia recomputes the patterns it shows outside the fused kernel; they equal the model's
eager weights (``tests/test_partial.py``, per family). A model our module cannot load runs the
``transformers`` engine through its own eager blocks, each selected block's weights read by a
hook as it returns them (the pass then costs what the eager forward costs, but holds one layer
of weights at a time all the same).

Each selected layer's weights go, as soon as they are computed, into a preallocated array of
the selected heads in the storage dtype (``mhsa.engine.runs.selection``); the pass stops after the
last
selected layer (the layers above it change no weight). Peak memory: the model's activations
plus one layer's float32 weights plus what is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.runs.forward import attention_modules
from mhsa.engine.runs.norms import norm_observers
from mhsa.engine.runs.selection import Selection
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks, our_blocks_of, through_our_module
from mhsa.engine.stream.hooks import StopPass, after, hooked, stop_after
from mhsa.errors import UnsupportedModelError

__all__ = ["LayerSink", "PartialPass", "selected_forward"]

#: a selected layer's weights are computed in this many chunks of heads (but when they go
#: straight into the returned float32 array): the transient float32 weights are 1/CHUNKS of a
#: layer's (BENCHMARKS.md, bench_long)
CHUNKS = 8

#: receives one selected layer as soon as it is computed: ``(layer, heads [Hsel, T, S])``
LayerSink = Callable[[int, np.ndarray], None]


@dataclass(frozen=True)
class PartialPass:
    """The selected layers' weights of one sentence.

    Attributes:
        attention: ``[layers, heads, T, S]`` of the selection, in its storage dtype (empty
            ``[0, ...]`` when a ``sink`` took every layer).
        causal: the model masks later tokens.
        value_norms: ``[layers, heads, S]`` float32 (``norms=True``), else None.
        fused: the blocks not selected ran a fused kernel (False: the model's eager blocks ran,
            as for a model whose attention implementation cannot be switched).
    """

    attention: np.ndarray
    causal: bool
    value_norms: np.ndarray | None
    fused: bool


def _to_storage(weights: torch.Tensor, heads: torch.Tensor | None, dtype: str) -> torch.Tensor:
    """One layer's weights ``[1, H, T, S]`` -> the selected heads ``[Hsel, T, S]`` on the CPU in
    the storage dtype (bfloat16: rounded to bfloat16, held as float16)."""
    w = weights[0] if heads is None else weights[0].index_select(0, heads.to(weights.device))
    if dtype == "bfloat16":
        w = w.to(torch.bfloat16)
    target = torch.float32 if dtype == "float32" else torch.float16
    return w.to(device="cpu", dtype=target)


class _Collector:
    """Writes each selected layer's heads into one preallocated array (or hands them to a
    sink), so that nothing is stacked afterwards."""

    def __init__(
        self, selection: Selection, n_queries: int, n_keys: int, sink: LayerSink | None
    ) -> None:
        self.selection = selection
        self.sink = sink
        self.position = {layer: i for i, layer in enumerate(selection.layers)}
        heads = None if selection.all_heads else torch.tensor(selection.heads)
        self.heads = heads
        shape = (0 if sink else len(selection.layers), len(selection.heads), n_queries, n_keys)
        dtype = np.float32 if selection.dtype == "float32" else np.float16
        self.array = np.empty(shape, dtype=dtype)

    def buffers(self, blocks: list[OurBlock]) -> dict[int, torch.Tensor]:
        """Per selected layer, the slot of ``array`` our module computes straight into (all
        heads kept in float32 by a float32 block on the CPU: no copy at all); none
        otherwise."""
        if self.sink or self.heads is not None or self.selection.dtype != "float32":
            return {}
        weight = {b.layer: b.ours.qkv.weight for b in blocks}
        return {
            layer: torch.from_numpy(self.array[i])[None]
            for layer, i in self.position.items()
            if weight[layer].dtype == torch.float32 and weight[layer].device.type == "cpu"
        }

    def chunks(self, chunk_heads: int) -> list[list[int]]:
        """The selected heads in chunks of ``chunk_heads``."""
        heads = list(self.selection.heads)
        return [heads[i : i + chunk_heads] for i in range(0, len(heads), chunk_heads)]

    def chunk_taker(self, layer: int) -> Callable[[list[int], torch.Tensor], None]:
        """Writes a chunk of a layer's heads ``[1, c, T, S]`` into its place in ``array`` (or,
        with a sink, into a fresh array of the layer, handed on once its last chunk is in)."""
        i = self.position[layer]
        where = {head: j for j, head in enumerate(self.selection.heads)}
        last = self.selection.heads[-1]
        pending: list[np.ndarray] = []

        def take(chunk: list[int], weights: torch.Tensor) -> None:
            start = where[chunk[0]]
            if self.sink and start == 0:
                pending.append(np.empty(self.array.shape[1:], dtype=self.array.dtype))
            target = pending[-1] if self.sink else self.array[i]
            target[start : start + len(chunk)] = _to_storage(weights, None, self.selection.dtype)
            if self.sink and chunk[-1] == last:
                self.sink(layer, pending.pop())

        return take

    def take(self, layer: int, weights: torch.Tensor) -> None:
        i = self.position[layer]
        if not self.sink and weights.data_ptr() == self.array[i].ctypes.data:
            return  # computed in place
        heads = _to_storage(weights, self.heads, self.selection.dtype).numpy()
        if self.sink:
            self.sink(layer, heads)
        else:
            self.array[i] = heads

    def sink_for(self, layer: int) -> Callable[[torch.Tensor], None]:
        def take(weights: torch.Tensor) -> None:
            self.take(layer, weights)

        return take


@contextmanager
def _fused_model_attention(lm: LoadedModel) -> Iterator[bool]:
    """Within the block the model's own blocks run its sdpa attention (True), or, for a model
    that cannot switch, its eager attention as loaded (False); switched back after."""
    model = lm.model
    before = getattr(model.config, "_attn_implementation", None)
    switched = False
    try:
        try:
            model.set_attn_implementation("sdpa")
            switched = model.config._attn_implementation == "sdpa"
        except (ValueError, ImportError, AttributeError):
            switched = False
        yield switched
    finally:
        if switched and before is not None:
            model.set_attn_implementation(before)


def _no_cache(lm: LoadedModel) -> dict[str, bool]:
    """``use_cache=False`` for a model that keeps a key/value cache: one pass over a long
    input must not hold every layer's keys and values (nor hand our blocks a filled cache)."""
    return {"use_cache": False} if getattr(lm.config, "use_cache", None) is not None else {}


def _our_blocks_for(
    lm: LoadedModel, engine_our_module: bool, seed: int | None, layers: frozenset[int]
) -> list[OurBlock]:
    """Our blocks the pass runs: every block (the ``mhsa`` engines), or the selected layers'
    alone (the ``transformers`` engine)."""
    if engine_our_module:
        return our_blocks(lm, seed)
    return our_blocks_of(lm, layers)


def selected_forward(
    lm: LoadedModel,
    inputs: dict[str, torch.Tensor],
    selection: Selection,
    *,
    our_module: bool,
    seed: int | None = None,
    norms: bool = False,
    sink: LayerSink | None = None,
    eager: bool = False,
) -> PartialPass:
    """One sentence (batch 1) through ``lm``, materialising ``selection`` only.

    Args:
        lm: the model (the caller holds ``lm.lock``).
        inputs: the model's inputs, on its device.
        selection: the layers, heads and storage dtype.
        our_module: every block runs as our module (the ``mhsa`` engines), else the model's own
            blocks but the selected ones.
        seed: our module's fresh weights (``mhsa-random``), else None.
        norms: also each selected head's value norms (Kobayashi et al. 2020).
        sink: receives each selected layer instead of the returned array.
        eager: the model's own eager blocks, every one of them, the selected ones' weights
            read by a hook (``verify``'s reference); ``our_module`` must then be False.

    Raises:
        UnsupportedModelError: an encoder-decoder model (its three attentions come whole), or
            value norms of a model our module cannot load.
    """
    if lm.is_encoder_decoder:
        raise UnsupportedModelError(
            "Selected layers and heads are for encoders and decoders: an encoder-decoder "
            "model's encoder, decoder and cross attention come whole. Leave layers, heads and "
            "attention_dtype at their defaults."
        )
    n = int(inputs["input_ids"].shape[1])
    collect = _Collector(selection, n, n, sink)
    layers = frozenset(selection.layers)
    if eager:
        return _eager_hooked(lm, inputs, selection, collect)
    try:
        blocks = _our_blocks_for(lm, our_module, seed, layers)
    except UnsupportedModelError:
        if our_module or norms:
            raise
        return _eager_hooked(lm, inputs, selection, collect)
    selected = [b for b in blocks if b.layer in layers]
    value_norms: dict[int, torch.Tensor] = {}
    observers = norm_observers(selected, value_norms) if norms else {}
    buffers = collect.buffers(selected)
    # the layer's weights in a single piece: into the returned array itself (all heads kept
    # in float32), or with the value norms' observer; else a chunk of heads at a time
    whole = set(buffers) | (layers if norms else set())
    chunk_heads = max(1, -(-len(selection.heads) // CHUNKS))
    our_pass = OurPass(
        need_weights=False,
        sinks={layer: collect.sink_for(layer) for layer in whole},
        buffers=buffers,
        observers=observers,
        head_chunks={
            layer: (collect.chunks(chunk_heads), collect.chunk_taker(layer))
            for layer in layers - whole
        },
    )
    last = max(selected, key=lambda b: b.layer)
    # the layers above the last selected one change no weight: the pass stops there
    with (
        _nothing() if our_module else _fused_model_attention(lm) as fused,
        hooked([stop_after(last)], stop=True),
        through_our_module(lm, blocks, our_pass),
    ):
        lm.model(**inputs, **_no_cache(lm), return_dict=True)
    return PartialPass(
        collect.array,
        selected[0].causal,
        _selected_norms(value_norms, selection) if norms else None,
        fused=True if our_module else bool(fused),
    )


@contextmanager
def _nothing() -> Iterator[bool]:
    yield True


def _selected_norms(norms: dict[int, torch.Tensor], selection: Selection) -> np.ndarray:
    """The recorded ``[1, H, S]`` value norms of the selected layers and heads,
    ``[layers, heads, S]``."""
    heads = list(selection.heads)
    return np.stack([norms[layer][0, heads].float().cpu().numpy() for layer in selection.layers])


def _eager_hooked(
    lm: LoadedModel, inputs: dict[str, torch.Tensor], selection: Selection, collect: _Collector
) -> PartialPass:
    """The model's own eager blocks, each selected one's weights read by a hook as it returns
    them (a model our module cannot load). The weights of every layer still exist one at a
    time inside the model's blocks; none but the selected are kept.

    Raises:
        UnsupportedModelError: the model does not name its attention modules.
    """
    modules = attention_modules(lm.model)
    if len(modules) != selection.num_layers:
        raise UnsupportedModelError(
            f"{lm.display_name!r}: its attention modules cannot be told apart, so selected "
            "layers cannot be read from it. Leave layers and heads at their defaults."
        )
    causal: list[bool] = []

    def keeper(layer: int) -> Callable[..., None]:
        def keep(_module: Any, _args: Any, output: Any) -> None:
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise UnsupportedModelError(f"{lm.display_name!r} returned no attention weights.")
            if not causal:
                first = weights[0, 0]
                causal.append(first.shape[-1] > 1 and not bool(first.triu(1).any()))
            collect.take(layer, weights)
            if layer == selection.layers[-1]:
                raise StopPass

        return keep

    with hooked([after(modules[layer], keeper(layer)) for layer in selection.layers], stop=True):
        lm.model(**inputs, **_no_cache(lm), return_dict=True)
    return PartialPass(collect.array, causal[0], None, fused=False)

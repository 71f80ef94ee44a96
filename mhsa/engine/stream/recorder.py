"""One stream recorder: ``record(text)`` runs a model once through our module and gives the
activations it was asked for, by standard name, in a ``StreamCache``; ``replace`` changes any of
them in the real forward pass (patching, head knock-outs, a pattern of one's own).

This is TransformerLens's ``run_with_cache`` / ``run_with_hooks`` and its ``ActivationCache``
(Nanda & Bloom 2022, https://github.com/TransformerLensOrg/TransformerLens) for the models this
project runs: its hook points (``hook_resid_pre``, ``hook_q``, ``hook_pattern``, ``hook_z``,
``hook_attn_out``, ``hook_mlp_out``, ``hook_resid_post``...) become the names of
``mhsa.engine.stream.points`` (``L{l}.resid_pre``, ``L{l}.pattern``, ...; ``TRANSFORMER_LENS``
there gives each one's counterpart), the same in every family. Every attention block runs as our
``MultiHeadSelfAttention`` (``mhsa.engine.runs.swap``): the attention points are our module's
observation points (``OBSERVATION_POINTS``) and its output projection's input and output, the
others inputs and outputs of the model's own modules (``mhsa.engine.stream.hooks``).

The module is ``recorder``, not ``record``, so that ``mhsa.engine.stream.record`` stays the
function (a submodule of that name would be set as the package's attribute once imported).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mhsa.engine.encoding import check_text, encode
from mhsa.engine.families.layout import final_norm_of, mlp_of
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.runs.generation import forward_inputs
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks, run_with_our_blocks
from mhsa.engine.stream.hooks import Hook, StopPass, after, before, hooked
from mhsa.engine.stream.points import LAYER_POINTS, REPLACEABLE, point_of, selected
from mhsa.errors import InputError, UnsupportedModelError

__all__ = [
    "NORMED_POINTS",
    "Call",
    "NotRecordedError",
    "Recording",
    "StreamCache",
    "record",
    "recorded",
    "stream_points",
]

#: a replacement: a tensor of the point's recorded shape, or ``fn(value) -> value`` (None: keep)
Replacement = torch.Tensor | Callable[[torch.Tensor], torch.Tensor | None]


class NotRecordedError(InputError, KeyError):
    """A point asked of a ``StreamCache`` that it does not hold (an ``InputError`` and a
    ``KeyError``: ``Mapping.get`` and ``in`` work as for any mapping)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StreamCache(Mapping[str, torch.Tensor]):
    """The activations one ``record`` pass kept, by point name (read-only).

    Like TransformerLens's ``ActivationCache``: ``cache["L1.pattern"]`` is layer 1's attention
    ``[H, T, T]``. Values are detached float32 tensors on the CPU, or (``record(grad=True)``)
    tensors of the model's dtype on its device inside the autograd graph.

    Attributes:
        tokens: the token strings of the text, as the model (an encoder-decoder's encoder)
            sees them.
        model: the model's display name.
        points: the names recorded, in the order the forward pass reached them.
        decoder_tokens: an encoder-decoder's decoder tokens (its ``D{l}`` and ``C{l}``
            points' queries), else None.
    """

    def __init__(
        self,
        values: dict[str, torch.Tensor],
        tokens: tuple[str, ...],
        model: str,
        decoder_tokens: tuple[str, ...] | None = None,
    ) -> None:
        self._values = types.MappingProxyType(dict(values))
        self.tokens = tokens
        self.model = model
        self.points = tuple(values)
        self.decoder_tokens = decoder_tokens

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._values[name]
        except KeyError:
            held = ", ".join(self.points) or "nothing"
            raise NotRecordedError(
                f"{name!r} was not recorded; this cache holds {held} (ask record(points=[...]) "
                "for it)."
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"StreamCache({self.model!r}, {len(self.tokens)} tokens, points={list(self.points)})"


@dataclass(frozen=True)
class _Layer:
    """What the recorder hooks in one layer.

    Attributes:
        block: our block in the layer's attention place.
        module: the whole layer (its input is ``resid_pre``, its output ``resid_post``; a
            decoder layer of an encoder-decoder holds its self- and its cross-attention).
        mlp: the layer's MLP module (``mlp_of``), or None (cross-attention: the decoder
            layer's MLP belongs to its self-attention's points).
        mlp_in: whether the MLP module receives the residual's width (``mlp_in`` exists).
    """

    block: OurBlock
    module: nn.Module
    mlp: nn.Module | None
    mlp_in: bool

    @property
    def prefix(self) -> str:
        """``L{l}`` (encoders, decoders); ``E{l}``, ``D{l}``, ``C{l}`` (an encoder-decoder's
        encoder, decoder self-attention and cross-attention layers)."""
        return f"{_PREFIXES[self.block.kind]}{self.block.index}"

    @property
    def cross(self) -> bool:
        return self.block.kind == "cross"

    def names(self) -> list[str]:
        """The layer's point names, in ``LAYER_POINTS``'s order."""
        missing = set() if self.mlp is not None else {"mlp_in", "mlp_out"}
        if not self.mlp_in:
            missing.add("mlp_in")
        if self.cross:
            missing |= {"resid_pre", "resid_post"}
        return [f"{self.prefix}.{p}" for p in LAYER_POINTS if p not in missing]


#: the internal points ``recorded`` serves besides the public ones (not in ``stream_points``):
#: the output of a norm that a layer puts after its attention output or after its MLP output
#: (Gemma 2/3's and OLMo 2's ``post_attention_layernorm`` and ``post_feedforward_layernorm``),
#: what the residual then receives; by the point whose tensor that norm takes
NORMED_POINTS: dict[str, str] = {"attn_out": "attn_normed", "mlp_out": "mlp_normed"}


#: the prefix of a block's points, by its kind (``mhsa.engine.runs.swap.BLOCK_KINDS``)
_PREFIXES = {"self": "L", "encoder": "E", "decoder": "D", "cross": "C"}


def _layers(lm: LoadedModel, blocks: list[OurBlock]) -> list[_Layer]:
    d_model = blocks[0].ours.d_model
    owners = {id(child): m for m in lm.model.modules() for child in m.children()}
    out = []
    for block in blocks:
        outer, name = block.layer_place
        module = getattr(outer, name)
        owner = owners.get(id(outer))
        if block.kind != "self" and getattr(owner, "layer", None) is outer:
            module = owner  # T5: the block's sublayers sit in its ``layer`` list
        mlp = None if block.kind == "cross" else mlp_of(module)
        width = getattr(mlp, "in_features", d_model)
        out.append(_Layer(block, module, mlp, mlp is not None and width == d_model))
    return out


def _final_norm(lm: LoadedModel) -> nn.Module | None:
    try:
        return final_norm_of(lm)
    except UnsupportedModelError:
        return None


def stream_points(model: str | LoadedModel = DEFAULT_MODEL) -> list[str]:
    """Every point name ``record`` knows for ``model``, layer by layer in ``LAYER_POINTS``'s
    order, then ``final_norm_in`` and ``logits`` where the model has them.

    Raises:
        UnsupportedModelError: as ``record``.
    """
    lm = resolve_model(model)
    with lm.lock:
        return _valid(lm, _layers(lm, our_blocks(lm)))


def _valid(lm: LoadedModel, layers: list[_Layer]) -> list[str]:
    """Every point name, in forward order (an encoder-decoder's encoder layers, then each
    decoder layer's self-attention, then its cross-attention)."""

    def rank(layer: _Layer) -> tuple[bool, int, bool]:
        kind = layer.block.kind
        return kind in ("decoder", "cross"), layer.block.index, kind == "cross"

    ranked = sorted(layers, key=rank)
    names = [n for layer in ranked for n in layer.names()]
    if _final_norm(lm) is not None:
        names.append("final_norm_in")
    if lm.head_model is not None:
        names.append("logits")
    return names


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _with_first(output: Any, first: torch.Tensor) -> Any:
    return (first, *output[1:]) if isinstance(output, tuple) else first


class _Turns:
    """Which layer each call of one module is: a module several layers call (ALBERT's shared
    layer and its one attention module) is called once per layer, in the layers' order."""

    def __init__(self, layers: list[str]) -> None:
        self.layers = layers  # the point prefixes of the layers, in call order
        self.calls = 0

    def next(self) -> str:
        layer = self.layers[self.calls % len(self.layers)]
        self.calls += 1
        return layer


class _Recorder:
    """Sees each point's value as the pass reaches it (batch first, ``[1, ...]``): replaces it
    when ``replace`` names it, keeps it when it is asked (a float32 copy on the CPU; with
    ``on_device`` a copy where and as the model computed it), and ends the pass (``StopPass``)
    once everything asked is in."""

    def __init__(
        self,
        wanted: list[str],
        replace: dict[str, Replacement],
        grad: bool,
        on_device: bool = False,
    ) -> None:
        self.wanted = set(wanted)
        self.replace = replace
        self.grad = grad
        self.on_device = on_device
        self.values: dict[str, torch.Tensor] = {}
        #: the very tensor each ``attn_out`` / ``mlp_out`` point passed on, where a normed
        #: point after it is asked (the norm after it is the module that takes this tensor)
        self.passed: dict[str, torch.Tensor] = {}
        #: each normed point reached: the norm module that gave it
        self.norms: dict[str, nn.Module] = {}
        #: the calls of the modules ``recorded`` was asked to follow, in order
        self.calls: list[Call] = []
        self.last: str | None = None  # the last point kept

    def needs(self, name: str) -> bool:
        return name in self.wanted or name in self.replace

    def visit(self, name: str, value: torch.Tensor) -> torch.Tensor | None:
        """``value`` seen at ``name``; returns its replacement, or None to leave it."""
        new = self._replaced(name, value) if name in self.replace else None
        if name in self.wanted:
            kept = (value if new is None else new)[0]
            if self.grad:
                self.values[name] = kept.clone()  # a copy: some layers add into outputs in place
            elif self.on_device:
                self.values[name] = kept.detach().clone()
            else:
                self.values[name] = kept.detach().to("cpu", torch.float32, copy=True)
            self.last = name
            if len(self.values) == len(self.wanted):
                raise StopPass  # nothing asked lies further on
        return new

    def _replaced(self, name: str, value: torch.Tensor) -> torch.Tensor | None:
        given = self.replace[name]
        shape = tuple(value.shape[1:])
        if callable(given) and not isinstance(given, torch.Tensor):
            given = given(value[0])
            if given is None:
                return None
        if not isinstance(given, torch.Tensor):
            raise InputError(
                f"replace[{name!r}] must be a tensor of shape {list(shape)} or a function "
                f"returning one, got {type(given).__name__}."
            )
        if tuple(given.shape) != shape:
            raise InputError(
                f"replace[{name!r}] has shape {list(given.shape)}; {name} is {list(shape)}."
            )
        # a copy on the model's device: the model may add into the tensor in place
        return given.to(device=value.device, dtype=value.dtype, copy=True).unsqueeze(0)


def _attention_observer(recorder: _Recorder, block: OurBlock) -> Callable[..., Any] | None:
    """The observer of ``block``'s q, k, v and pattern (our module's last per-head Q and K
    before the scores: rotated, else normed, else split into heads), or None when none of them
    is asked or replaced (the layer then runs the fused kernel)."""
    ours = block.ours
    rotary, q_norm, k_norm = (m is not None for m in (ours.rotary, ours.q_norm, ours.k_norm))
    q = "rotated Q" if rotary else "normed Q" if q_norm else "per-head Q"
    k = "rotated K" if rotary else "normed K" if k_norm else "per-head K"
    names = {q: "q", k: "k", "per-head V": "v", "probabilities": "pattern"}
    prefix = f"{_PREFIXES[block.kind]}{block.index}"
    names = {ours_name: f"{prefix}.{p}" for ours_name, p in names.items()}
    if not any(recorder.needs(n) for n in names.values()):
        return None

    def observe(name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        point = names.get(name)
        return None if point is None else recorder.visit(point, tensor)

    return observe


def _hooks(recorder: _Recorder, layers: list[_Layer], final_norm: nn.Module | None) -> list[Hook]:
    """The hooks on the model's modules (and on our modules' output projections) that see the
    points outside the attention core."""
    turns: dict[tuple[int, str], _Turns] = {}  # (module, when) -> the layers calling it
    needed: set[tuple[int, str]] = set()  # the (module, when) of a point asked or replaced
    hooks: list[Hook] = []

    def add(module: nn.Module, when: str, layer: str, point: str, make) -> None:
        key = (id(module), when)
        if key not in turns:
            turns[key] = _Turns([])
            hooks.append(make(module, turns[key]))
        turns[key].layers.append(layer)
        normed = NORMED_POINTS.get(point)
        if recorder.needs(f"{layer}.{point}") or (
            normed is not None and recorder.needs(f"{layer}.{normed}")
        ):
            needed.add(key)

    def pre_hidden(point: str):
        def make(module, turns_of):
            def hook(_m, args, kwargs):
                new = recorder.visit(f"{turns_of.next()}.{point}", _hidden(args, kwargs))
                return None if new is None else _with_hidden(args, kwargs, new)

            return before(module, hook, kwargs=True)

        return make

    def post_output(point: str):
        def make(module, turns_of):
            def hook(_m, _args, output):
                first = _first(output)
                shape = first.shape
                if first.dim() == 2:  # OPT's MLP runs on the tokens flattened to [B T, D]
                    first = first.reshape(1, -1, shape[-1])  # one sequence
                name = f"{turns_of.next()}.{point}"
                new = recorder.visit(name, first)
                output = output if new is None else _with_first(output, new.reshape(shape))
                normed = NORMED_POINTS.get(point)
                if normed is not None and recorder.needs(f"{name.partition('.')[0]}.{normed}"):
                    recorder.passed[name] = _first(output)
                return None if new is None else output

            return after(module, hook)

        return make

    def z_hook(module, turns_of):
        heads, d_head = module_heads[id(module)]

        def hook(_m, args):
            merged = args[0]  # [B, T, H d_head]: the heads' contexts side by side
            b, t, _ = merged.shape
            z = merged.view(b, t, heads, d_head).transpose(1, 2)
            new = recorder.visit(f"{turns_of.next()}.z", z)
            return None if new is None else (new.transpose(1, 2).reshape(b, t, heads * d_head),)

        return before(module, hook)

    module_heads: dict[int, tuple[int, int]] = {}
    for layer in layers:
        i, ours = layer.prefix, layer.block.ours
        module_heads[id(ours.out)] = (ours.num_heads, ours.d_head)
        if not layer.cross:
            add(layer.module, "pre", i, "resid_pre", pre_hidden("resid_pre"))
        add(ours.out, "pre", i, "z", z_hook)
        add(ours.out, "post", i, "attn_out", post_output("attn_out"))
        if layer.mlp is not None:
            if layer.mlp_in:
                add(layer.mlp, "pre", i, "mlp_in", pre_hidden("mlp_in"))
            add(layer.mlp, "post", i, "mlp_out", post_output("mlp_out"))
        if not layer.cross:
            add(layer.module, "post", i, "resid_post", post_output("resid_post"))
    kept = [h for h in hooks if (id(h.module), h.when) in needed]
    kept += _norm_hooks(recorder, layers)
    if final_norm is not None and recorder.needs("final_norm_in"):

        def final(_m, args, kwargs):
            new = recorder.visit("final_norm_in", _hidden(args, kwargs))
            return None if new is None else _with_hidden(args, kwargs, new)

        kept.append(before(final_norm, final, kwargs=True))
    return kept


def _norm_hooks(recorder: _Recorder, layers: list[_Layer]) -> list[Hook]:
    """Hooks after every other module of a layer with a weight (its norms) that keep, as
    ``attn_normed`` / ``mlp_normed``, the output of the one that takes the very tensor the
    layer's ``attn_out`` / ``mlp_out`` point passed on; the norm itself goes to
    ``recorder.norms``. Found by what the forward hands the module, not by its name."""
    prefixes: dict[int, list[str]] = {}  # a module (ALBERT's shared layer: several layers)
    children: dict[int, nn.Module] = {}
    for layer in layers:
        if layer.cross or not any(
            recorder.needs(f"{layer.prefix}.{n}") for n in NORMED_POINTS.values()
        ):
            continue
        skip = {id(layer.block), id(layer.block.original), id(layer.mlp)}
        for child in layer.module.children():
            if id(child) not in skip and getattr(child, "weight", None) is not None:
                prefixes.setdefault(id(child), []).append(layer.prefix)
                children[id(child)] = child

    def make(module: nn.Module) -> Hook:
        def hook(_m, args, output):
            given = args[0] if args else None
            for prefix in prefixes[id(module)]:
                for point, normed in NORMED_POINTS.items():
                    if given is not None and given is recorder.passed.get(f"{prefix}.{point}"):
                        recorder.norms[f"{prefix}.{normed}"] = module
                        new = recorder.visit(f"{prefix}.{normed}", _first(output))
                        return None if new is None else _with_first(output, new)
            return None

        return after(module, hook)

    return [make(m) for m in children.values()]


@dataclass(frozen=True, eq=False)
class Call:
    """One call of a module ``recorded`` follows (``calls``): what it took and gave.

    Attributes:
        after: the last point kept before the call (``L3.z``), None before the first.
        module: the module called.
        given: its first input, batch first (on the model's device, not copied).
        gave: its output (its first, where it returns several).
    """

    after: str | None
    module: nn.Module
    given: torch.Tensor
    gave: torch.Tensor


def _call_hooks(recorder: _Recorder, modules: Iterable[nn.Module]) -> list[Hook]:
    """Hooks after each of ``modules`` that log its every call into ``recorder.calls``."""

    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        if args and isinstance(args[0], torch.Tensor):
            recorder.calls.append(Call(recorder.last, module, args[0], _first(output)))

    return [after(module, hook) for module in modules]


def _inputs(
    lm: LoadedModel, text_or_inputs: str | Mapping[str, Any]
) -> tuple[dict, tuple, tuple | None]:
    """The model inputs (batch 1, on the CPU), the tokens and an encoder-decoder's decoder
    tokens of a text (encoded as ``mhsa.attend`` encodes it: the decoder reads the text itself,
    teacher-forced) or of inputs given as they are.

    Raises:
        InputError: an empty text, inputs without ``input_ids`` (an encoder-decoder's without
            ``decoder_input_ids``), or a batch of several.
    """
    if isinstance(text_or_inputs, str):
        encoded = encode(lm, check_text(text_or_inputs), None, None)
        decoder = encoded.decoder_tokens
        return dict(encoded.inputs), tuple(encoded.tokens.strings), decoder and tuple(decoder)
    if not isinstance(text_or_inputs, Mapping) or "input_ids" not in text_or_inputs:
        raise InputError("record takes a text or a dict of model inputs with input_ids.")
    inputs = {k: torch.as_tensor(v) for k, v in text_or_inputs.items()}
    ids = inputs["input_ids"]
    if ids.dim() == 1:
        inputs = {k: v[None] if v.dim() == 1 else v for k, v in inputs.items()}
        ids = inputs["input_ids"]
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise InputError(
            f"record runs one sequence: input_ids must be [1, T], got {list(ids.shape)}."
        )
    tokens = tuple(lm.tokenizer.convert_ids_to_tokens(ids[0].tolist()))
    if not lm.is_encoder_decoder:
        return inputs, tokens, None
    decoder = inputs.get("decoder_input_ids")
    if decoder is None or decoder.dim() != 2 or decoder.shape[0] != 1:
        raise InputError("An encoder-decoder's inputs need decoder_input_ids of one sequence.")
    return inputs, tokens, tuple(lm.tokenizer.convert_ids_to_tokens(decoder[0].tolist()))


def _replacements(
    replace: Mapping[str, Replacement] | None, valid: list[str]
) -> dict[str, Replacement]:
    """``replace`` with each key (a name or a pattern) spread to the names it matches.

    Raises:
        InputError: an unknown name, or a point that cannot be replaced (the logits).
    """
    if not replace:
        return {}
    if not isinstance(replace, Mapping):
        raise InputError("replace must be a mapping from point names to tensors or functions.")
    out: dict[str, Replacement] = {}
    for key, value in replace.items():
        for name in selected([key], valid, "replace"):
            if point_of(name) not in REPLACEABLE:
                raise InputError(
                    f"replace: {name} cannot be replaced (it is the pass's end); replace one of "
                    f"{', '.join(sorted(REPLACEABLE))}."
                )
            out[name] = value
    return out


def record(
    text_or_inputs: str | Mapping[str, Any],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    points: Iterable[str] | None = None,
    replace: Mapping[str, Replacement] | None = None,
    grad: bool = False,
) -> StreamCache:
    """One forward pass through our module, recording the points asked (TransformerLens's
    ``run_with_cache``; with ``replace``, its ``run_with_hooks``).

    Every point is named as in ``mhsa.engine.stream.points`` (``LAYER_POINTS``,
    ``MODEL_POINTS``), ``L{l}.<point>`` for layer l: ``resid_pre`` ``[T, D]`` (the layer's
    input), ``q`` ``[H, T, d_head]``, ``k`` and ``v`` ``[G, T, d_head]`` (G key/value heads;
    q and k as the scores read them: after the model's q/k norms and rotary positions, our
    module's "normed Q" / "rotated Q" observation points), ``pattern`` ``[H, T, T]`` (the
    attention probabilities, "probabilities"), ``z`` ``[H, T, d_head]`` (each head's context
    before W_O, "per-head context"), ``attn_out`` ``[T, D]`` (W_O z + b_O, before any residual
    sum or post-norm), ``mlp_in`` and ``mlp_out`` ``[T, D]`` (what the MLP module receives and
    returns; absent in BERT, DistilBERT and ALBERT, whose feed-forward block is no one module,
    and ``mlp_in`` in OPT), ``resid_post`` ``[T, D]`` (the layer's output); then
    ``final_norm_in`` ``[T, D]`` (models with a final norm) and ``logits`` ``[T, V]`` (models
    loaded with a head; absent otherwise). The batch dimension is dropped: one sequence.

    Encoder-decoders (BART, T5 families): ``E{l}.*`` for the encoder's layers, ``D{l}.*`` for
    the decoder's layers (their self-attention; the decoder reads the text itself,
    teacher-forced, as ``mhsa.attend`` runs it: ``StreamCache.decoder_tokens``) and ``C{l}.*``
    for decoder layer l's cross-attention (``q`` ``[H, T_dec, d_head]``, ``k`` and ``v``
    ``[H, T_enc, d_head]`` from the encoder's output, ``pattern`` ``[H, T_dec, T_enc]``, ``z``,
    ``attn_out``); ``final_norm_in`` is the decoder's final norm's input (T5), ``logits``
    ``[T_dec, V]``. A T5 layer is its whole block (self-attention, cross-attention and
    feed-forward sublayers), which has no MLP points.

    Only what is asked is computed: a layer runs its attention's eager steps (per-head weights)
    only when its q, k, v or pattern is asked or replaced (z and attn_out come from our module's
    output projection, with the fused kernel), the pass ends once the last point asked is in,
    and without ``logits`` the base model runs (no vocabulary-wide product).

    Args:
        text_or_inputs: a text (encoded as ``mhsa.attend`` encodes it: the same tokens), or a
            dict of model inputs of one sequence (``input_ids`` ``[1, T]`` or ``[T]``...).
        model: a model name (``"default"``: the embedded MiniLM) or a ``LoadedModel``.
        points: names or ``fnmatch`` patterns (``["L1.pattern", "*.z"]``); None: every point.
        replace: point name (or pattern) -> a tensor of the point's recorded shape, or
            ``fn(value) -> value`` (None keeps the value), applied in the real forward pass:
            everything downstream sees the new value. ``{"L0.pattern": p}`` makes layer 0's
            heads attend with ``p``; a zero head of ``L0.z`` knocks the head out. Every point
            but ``logits`` can be replaced. A recorded point holds its value after replacement.
        grad: keep the values in the autograd graph, on the model's device and in its dtype,
            so that a metric of them can be differentiated (towards a replaced tensor that
            requires grad, say); otherwise values are detached float32 copies on the CPU.

    Returns:
        The ``StreamCache`` of the points asked; ``cache["L1.pattern"]`` is what
        ``mhsa.attend(text, model=...)`` gives as ``attention[1]``.

    Raises:
        InputError: an empty text, inputs of several sequences, an unknown point name (the
            message lists the valid ones), or a replacement of the wrong shape (naming the
            point and both shapes).
        UnsupportedModelError: a family our module does not cover.
    """
    lm = resolve_model(model)
    with lm.lock:
        inputs, tokens, decoder_tokens = _inputs(lm, text_or_inputs)
        blocks = our_blocks(lm)
        valid = _valid(lm, _layers(lm, blocks))
        wanted = selected(points, valid, "points")
        replacements = _replacements(replace, valid)
        if not wanted:  # nothing to keep: the pass would change nothing anyone sees
            return StreamCache({}, tokens, lm.display_name, decoder_tokens)
        kept = recorded(lm, blocks, inputs, wanted, replace=replacements, grad=grad)
    missing = [n for n in wanted if n not in kept.values]
    if missing:
        raise UnsupportedModelError(
            f"{lm.display_name}: the pass never reached {', '.join(missing)} (a layer that does "
            "not call the module this point reads)."
        )
    return StreamCache(kept.values, tokens, lm.display_name, decoder_tokens)


@dataclass(frozen=True)
class Recording:
    """What ``recorded`` kept of one pass.

    Attributes:
        values: by point name, each point reached (batch dimension dropped), in the order the
            pass reached it.
        norms: by internal normed point reached (``NORMED_POINTS``), the norm module that gave
            it (to be frozen at its input, TransformerLens's ``apply_ln_to_stack``).
        calls: every call of the modules asked to be followed (``recorded(calls=...)``), in
            the order the forward made them, each placed after the last point kept before it.
    """

    values: dict[str, torch.Tensor]
    norms: dict[str, nn.Module]
    calls: tuple[Call, ...] = ()


def recorded(
    lm: LoadedModel,
    blocks: list[OurBlock],
    inputs: Mapping[str, torch.Tensor],
    names: Iterable[str],
    *,
    replace: Mapping[str, Replacement] | None = None,
    grad: bool = False,
    on_device: bool = False,
    last_logits: bool = False,
    calls: Iterable[nn.Module] = (),
) -> Recording:
    """The recorder's pass itself, which ``record`` and the stream's passes
    (``mhsa.engine.stream.residual``) share: ``inputs`` (batch 1) through ``lm`` with ``blocks``
    standing in for its attention blocks, keeping the points ``names`` (exact names, already
    valid; besides ``record``'s, the internal ``NORMED_POINTS`` of each layer, kept where the
    layer has such a norm) and replacing those of ``replace`` (exact names). The caller holds
    ``lm.lock``.

    Values are detached float32 copies on the CPU (``record``'s), copies in the model's dtype on
    its device (``on_device``: what the stream's passes compute with), or, with ``grad``, in the
    autograd graph. The head runs only when ``logits`` is asked, over the last position alone
    with ``last_logits`` where the head can skip the others. A point never reached is absent
    from ``Recording.values``. ``calls``: modules (a post-norm encoder's LayerNorms) whose every
    call's input and output is logged in ``Recording.calls``, placed among the points, for
    freezing the norms where the forward ran them.
    """
    names = list(names)
    recorder = _Recorder(names, dict(replace or {}), grad, on_device)
    with_head = "logits" in recorder.wanted
    observers = {b.layer: o for b in blocks if (o := _attention_observer(recorder, b)) is not None}
    our_pass = OurPass(
        need_weights=False,
        observers=observers,
        sinks={layer: _discard for layer in observers},  # the observer keeps what is asked
    )
    hooks = _hooks(recorder, _layers(lm, blocks), _final_norm(lm)) + _call_hooks(recorder, calls)
    model_inputs = forward_inputs(lm, dict(inputs), with_head)
    with _grad_mode(grad), hooked(hooks, stop=True):
        out = run_with_our_blocks(
            lm, blocks, our_pass, model_inputs, with_head=with_head, last_logits=last_logits
        )
        if with_head:
            recorder.visit("logits", out.logits)
    return Recording(dict(recorder.values), dict(recorder.norms), tuple(recorder.calls))


@contextmanager
def _grad_mode(grad: bool) -> Iterator[None]:
    """Autograd on (also inside a caller's ``inference_mode``) for ``grad``, else inference
    mode."""
    if not grad:
        with torch.inference_mode():
            yield
        return
    with torch.inference_mode(False), torch.enable_grad():
        yield


def _discard(_weights: torch.Tensor) -> None:
    """A layer's weights, not kept: its observer has kept what was asked of them."""

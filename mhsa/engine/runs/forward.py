"""The forward pass: a model through its eager attention, or with every attention block swapped
for our module; and the ``AttentionResult`` of an encoded text.

"Eager" means the model's own (eager) attention blocks; "our" means the project's
``MultiHeadSelfAttention`` running in their place (``mhsa.engine.runs.swap``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mhsa.engine.attention.module import Observer
from mhsa.engine.encoding import Encoded
from mhsa.engine.families.registry import supported_families
from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.norms import (
    blocks_for_norms,
    check_norms_apply,
    norm_observers,
    recording_value_norms,
    stacked_norms,
)
from mhsa.engine.runs.swap import OurBlock, OurPass, run_with_our_blocks
from mhsa.engine.stream.hooks import StopPass, hooked, stop_after
from mhsa.errors import ModelLoadError, UnsupportedModelError

__all__ = [
    "ForwardPass",
    "StopPass",
    "attention_modules",
    "blocks_of_kind",
    "eager_forward",
    "is_causal",
    "make_result",
    "our_attention",
    "our_forward",
    "our_seq2seq_forward",
    "require_attentions",
    "run_until",
]


@dataclass(frozen=True)
class ForwardPass:
    """One sentence's pass (batch 1), still on the model's device.

    Attributes:
        attention: every layer's weights, ``[L, H, T, T]``.
        causal: whether the model masks later tokens.
        extra: further ``AttentionResult`` fields (encoder-decoder models: decoder and cross
            attention as numpy arrays).
        last_hidden: the final hidden state, when the model gives one.
        value_norms: ``||f_h(x_j)||`` of every layer, head and key, ``[L, H, T]`` float32
            (``mhsa.engine.runs.norms``), when asked for: ``attention`` times these is the attention
            weighted by value norm.
        encoder_hidden: encoder-decoder models: the encoder's final hidden state
            (``last_hidden`` is the decoder's).
    """

    attention: torch.Tensor  # (L, H, T, T)
    causal: bool
    extra: dict[str, Any]
    last_hidden: torch.Tensor | None = None
    value_norms: torch.Tensor | None = None  # (L, H, T)
    encoder_hidden: torch.Tensor | None = None


def require_attentions(attentions: Any, what: str, name: str) -> tuple[torch.Tensor, ...]:
    """The model's per-layer attentions, or a clear error when it gave none.

    Args:
        attentions: what the model returned as ``attentions`` (or ``encoder_attentions``, ...).
        what: which attention, for the message: ``"self"``, ``"encoder"``, ``"cross"``, ...
        name: the model's name, for the message.

    Raises:
        ModelLoadError: some layer gave no weights.
    """
    if not attentions or any(a is None for a in attentions):
        raise ModelLoadError(
            f"Model {name!r} returned no {what}-attention weights: its architecture does not "
            f"expose attention with eager attention. Choose a model of the {supported_families()} "
            f"layouts, or a T5/BART-style encoder-decoder."
        )
    return tuple(attentions)


def _to_numpy(attentions: tuple[torch.Tensor, ...]) -> np.ndarray:
    return torch.stack([a[0] for a in attentions]).float().cpu().numpy()  # (L, H, T, S)


def is_causal(attentions: Any) -> bool:
    """A model masks later tokens when its first head has no weight above the diagonal.

    Args:
        attentions: per-layer weights ``[B, H, T, S]``; the first sentence of the first layer is
            read.
    """
    first = attentions[0][0, 0]  # (T, S)
    return first.shape[-1] > 1 and not bool(first.triu(1).any())


def eager_forward(
    lm: LoadedModel, inputs: dict[str, torch.Tensor], *, norms: bool = False
) -> ForwardPass:
    """The model through its own eager attention, every layer (batch 1); ``norms``: also each
    key's value norm (the V each block computes, read by a hook, through ``W_O`` of our module
    of that block: ``mhsa.engine.runs.norms.recording_value_norms``). The caller holds
    ``lm.lock``."""
    name = lm.display_name
    value_norms: dict[int, torch.Tensor] = {}
    with recording_value_norms(blocks_for_norms(lm) if norms else [], value_norms):
        outputs = lm.model(**inputs, output_attentions=True, return_dict=True)
    extra: dict[str, Any] = {}
    if lm.is_encoder_decoder:
        theirs = require_attentions(getattr(outputs, "encoder_attentions", None), "encoder", name)
        extra = {
            "decoder_attention": _to_numpy(
                require_attentions(getattr(outputs, "decoder_attentions", None), "decoder", name)
            ),
            "cross_attention": _to_numpy(
                require_attentions(getattr(outputs, "cross_attentions", None), "cross", name)
            ),
        }
    else:
        theirs = require_attentions(getattr(outputs, "attentions", None), "self", name)
    hidden = getattr(outputs, "last_hidden_state", None)
    weights = torch.stack([a[0] for a in theirs])  # (L, H, T, T)
    per_key = stacked_norms(value_norms, len(theirs)) if norms else None
    encoder_hidden = getattr(outputs, "encoder_last_hidden_state", None)
    return ForwardPass(weights, is_causal(theirs), extra, hidden, per_key, encoder_hidden)


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose outputs transformers records as ``attentions`` (its own
    ``_can_record_outputs``), in the order they run; [] when the model does not say."""
    from transformers.utils.output_capturing import OutputRecorder

    specs = getattr(model, "_can_record_outputs", None) or {}
    spec = specs.get("attentions")
    if spec is None or isinstance(spec, list | str):
        return []
    if not isinstance(spec, OutputRecorder):
        spec = OutputRecorder(target_class=spec, index=1)
    if spec.index != 1 or spec.target_class is None:
        return []
    layer = f".{spec.layer_name.strip('.')}." if spec.layer_name else None
    return [
        m
        for name, m in model.named_modules()
        if isinstance(m, spec.target_class) and (layer is None or layer in f".{name}.")
    ]


def our_attention(
    lm: LoadedModel,
    blocks: list[OurBlock],
    inputs: dict[str, torch.Tensor],
    gates: dict[int, torch.Tensor] | None = None,
    *,
    whole: bool = True,
    observers: dict[int, Observer] | None = None,
) -> tuple[torch.Tensor, Any]:
    """Every layer's weights with every attention block swapped for ours, and the model's outputs.

    Args:
        lm: the model.
        blocks: our blocks, one per attention block (``mhsa.engine.runs.swap.our_blocks``).
        inputs: a batch of model inputs, on the model's device.
        gates: per layer, head gates ``[H]`` or ``[B, H]`` (1 keeps a head, 0 switches it
            off); layers not listed: all heads on.
        whole: False: the pass stops once the last block has written its weights (the
            feed-forward block above it and any head on top change no weight), and the outputs
            are None.
        observers: per layer, an observer of our module's intermediates.

    Returns:
        ``(weights, outputs)``: every layer's weights in one preallocated ``[L, B, H, T, T]``
        array, and the model's outputs (None when ``whole`` is False).
    """
    if blocks[0].kind != "self":
        raise UnsupportedModelError(
            "our_attention stacks the self-attention of encoders and decoders; an "
            "encoder-decoder's three attentions come from our_seq2seq_forward."
        )
    b, n = inputs["input_ids"].shape
    first = blocks[0].ours
    weights = first.qkv.weight.new_empty(len(blocks), b, first.num_heads, n, n)
    our_pass = OurPass(gates=gates or {}, weights_out=weights, observers=observers or {})
    if whole:
        return weights, run_with_our_blocks(lm, blocks, our_pass, inputs)
    run_until(lm, blocks, our_pass, inputs, blocks[-1])
    return weights, None


def run_until(
    lm: LoadedModel,
    blocks: list[OurBlock],
    our_pass: OurPass,
    inputs: dict[str, torch.Tensor],
    last: OurBlock,
) -> None:
    """``run_with_our_blocks`` stopped right after ``last`` has run: the layers above it (and
    any head on top) change nothing ``our_pass`` observes. The caller holds ``lm.lock``."""
    with hooked([stop_after(last)], stop=True):
        run_with_our_blocks(lm, blocks, our_pass, inputs)


def our_forward(
    lm: LoadedModel, inputs: dict[str, torch.Tensor], blocks: list[OurBlock], *, norms: bool = False
) -> ForwardPass:
    """The whole model with every attention block swapped for ours (batch 1); ``norms``: also
    each key's value norm (from the per-head V our module computes anyway:
    ``mhsa.engine.runs.norms.norm_observers``). Encoder-decoder models: ``our_seq2seq_forward``."""
    if blocks[0].kind != "self":
        if norms:
            check_norms_apply(lm)
        return our_seq2seq_forward(lm, inputs, blocks)
    value_norms: dict[int, torch.Tensor] = {}
    observers = norm_observers(blocks, value_norms) if norms else None
    weights, outputs = our_attention(lm, blocks, inputs, observers=observers)
    hidden = getattr(outputs, "last_hidden_state", None)
    weights = weights[:, 0]  # (L, H, T, T)
    per_key = stacked_norms(value_norms, len(blocks)) if norms else None
    return ForwardPass(weights, blocks[0].causal, {}, hidden, per_key)


def blocks_of_kind(blocks: list[OurBlock], kind: str) -> list[OurBlock]:
    """The blocks of one kind (``mhsa.engine.runs.swap.BLOCK_KINDS``), in layer order."""
    return [b for b in blocks if b.kind == kind]


def our_seq2seq_forward(
    lm: LoadedModel,
    inputs: dict[str, torch.Tensor],
    blocks: list[OurBlock],
    gates: dict[int, torch.Tensor] | None = None,
) -> ForwardPass:
    """An encoder-decoder model with every attention block swapped for ours (batch 1): the
    encoder's self-attention as ``attention`` ``[L, H, n, n]``, the decoder's
    (``decoder_attention`` ``[L, H, m, m]``) and the cross attention (``cross_attention``
    ``[L, H, m, n]``) in ``extra``, all from our modules' own weights (the model's
    ``outputs.attentions`` stay empty once its blocks are replaced), and both final hidden
    states. ``gates``: per block (``OurBlock.layer``), head gates."""
    our_pass = OurPass(gates=gates or {}, need_weights=True)
    outputs = run_with_our_blocks(lm, blocks, our_pass, inputs)

    def stacked(kind: str) -> torch.Tensor:
        return torch.stack([our_pass.weights[b.layer][0] for b in blocks_of_kind(blocks, kind)])

    extra = {
        "decoder_attention": stacked("decoder").float().cpu().numpy(),
        "cross_attention": stacked("cross").float().cpu().numpy(),
    }
    return ForwardPass(
        stacked("encoder"),
        False,
        extra,
        getattr(outputs, "last_hidden_state", None),
        encoder_hidden=getattr(outputs, "encoder_last_hidden_state", None),
    )


def make_result(
    lm: LoadedModel,
    encoded: Encoded,
    text: str,
    attention: np.ndarray,
    *,
    engine: str,
    timings: dict[str, float],
    causal: bool,
    **fields: Any,
) -> AttentionResult:
    """The ``AttentionResult`` of an encoded text and its ``[L, H, T, T]`` attention.

    Args:
        lm: the model that ran.
        encoded: the text as ``encode`` gave it.
        text: the text as typed.
        attention: ``[L, H, T, T]`` on the CPU (copied to contiguous float32 if it is not).
        engine: the engine's name.
        timings: seconds per step (``load``, ``forward``, ...).
        causal: whether the model masks later tokens.
        **fields: further ``AttentionResult`` fields (``seed``, ``text_pair``, agreement, ...).
    """
    tokens = encoded.tokens
    return AttentionResult(
        text=text,
        tokens=list(tokens.strings),
        # float32, or the 16 bits a selection asked for (``attend(attention_dtype=...)``)
        attention=np.ascontiguousarray(
            attention, dtype=np.float16 if attention.dtype == np.float16 else np.float32
        ),
        offsets=list(tokens.offsets),
        special=list(tokens.special),
        punctuation=list(tokens.punctuation),
        word_ids=list(tokens.word_ids),
        model=lm.display_name,
        engine=engine,
        device=str(lm.device),
        num_parameters=lm.num_parameters,
        timings=timings,
        causal=causal,
        truncated_tokens=encoded.truncated,
        facts=lm.facts(),
        **fields,
    )

"""Engines: text -> AttentionResult, through the model's eager attention or through our module."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mhsa.engine.encoding import Encoded, check_text, encode
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.forward import ForwardPass, eager_forward, make_result, our_forward
from mhsa.engine.runs.generation import (
    MAX_NEW_TOKENS,
    Generation,
    generate,
    generate_ids,
    generation_encoded,
)
from mhsa.engine.runs.norms import weighted_by_norm
from mhsa.engine.runs.partial import LayerSink, selected_forward
from mhsa.engine.runs.query_keys import with_query_keys
from mhsa.engine.runs.selection import Selection, check_attention_budget, select
from mhsa.engine.runs.swap import our_blocks
from mhsa.errors import InputError
from mhsa.registry import lookup

__all__ = [
    "ENGINES",
    "ENGINE_DESCRIPTIONS",
    "ENGINE_LABELS",
    "ENGINE_SPECS",
    "MAX_NEW_TOKENS",
    "EngineSpec",
    "Generation",
    "attend",
    "attend_generated",
    "attend_layers",
    "engine_spec",
    "generate",
    "generate_ids",
    "model_selection",
]


@dataclass(frozen=True)
class EngineSpec:
    """One engine: how it computes attention, and how people see it named.

    Attributes:
        name: what ``attend(engine=...)``, the command line and links take.
        label: its short name for people (the app's sidebar).
        description: what it computes, for people (sidebar, docs, command line).
        our_module: every attention block runs as our ``MultiHeadSelfAttention`` (else the
            model's own eager attention runs).
        seeded: our module gets fresh (untrained) xavier weights from the seed instead of the
            block's own.
    """

    name: str
    label: str
    description: str
    our_module: bool
    seeded: bool = False

    @property
    def verifiable(self) -> bool:
        """Whether ``verify`` applies: our module with the model's weights, beside the model."""
        return self.our_module and not self.seeded


#: Every engine, by name, in the order the sidebar and the command line list them.
ENGINE_SPECS: Mapping[str, EngineSpec] = {
    spec.name: spec
    for spec in (
        EngineSpec(
            "transformers",
            label="Model's own attention",
            description="the model's own (eager) attention",
            our_module=False,
        ),
        EngineSpec(
            "mhsa",
            label="Model run through our MHSA module",
            description="the model run through our MultiHeadSelfAttention: every attention block "
            "swapped for our module with that block's weights; each layer's output feeds the next",
            our_module=True,
        ),
        EngineSpec(
            "mhsa-random",
            label="Model with untrained MHSA modules",
            description="the model with every attention block swapped for our module with fresh "
            "(untrained) xavier weights from the seed; embeddings, feed-forward layers and norms "
            "stay trained",
            our_module=True,
            seeded=True,
        ),
    )
}
#: The engines' names, and (for code written before ``ENGINE_SPECS``) their labels and
#: descriptions by name.
ENGINES = tuple(ENGINE_SPECS)
ENGINE_LABELS = {name: spec.label for name, spec in ENGINE_SPECS.items()}
ENGINE_DESCRIPTIONS = {name: spec.description for name, spec in ENGINE_SPECS.items()}


def engine_spec(name: str) -> EngineSpec:
    """The engine called ``name``.

    Raises:
        InputError: there is no such engine; the message lists them.
    """
    return lookup(ENGINE_SPECS, name, "engine")


def _checked_spec(engine: str, verify: bool) -> EngineSpec:
    """``engine``'s spec, checked against ``verify``.

    Raises:
        InputError: no such engine, or ``verify`` asked of an engine it does not apply to.
    """
    spec = engine_spec(engine)
    if verify and not spec.verifiable:
        raise InputError("verify compares our module with the model's own: use engine='mhsa'.")
    return spec


def _max_abs_diffs(ours: Any, theirs: Any) -> list[float]:
    """Largest |ours - theirs| of each layer (torch tensors or numpy arrays, layer first)."""
    return [float(abs(o - t).max()) for o, t in zip(ours, theirs, strict=True)]


def _hidden_diff(ours: torch.Tensor | None, theirs: torch.Tensor | None) -> float | None:
    if ours is None or theirs is None:
        return None
    return float((ours - theirs).abs().max())


def _agreement(ours: ForwardPass, theirs: ForwardPass) -> dict[str, Any]:
    """Largest |ours - theirs| per layer (one layer at a time) and of the final hidden state;
    encoder-decoder models: also per decoder and cross-attention layer and of the encoder's
    final hidden state (``max_abs_diff`` is then the largest of every attention)."""
    per_layer = _max_abs_diffs(ours.attention, theirs.attention)
    fields: dict[str, Any] = {
        "max_abs_diff": max(per_layer),
        "layer_max_abs_diff": per_layer,
        "hidden_max_abs_diff": _hidden_diff(ours.last_hidden, theirs.last_hidden),
    }
    if "cross_attention" in ours.extra:
        for kind in ("decoder", "cross"):
            diffs = _max_abs_diffs(
                ours.extra[f"{kind}_attention"], theirs.extra[f"{kind}_attention"]
            )
            fields[f"{kind}_layer_max_abs_diff"] = diffs
            fields["max_abs_diff"] = max(fields["max_abs_diff"], *diffs)
        fields["encoder_hidden_max_abs_diff"] = _hidden_diff(
            ours.encoder_hidden, theirs.encoder_hidden
        )
    return fields


def _run_engine(
    lm: LoadedModel,
    spec: EngineSpec,
    inputs: dict[str, torch.Tensor],
    *,
    seed: int,
    verify: bool,
    norms: bool,
    timings: dict[str, float],
) -> tuple[ForwardPass, dict[str, Any]]:
    """One sentence through ``spec``'s engine (``norms``: with the weights weighted by value
    norm), and (``verify``) its agreement with the model's own forward; the seconds each took
    go into ``timings``. Caller holds the model's lock."""
    if not spec.our_module:
        start = time.perf_counter()
        forward = eager_forward(lm, inputs, norms=norms)
        timings["forward"] = time.perf_counter() - start
        return forward, {}
    blocks = our_blocks(lm, seed if spec.seeded else None)  # built once per model, not timed
    start = time.perf_counter()
    forward = our_forward(lm, inputs, blocks, norms=norms)
    timings["forward"] = time.perf_counter() - start
    if not verify:
        return forward, {}
    start = time.perf_counter()
    agreement = _agreement(forward, eager_forward(lm, inputs))
    timings["verify"] = time.perf_counter() - start
    return forward, agreement


def attend(
    text: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    engine: str = "transformers",
    device: str = "auto",
    max_tokens: int | None = None,
    text_pair: str | None = None,
    seed: int = 0,
    verify: bool = False,
    norms: bool = False,
    layers: str | int | Sequence[int] | None = None,
    heads: str | int | Sequence[int] | None = None,
    attention_dtype: str = "float32",
    max_attention_mb: float | None = None,
    qk: bool = False,
) -> AttentionResult:
    """Per-head attention of a text.

    Args:
        text: the sentence.
        model: ``"default"`` (embedded all-MiniLM-L6-v2), a model id or folder, or a model
            already loaded with ``load_model`` (then ``device`` is the model's own).
        engine: ``"transformers"`` (the model's eager attention), ``"mhsa"`` (the model run
            through our module: every attention block swapped for ours with its weights) or
            ``"mhsa-random"`` (every attention block swapped for ours with fresh xavier weights
            from ``seed``). See ``ENGINE_SPECS``.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"mps"``.
        max_tokens: truncate to this many tokens (the result reports how many were dropped);
            without it a text over the model's limit is an error.
        text_pair: second segment (encoders) or decoder text (encoder-decoder models).
        seed: seed of the ``mhsa-random`` weights.
        verify: ``mhsa`` engine only: also run the model's own forward and report, per layer,
            the largest difference of the attention weights and of the final hidden state. Off,
            the model's own attention never runs.
        norms: also compute ``AttentionResult.norms``, the weights weighted by value norm
            (Kobayashi et al. 2020): ``alpha_ij * ||f_h(x_j)||``, ``f_h(x) = (x W_V^h + b_V^h)
            W_O^h`` (the output bias left out). With the ``mhsa`` engines the norms come from the
            per-head V our module computes (an observer on every block); with ``transformers``
            from the V each of the model's blocks computes (a forward hook on its value
            projection); ``W_O`` from our module of each block
            (``mhsa.engine.runs.swap.our_blocks``: the
            model's weights), so norms need a model our module can load
            (``mhsa.engine.runs.norms``).
        layers: materialise these layers only (``2``, ``[0, 5]``, ``"0-3,8"``; None: all).
            Every other block runs a fused kernel and keeps nothing (``mhsa.engine.runs.partial``);
            the
            result's ``layer_ids`` say which were kept and its labels stay ``L{l}H{h}`` of the
            model's layers. Encoders and decoders (not encoder-decoders).
        heads: keep these heads of each selected layer (as ``layers``; None: all).
        attention_dtype: ``float32``, ``float16`` or ``bfloat16`` (rounded to bfloat16, held
            in a float16 array: numpy has none): the dtype the weights are stored in.
            Statistics sum them in float64 whatever it is (README: the error measured).
        max_attention_mb: refuse, before the forward pass, a selection that would keep more
            megabytes of attention (``MHSA_MAX_ATTENTION_MB`` on a server); None: no budget.
        qk: also keep each held head's query and key vectors (``AttentionResult.q``, ``k``,
            ``qk_scale``: ``mhsa.engine.runs.query_keys``) for the neuron view
            (``result.show("neuron")``); one more pass through our module. Encoders and
            decoders whose scores are ``q . k`` scaled.

    Raises:
        InputError, ModelLoadError, UnsupportedModelError: with a message saying what to do
            (a selection out of range names the model's layers and heads).
    """
    spec = _checked_spec(engine, verify)
    text = check_text(text)
    if text_pair is not None:
        text_pair = check_text(text_pair, "second text")
    lm = resolve_model(model, device)
    selection = model_selection(lm, layers, heads, attention_dtype)
    with lm.lock:
        encoded = encode(lm, text, text_pair, max_tokens)
    if max_attention_mb is not None:
        n = len(encoded.tokens.strings)
        check_attention_budget(selection or _whole(lm, attention_dtype), n, n, max_attention_mb)
    return _attend_encoded(
        lm,
        spec,
        encoded,
        text,
        seed=seed,
        verify=verify,
        norms=norms,
        text_pair=text_pair,
        selection=selection,
        qk=qk,
    )


def model_selection(
    lm: LoadedModel,
    layers: str | int | Sequence[int] | None,
    heads: str | int | Sequence[int] | None,
    attention_dtype: str = "float32",
) -> Selection | None:
    """The checked selection of ``lm``'s layers and heads, or None for the whole float32
    attention (the ordinary path, unchanged).

    Raises:
        InputError: out of range or empty (naming the model's sizes), or an unknown dtype.
    """
    if layers is None and heads is None and attention_dtype == "float32":
        return None
    facts = lm.facts()
    if not facts["layers"] or not facts["heads"]:
        raise InputError(f"{lm.display_name!r} does not say how many layers and heads it has.")
    selection = select(facts["layers"], facts["heads"], layers, heads, attention_dtype)
    return None if selection.everything and attention_dtype == "float32" else selection


def _whole(lm: LoadedModel, attention_dtype: str) -> Selection:
    """Every layer and head of ``lm`` (for the budget of a whole result)."""
    facts = lm.facts()
    return select(facts["layers"] or 0, facts["heads"] or 0, None, None, attention_dtype)


def attend_layers(
    text: str,
    sink: Callable[[AttentionResult], None],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    engine: str = "transformers",
    device: str = "auto",
    max_tokens: int | None = None,
    layers: str | int | Sequence[int] | None = None,
    heads: str | int | Sequence[int] | None = None,
    attention_dtype: str = "float32",
    seed: int = 0,
) -> AttentionResult:
    """``attend`` streamed layer by layer: each selected layer goes to ``sink`` as a result of
    its own (one layer, ``layer_ids == [layer]``, the selected heads) as soon as it is
    computed, and nothing is kept, so that the peak is one layer's attention
    (``mhsa.analysis.stream``
    computes statistics this way; the command line writes ``.npz`` files layer by layer).

    Returns:
        The result's every field but the attention: ``attention`` is ``[0, heads, n, n]``
        (``layer_ids`` empty: the sink received the layers), ``head_ids`` the heads.

    Raises:
        InputError, ModelLoadError, UnsupportedModelError: as ``attend``.
    """
    spec = _checked_spec(engine, False)
    text = check_text(text)
    lm = resolve_model(model, device)
    facts = lm.facts()
    selection = select(facts["layers"] or 0, facts["heads"] or 0, layers, heads, attention_dtype)
    with lm.lock:
        encoded = encode(lm, text, None, max_tokens)
    n = len(encoded.tokens.strings)
    empty = np.empty((0, len(selection.heads), n, n), dtype=np.float32)
    header = make_result(
        lm,
        encoded,
        text,
        empty,
        engine=spec.name,
        timings={},
        causal=False,
        layer_ids=[],
        head_ids=selection.head_ids,
        attention_dtype=selection.dtype,
    )

    def one_layer(layer: int, heads_of_layer: np.ndarray) -> None:
        causal = n > 1 and not np.triu(heads_of_layer[0], 1).any()  # nothing on later keys
        sink(
            dataclasses.replace(
                header, attention=heads_of_layer[None], layer_ids=[layer], causal=causal
            )
        )

    done = _attend_encoded(
        lm,
        spec,
        encoded,
        text,
        seed=seed,
        verify=False,
        norms=False,
        selection=selection,
        sink=one_layer,
    )
    return dataclasses.replace(header, timings=done.timings, causal=done.causal)


def attend_generated(
    generation: Generation,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    engine: str = "transformers",
    device: str = "auto",
    max_tokens: int | None = None,
    seed: int = 0,
    verify: bool = False,
    norms: bool = False,
) -> AttentionResult:
    """Per-head attention over exactly the ids a model generated (``generate_ids``): the
    prompt's encoding and the ids the model chose, never the text tokenized again. The result's
    text is ``generation.text``, its tokens ``convert_ids_to_tokens`` of the ids, and the
    generated ones are flagged (``prompt_chars``, ``generated``); each generated token's span is
    what decoding the continuation up to it adds to the text (``generation_encoded``). An
    encoder-decoder's generation: the encoder over the prompt, the decoder over exactly the ids
    it chose (``decoder_tokens``, the start token first; ``text_pair`` the target decoded).

    Args:
        generation: what ``generate_ids`` returned for this model.
        model, engine, device, seed, verify, norms: as for ``attend``.
        max_tokens: keep the first this many tokens (the result reports how many were dropped).

    Raises:
        InputError, ModelLoadError, UnsupportedModelError: with a message saying what to do.
    """
    spec = _checked_spec(engine, verify)
    lm = resolve_model(model, device)
    with lm.lock:
        encoded = generation_encoded(lm, generation, max_tokens)
    if generation.decoder_ids is not None:  # the encoder read the prompt; the decoder wrote
        return _attend_encoded(
            lm,
            spec,
            encoded,
            generation.text,
            seed=seed,
            verify=verify,
            norms=norms,
            text_pair=generation.target,
        )
    result = _attend_encoded(
        lm, spec, encoded, generation.text, seed=seed, verify=verify, norms=norms
    )
    return dataclasses.replace(result, prompt_chars=len(generation.prompt))


def _attend_encoded(
    lm: LoadedModel,
    spec: EngineSpec,
    encoded: Encoded,
    text: str,
    *,
    seed: int,
    verify: bool,
    norms: bool,
    text_pair: str | None = None,
    selection: Selection | None = None,
    sink: LayerSink | None = None,
    qk: bool = False,
) -> AttentionResult:
    """``attend`` of a text already encoded."""
    if selection is not None:
        result = _attend_selected(
            lm, spec, encoded, text, selection, seed=seed, verify=verify, norms=norms, sink=sink
        )
        return _query_keys(lm, spec, encoded, result, seed) if qk else result
    timings = {"load": lm.load_seconds}
    with lm.lock, torch.inference_mode():
        forward, agreement = _run_engine(
            lm,
            spec,
            encoded.inputs_on(lm.device),
            seed=seed,
            verify=verify,
            norms=norms,
            timings=timings,
        )
        array = forward.attention.float().cpu().numpy()  # the one move to the CPU
        per_key = None if forward.value_norms is None else forward.value_norms.float().cpu()
    result = _engine_result(
        lm,
        spec,
        encoded,
        text,
        array,
        timings=timings,
        causal=forward.causal,
        seed=seed,
        value_norms=None if per_key is None else per_key.numpy(),
        text_pair=text_pair,
        **agreement,
        **_extra_fields(lm, encoded, forward),
    )
    return _query_keys(lm, spec, encoded, result, seed) if qk else result


def _query_keys(
    lm: LoadedModel, spec: EngineSpec, encoded: Encoded, result: AttentionResult, seed: int
) -> AttentionResult:
    """``result`` with its heads' query and key vectors (``attend(qk=True)``)."""
    with lm.lock:
        inputs = encoded.inputs_on(lm.device)
        return with_query_keys(lm, result, inputs, seed if spec.seeded else None)


def _engine_result(
    lm: LoadedModel,
    spec: EngineSpec,
    encoded: Encoded,
    text: str,
    array: np.ndarray,
    *,
    timings: dict[str, float],
    causal: bool,
    seed: int,
    value_norms: np.ndarray | None,
    **fields: Any,
) -> AttentionResult:
    """The result of one engine run (whole or selected): its attention ``array`` on the CPU,
    the seed where the engine is seeded, and the norm-weighted attention where the run gave
    value norms (``weighted_by_norm``); ``fields`` as ``make_result``'s."""
    return make_result(
        lm,
        encoded,
        text,
        array,
        engine=spec.name,
        timings=timings,
        causal=causal,
        seed=seed if spec.seeded else None,
        norms=None if value_norms is None else weighted_by_norm(array, value_norms),
        **fields,
    )


def _attend_selected(
    lm: LoadedModel,
    spec: EngineSpec,
    encoded: Encoded,
    text: str,
    selection: Selection,
    *,
    seed: int,
    verify: bool,
    norms: bool,
    sink: LayerSink | None,
) -> AttentionResult:
    """``attend`` of the selected layers and heads only (``mhsa.engine.runs.partial``)."""
    timings = {"load": lm.load_seconds}
    agreement: dict[str, Any] = {}
    with lm.lock, torch.inference_mode():
        inputs = encoded.inputs_on(lm.device)
        start = time.perf_counter()
        forward = selected_forward(
            lm,
            inputs,
            selection,
            our_module=spec.our_module,
            seed=seed if spec.seeded else None,
            norms=norms,
            sink=sink,
        )
        timings["forward"] = time.perf_counter() - start
        if verify:
            start = time.perf_counter()
            reference = dataclasses.replace(selection, dtype="float32")
            theirs = selected_forward(lm, inputs, reference, our_module=False, eager=True)
            per_layer = _max_abs_diffs(forward.attention.astype(np.float32), theirs.attention)
            agreement = {"max_abs_diff": max(per_layer), "layer_max_abs_diff": per_layer}
            timings["verify"] = time.perf_counter() - start
    return _engine_result(
        lm,
        spec,
        encoded,
        text,
        forward.attention,
        timings=timings,
        causal=forward.causal,
        seed=seed,
        value_norms=forward.value_norms,
        layer_ids=[] if sink is not None else selection.layer_ids,
        head_ids=selection.head_ids,
        attention_dtype=selection.dtype,
        **agreement,
    )


def _extra_fields(lm: LoadedModel, encoded: Encoded, forward: ForwardPass) -> dict[str, Any]:
    """The result's fields beside the self-attention (encoder-decoder models: the decoder's
    tokens, its attention and the cross attention)."""
    extra = dict(forward.extra)
    if lm.is_encoder_decoder:
        specials = set(lm.tokenizer.all_special_tokens)
        extra["decoder_tokens"] = encoded.decoder_tokens
        extra["decoder_special"] = [t in specials for t in encoded.decoder_tokens or []]
    return extra

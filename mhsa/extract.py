"""Engines: text -> AttentionResult, through the model's own attention or through our module."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mhsa.adapters import OwnBlock, Run, own_blocks, run_own_forward
from mhsa.errors import InputError, ModelLoadError
from mhsa.models import DEFAULT_MODEL, LoadedModel, get_model
from mhsa.result import AttentionResult
from mhsa.tokens import Tokens

__all__ = [
    "ENGINES",
    "ENGINE_DESCRIPTIONS",
    "ENGINE_LABELS",
    "MAX_NEW_TOKENS",
    "attend",
    "generate",
]

#: most tokens ``generate`` adds (attention over prompt + generation stays explorable)
MAX_NEW_TOKENS = 128

ENGINES = ("transformers", "mhsa", "mhsa-random")
#: Each engine's short name for people (the app's sidebar and figure titles).
ENGINE_LABELS = {
    "transformers": "Model's own attention",
    "mhsa": "Model run through our MHSA module",
    "mhsa-random": "Model with untrained MHSA modules",
}
#: What each engine computes, for people (sidebar, docs, command line).
ENGINE_DESCRIPTIONS = {
    "transformers": "the model's own (eager) attention",
    "mhsa": "the model run through our MultiHeadSelfAttention: every attention block swapped for "
    "our module with that block's weights; each layer's output feeds the next",
    "mhsa-random": "the model with every attention block swapped for our module with fresh "
    "(untrained) xavier weights from the seed; embeddings, feed-forward layers and norms stay "
    "trained",
}


@dataclass(frozen=True)
class _Encoded:
    inputs: dict[str, torch.Tensor]
    tokens: Tokens
    truncated: int
    decoder_tokens: list[str] | None


def _check_text(text: object, what: str = "text") -> str:
    if not isinstance(text, str):
        raise InputError(f"The {what} must be a string, got {type(text).__name__}.")
    if not text.strip():
        raise InputError(f"The {what} is empty: type a sentence.")
    return text


#: how every text is tokenized (one text or a corpus): the tokens the tokenizer adds marked;
#: "[CLS]" typed by a user is text, not a control token
_TOKENIZE: dict[str, Any] = {"return_special_tokens_mask": True, "split_special_tokens": True}


def _no_tokens() -> InputError:
    return InputError("The text gives no tokens for this model: type a sentence.")


def _too_long(lm: LoadedModel, n: int, limit: int) -> InputError:
    return InputError(
        f"The text is {n} tokens long; {lm.display_name} accepts at most {limit}. "
        f"Shorten it, or set max_tokens to truncate."
    )


def _encode_many(
    lm: LoadedModel, texts: Sequence[str], max_tokens: int | None = None
) -> list[_Encoded | InputError]:
    """``_encode(lm, text, None, max_tokens)`` of every text, or the InputError it raises, in one
    call of a fast tokenizer (a corpus: the per-call overhead of the tokenizer's Python side,
    0.6 ms a sentence, paid once). Truncation, other tokenizers and encoder-decoder models: one
    text at a time."""
    tok = lm.tokenizer
    if max_tokens is not None or lm.is_encoder_decoder or not getattr(tok, "is_fast", False):
        out: list[_Encoded | InputError] = []
        for text in texts:
            try:
                out.append(_encode(lm, text, None, max_tokens))
            except InputError as e:
                out.append(e)
        return out
    enc = tok(list(texts), truncation=False, return_offsets_mapping=True, **_TOKENIZE)
    keys = [k for k in enc if k not in ("offset_mapping", "special_tokens_mask")]
    out = []
    for i, ids in enumerate(enc["input_ids"]):
        n = len(ids)
        if lm.max_positions is not None and n > lm.max_positions:
            out.append(_too_long(lm, n, lm.max_positions))
        elif n == 0:
            out.append(_no_tokens())
        else:
            inputs = {k: torch.tensor([enc[k][i]]) for k in keys}
            out.append(_Encoded(inputs, Tokens.from_encoding(tok, enc, ids, i), 0, None))
    return out


def _encode(lm: LoadedModel, text: str, text_pair: str | None, max_tokens: int | None) -> _Encoded:
    tok = lm.tokenizer
    fast = bool(getattr(tok, "is_fast", False))
    limit = lm.max_positions
    if max_tokens is not None:
        special = tok.num_special_tokens_to_add(
            pair=text_pair is not None and not lm.is_encoder_decoder
        )
        if max_tokens < special + 1:
            raise InputError(
                f"max_tokens must be at least {special + 1}: {lm.display_name} adds {special} "
                f"special tokens to every text, got {max_tokens}."
            )
        limit = max_tokens if limit is None else min(limit, max_tokens)
    pair = None if lm.is_encoder_decoder else text_pair
    kwargs: dict[str, Any] = {"return_tensors": "pt", "return_offsets_mapping": fast, **_TOKENIZE}
    enc = tok(text, pair, truncation=False, **kwargs)
    n = enc["input_ids"].shape[1]
    truncated = 0
    if limit is not None and n > limit:
        if max_tokens is None:
            raise _too_long(lm, n, limit)
        enc = tok(text, pair, truncation=True, max_length=limit, **kwargs)
        truncated = n - enc["input_ids"].shape[1]
        if enc["input_ids"].shape[1] > limit:  # the tokenizer could not cut it (pair too long)
            raise InputError(
                f"The text cannot be cut to {limit} tokens; shorten it (or the second text)."
            )
    if n == 0 or enc["input_ids"].shape[1] == 0:
        raise _no_tokens()
    ids = enc["input_ids"][0].tolist()
    tokens = Tokens.from_encoding(tok, enc, ids)
    inputs = {k: v for k, v in enc.items() if k not in ("offset_mapping", "special_tokens_mask")}
    decoder_tokens = None
    if lm.is_encoder_decoder:
        dec = tok(
            text_pair if text_pair is not None else text,
            return_tensors="pt",
            truncation=limit is not None,
            max_length=limit,
        )
        inputs["decoder_input_ids"] = dec["input_ids"]
        decoder_tokens = tok.convert_ids_to_tokens(dec["input_ids"][0].tolist())
    return _Encoded(inputs, tokens, truncated, decoder_tokens)


def _checked(attentions: Any, what: str, name: str) -> tuple[torch.Tensor, ...]:
    """The model's per-layer attentions, or a clear error when it gave none."""
    if not attentions or any(a is None for a in attentions):
        raise ModelLoadError(
            f"Model {name!r} returned no {what}-attention weights: its architecture does not "
            f"expose attention with eager attention. Choose a BERT-, GPT-2- or T5/BART-style model."
        )
    return tuple(attentions)


def _to_numpy(attentions: tuple[torch.Tensor, ...]) -> np.ndarray:
    return torch.stack([a[0] for a in attentions]).float().cpu().numpy()  # (L, H, T, S)


def _is_causal(attentions: Any) -> bool:
    """A model masks later tokens when its first head has no weight above the diagonal."""
    first = attentions[0][0, 0]  # (T, S)
    return first.shape[-1] > 1 and not bool(first.triu(1).any())


@dataclass(frozen=True)
class _Forward:
    attention: torch.Tensor  # (L, H, T, T)
    causal: bool
    extra: dict[str, Any]
    last_hidden: torch.Tensor | None = None


def _transformers_forward(lm: LoadedModel, inputs: dict[str, torch.Tensor]) -> _Forward:
    """The model's own eager attention, every layer."""
    name = lm.display_name
    outputs = lm.model(**inputs, output_attentions=True, return_dict=True)
    extra: dict[str, Any] = {}
    if lm.is_encoder_decoder:
        theirs = _checked(getattr(outputs, "encoder_attentions", None), "encoder", name)
        extra = {
            "decoder_attention": _to_numpy(
                _checked(getattr(outputs, "decoder_attentions", None), "decoder", name)
            ),
            "cross_attention": _to_numpy(
                _checked(getattr(outputs, "cross_attentions", None), "cross", name)
            ),
        }
    else:
        theirs = _checked(getattr(outputs, "attentions", None), "self", name)
    hidden = getattr(outputs, "last_hidden_state", None)
    return _Forward(torch.stack([a[0] for a in theirs]), _is_causal(theirs), extra, hidden)


class _StopPass(Exception):
    """Raised by a forward hook to end a pass once the last attention weights are in (the rest
    of the model changes none): our blocks here, the model's own modules in ``mhsa.corpus``."""


def _stop_pass(_module: Any, _args: Any, _output: Any) -> None:
    raise _StopPass


def _own_attention(
    lm: LoadedModel,
    blocks: list[OwnBlock],
    inputs: dict[str, torch.Tensor],
    gates: dict[int, torch.Tensor] | None = None,
    *,
    whole: bool = True,
) -> tuple[torch.Tensor, Any]:
    """The whole model with every attention block swapped for ours (head ``gates`` optional):
    every layer's weights collected into one preallocated ``[L, B, H, T, T]`` array, and the
    model's outputs. ``whole=False``: the pass stops once the last block has written its
    weights (the feed-forward block above it and any head on top change no weight), and the
    outputs are None."""
    b, n = inputs["input_ids"].shape
    first = blocks[0].ours
    sink = first.qkv.weight.new_empty(len(blocks), b, first.num_heads, n, n)
    run = Run(gates=gates or {}, sink=sink)
    if whole:
        return sink, run_own_forward(lm, blocks, run, inputs)
    handle = blocks[-1].register_forward_hook(_stop_pass)
    try:
        run_own_forward(lm, blocks, run, inputs)
    except _StopPass:
        pass
    finally:
        handle.remove()
    return sink, None


def _own_forward(
    lm: LoadedModel, inputs: dict[str, torch.Tensor], blocks: list[OwnBlock]
) -> _Forward:
    """The whole model with every attention block swapped for ours (batch 1)."""
    sink, outputs = _own_attention(lm, blocks, inputs)
    hidden = getattr(outputs, "last_hidden_state", None)
    return _Forward(sink[:, 0], blocks[0].causal, {}, hidden)


def _agreement(ours: _Forward, theirs: _Forward) -> dict[str, Any]:
    """Largest |ours - theirs| per layer (one layer at a time) and of the final hidden state."""
    per_layer = [
        float((o - t).abs().max()) for o, t in zip(ours.attention, theirs.attention, strict=True)
    ]
    hidden = None
    if ours.last_hidden is not None and theirs.last_hidden is not None:
        hidden = float((ours.last_hidden - theirs.last_hidden).abs().max())
    return {
        "max_abs_diff": max(per_layer),
        "layer_max_abs_diff": per_layer,
        "hidden_max_abs_diff": hidden,
    }


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
) -> AttentionResult:
    """Per-head attention of a text.

    Args:
        text: the sentence.
        model: ``"default"`` (embedded all-MiniLM-L6-v2), a model id or folder, or a model
            already loaded with ``load_model`` (then ``device`` is the model's own).
        engine: ``"transformers"`` (the model's eager attention), ``"mhsa"`` (the model run
            through our module: every attention block swapped for ours with its weights) or
            ``"mhsa-random"`` (every attention block swapped for ours with fresh xavier weights
            from ``seed``). See ``ENGINE_DESCRIPTIONS``.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"mps"``.
        max_tokens: truncate to this many tokens (the result reports how many were dropped);
            without it a text over the model's limit is an error.
        text_pair: second segment (encoders) or decoder text (encoder-decoder models).
        seed: seed of the ``mhsa-random`` weights.
        verify: ``mhsa`` engine only: also run the model's own forward and report, per layer,
            the largest difference of the attention weights and of the final hidden state. Off,
            the model's own attention never runs.

    Raises:
        InputError, ModelLoadError, UnsupportedModelError: with a message saying what to do.
    """
    if engine not in ENGINES:
        raise InputError(f"Unknown engine {engine!r}: choose one of {', '.join(ENGINES)}.")
    if verify and engine != "mhsa":
        raise InputError("verify compares our module with the model's own: use engine='mhsa'.")
    text = _check_text(text)
    if text_pair is not None:
        text_pair = _check_text(text_pair, "second text")
    lm = model if isinstance(model, LoadedModel) else get_model(model or DEFAULT_MODEL, device)
    timings = {"load": lm.load_seconds}
    with lm.lock, torch.inference_mode():
        encoded = _encode(lm, text, text_pair, max_tokens)
        inputs = {k: v.to(lm.device) for k, v in encoded.inputs.items()}
        agreement: dict[str, Any] = {}
        if engine == "transformers":
            start = time.perf_counter()
            result = _transformers_forward(lm, inputs)
            timings["forward"] = time.perf_counter() - start
        else:
            blocks = own_blocks(lm, seed if engine == "mhsa-random" else None)
            start = time.perf_counter()
            result = _own_forward(lm, inputs, blocks)
            timings["forward"] = time.perf_counter() - start
            if verify:
                start = time.perf_counter()
                agreement = _agreement(result, _transformers_forward(lm, inputs))
                timings["verify"] = time.perf_counter() - start
        array = result.attention.float().cpu().numpy()  # the one move to the CPU
    extra = dict(result.extra)
    if lm.is_encoder_decoder:
        extra["decoder_tokens"] = encoded.decoder_tokens
    return _make_result(
        lm,
        encoded,
        text,
        array,
        engine=engine,
        timings=timings,
        causal=result.causal,
        seed=seed if engine == "mhsa-random" else None,
        text_pair=text_pair,
        **agreement,
        **extra,
    )


def _make_result(
    lm: LoadedModel,
    encoded: _Encoded,
    text: str,
    attention: np.ndarray,
    *,
    engine: str,
    timings: dict[str, float],
    causal: bool,
    **fields: Any,
) -> AttentionResult:
    """The ``AttentionResult`` of an encoded text and its ``[L, H, T, T]`` attention."""
    tokens = encoded.tokens
    return AttentionResult(
        text=text,
        tokens=list(tokens.strings),
        attention=np.ascontiguousarray(attention, dtype=np.float32),
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


def generate(
    text: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    max_new_tokens: int = 20,
    sample: bool = False,
    seed: int = 0,
    device: str = "auto",
) -> str:
    """The prompt ``text`` followed by what a causal language model writes next: greedy, or
    sampled (temperature 1, the whole vocabulary) from ``seed``. The prompt is kept verbatim
    (the continuation is decoded on its own and appended), so ``len(text)`` is where the
    generated characters begin; attend to the returned text to see attention over both.

    Raises:
        InputError: the model has no causal language-model head, or the numbers are off.
    """
    text = _check_text(text)
    lm = model if isinstance(model, LoadedModel) else get_model(model or DEFAULT_MODEL, device)
    if lm.lm_head != "causal":
        raise InputError(
            f"{lm.display_name} has no next-token (causal language-model) head, so it cannot "
            "generate text: load a causal LM checkpoint (GPT-2, Llama, Qwen2, ...)."
        )
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise InputError(f"Generate between 1 and {MAX_NEW_TOKENS} tokens, not {max_new_tokens}.")
    tok = lm.tokenizer
    with lm.lock, torch.inference_mode():
        encoded = _encode(lm, text, None, None)
        inputs = {k: v.to(lm.device) for k, v in encoded.inputs.items()}
        room = (lm.max_positions or 10**9) - inputs["input_ids"].shape[1]
        if room < 1:
            raise InputError("The prompt already fills the model's context: shorten it.")
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        how: dict[str, Any] = {"do_sample": False}
        if sample:
            how = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0}
        devices = [lm.device] if lm.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # the caller's random state is untouched
            torch.manual_seed(seed)
            out = lm.head_model.generate(
                **inputs, max_new_tokens=min(max_new_tokens, room), pad_token_id=pad, **how
            )
    new = out[0, inputs["input_ids"].shape[1] :].tolist()
    return text + tok.decode(new, skip_special_tokens=True)

"""Engines: text -> AttentionResult, through the model's own attention or through our module."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from mhsa.attention import MultiHeadSelfAttention
from mhsa.errors import InputError, ModelLoadError, UnsupportedModelError
from mhsa.models import DEFAULT_MODEL, LoadedModel, get_model
from mhsa.result import AttentionResult
from mhsa.tokens import Tokens

__all__ = ["ENGINES", "attend", "attention_layers"]

ENGINES = ("transformers", "mhsa", "mhsa-random")

Loader = Callable[[nn.Module], MultiHeadSelfAttention]

# How to recognise an attention block our module can load, and the loader for it. Structural
# tests rather than class names: RoBERTa, ELECTRA, XLM-R... reuse BERT's layout under other names.
_LOADERS: tuple[tuple[str, Callable[[nn.Module], bool], Loader], ...] = (
    (
        "BERT family (query/key/value + output.dense)",
        lambda m: hasattr(m, "self") and hasattr(m.self, "query") and hasattr(m, "output"),
        MultiHeadSelfAttention.from_bert,
    ),
    (
        "GPT-2 family (c_attn/c_proj)",
        lambda m: (
            hasattr(m, "c_attn")
            and hasattr(m, "c_proj")
            and not getattr(m, "is_cross_attention", False)
        ),
        MultiHeadSelfAttention.from_gpt2,
    ),
    (
        "DistilBERT (q_lin/k_lin/v_lin/out_lin)",
        lambda m: hasattr(m, "q_lin") and hasattr(m, "out_lin"),
        MultiHeadSelfAttention.from_distilbert,
    ),
)
_MAX_SEEDS_CACHED = 4
SUPPORTED_FOR_MHSA = ", ".join(name for name, _, _ in _LOADERS)


@dataclass(frozen=True)
class _Encoded:
    inputs: dict[str, torch.Tensor]
    tokens: Tokens
    truncated: int
    decoder_tokens: list[str] | None


def attention_layers(model: nn.Module) -> list[tuple[nn.Module, Loader]]:
    """The self-attention blocks of a model our module can load, in layer order."""
    found = []
    for module in model.modules():
        for _, matches, loader in _LOADERS:
            if matches(module):
                found.append((module, loader))
                break
    return found


def _check_text(text: object, what: str = "text") -> str:
    if not isinstance(text, str):
        raise InputError(f"The {what} must be a string, got {type(text).__name__}.")
    if not text.strip():
        raise InputError(f"The {what} is empty: type a sentence.")
    return text


def _encode(lm: LoadedModel, text: str, text_pair: str | None, max_tokens: int | None) -> _Encoded:
    tok = lm.tokenizer
    fast = bool(getattr(tok, "is_fast", False))
    limit = lm.max_positions
    if max_tokens is not None:
        if max_tokens < 1:
            raise InputError(f"max_tokens must be at least 1, got {max_tokens}.")
        limit = max_tokens if limit is None else min(limit, max_tokens)
    pair = None if lm.is_encoder_decoder else text_pair
    kwargs: dict[str, Any] = {
        "return_tensors": "pt",
        "return_offsets_mapping": fast,
        "return_special_tokens_mask": True,
        "split_special_tokens": True,  # "[CLS]" typed by a user is text, not a control token
    }
    enc = tok(text, pair, truncation=False, **kwargs)
    n = enc["input_ids"].shape[1]
    truncated = 0
    if limit is not None and n > limit:
        if max_tokens is None:
            raise InputError(
                f"The text is {n} tokens long; {lm.display_name} accepts at most {limit}. "
                f"Shorten it, or set max_tokens to truncate."
            )
        enc = tok(text, pair, truncation=True, max_length=limit, **kwargs)
        truncated = n - enc["input_ids"].shape[1]
    if n == 0 or enc["input_ids"].shape[1] == 0:
        raise InputError("The text gives no tokens for this model: type a sentence.")
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


@contextmanager
def _capture_inputs(modules: list[nn.Module]):
    """Record the hidden states entering each attention block during one forward pass."""
    captured: list[torch.Tensor] = []

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states", kwargs.get("query"))
        captured.append(hidden.detach())

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()


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


def _own_modules(
    lm: LoadedModel, layers: list[tuple[nn.Module, Loader]], seed: int | None
) -> list[MultiHeadSelfAttention]:
    """Our module per layer: with the layer's weights, or fresh xavier weights from ``seed``.

    Built once per model (and seed) and kept in ``lm.cache``; callers hold ``lm.lock``.
    """
    key = ("own-modules", seed)
    if key not in lm.cache:
        if seed is None:
            modules = [loader(module).eval() for module, loader in layers]
        else:  # the same shapes as the pretrained layers (built once, cached above)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                modules = [
                    MultiHeadSelfAttention(m.d_model, m.num_heads).to(lm.device).eval()
                    for m in _own_modules(lm, layers, None)
                ]
        seeds = [k for k in lm.cache if k[0] == "own-modules" and k[1] is not None]
        if len(seeds) >= _MAX_SEEDS_CACHED:
            del lm.cache[seeds[0]]  # oldest random seed first: the cache stays bounded
        lm.cache[key] = modules
    return lm.cache[key]


def _own_module_attention(
    modules: list[MultiHeadSelfAttention],
    hidden: list[torch.Tensor],
    padding: torch.Tensor | None,
    *,
    causal: bool,
) -> torch.Tensor:
    """Our module's per-head weights for every layer, each fed that layer's input."""
    n = hidden[0].shape[1]
    heads = modules[0].num_heads
    out = hidden[0].new_empty(len(modules), 1, heads, n, n)  # (L, B=1, H, T, T)
    if padding is not None and bool(padding.all()):
        padding = None  # nothing to mask: skip building and applying a mask
    for layer, (ours, h) in enumerate(zip(modules, hidden, strict=True)):
        ours.to(dtype=h.dtype).attention_weights(
            h, attention_mask=padding, is_causal=causal, out=out[layer]
        )
    return out[:, 0]  # (L, H, T, T)


def _max_abs_diff(ours: torch.Tensor, theirs: Any) -> float:
    """Largest |ours - theirs| over all layers, one layer at a time (no full-size temporary)."""
    return max(float((ours[i] - t[0]).abs_().max()) for i, t in enumerate(theirs))


def attend(
    text: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    engine: str = "transformers",
    device: str = "auto",
    max_tokens: int | None = None,
    text_pair: str | None = None,
    seed: int = 0,
) -> AttentionResult:
    """Per-head attention of a text.

    Args:
        text: the sentence.
        model: ``"default"`` (embedded all-MiniLM-L6-v2), a model id or folder, or a model
            already loaded with ``load_model`` (then ``device`` is the model's own).
        engine: ``"transformers"`` (the model's eager attention), ``"mhsa"`` (our module with each
            layer's weights, fed that layer's input) or ``"mhsa-random"`` (our module, fresh
            xavier weights from ``seed``, fed the same inputs).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"mps"``.
        max_tokens: truncate to this many tokens (the result reports how many were dropped);
            without it a text over the model's limit is an error.
        text_pair: second segment (encoders) or decoder text (encoder-decoder models).
        seed: seed of the ``mhsa-random`` weights.

    Raises:
        InputError, ModelLoadError, UnsupportedModelError: with a message saying what to do.
    """
    if engine not in ENGINES:
        raise InputError(f"Unknown engine {engine!r}: choose one of {', '.join(ENGINES)}.")
    text = _check_text(text)
    if text_pair is not None:
        text_pair = _check_text(text_pair, "second text")
    lm = model if isinstance(model, LoadedModel) else get_model(model or DEFAULT_MODEL, device)
    if engine != "transformers" and lm.is_encoder_decoder:
        raise UnsupportedModelError(
            f"The {engine} engine cannot load {lm.display_name!r} (encoder-decoder). "
            f"Supported: {SUPPORTED_FOR_MHSA}. Use the transformers engine for this model."
        )
    with lm.lock, torch.inference_mode():
        encoded = _encode(lm, text, text_pair, max_tokens)
        inputs = {k: v.to(lm.device) for k, v in encoded.inputs.items()}
        start = time.perf_counter()
        layers = attention_layers(lm.model) if engine != "transformers" else []
        if engine != "transformers" and not layers:
            raise UnsupportedModelError(
                f"The {engine} engine cannot load the attention layers of {lm.display_name!r} "
                f"({lm.config.model_type}). Supported: {SUPPORTED_FOR_MHSA}. "
                f"Use the transformers engine for this model."
            )
        with _capture_inputs([m for m, _ in layers]) as hidden:
            outputs = lm.model(**inputs, output_attentions=True, return_dict=True)
        name = lm.display_name
        result_extra: dict[str, Any] = {}
        if lm.is_encoder_decoder:
            theirs = _checked(getattr(outputs, "encoder_attentions", None), "encoder", name)
            result_extra = {
                "decoder_tokens": encoded.decoder_tokens,
                "decoder_attention": _to_numpy(
                    _checked(getattr(outputs, "decoder_attentions", None), "decoder", name)
                ),
                "cross_attention": _to_numpy(
                    _checked(getattr(outputs, "cross_attentions", None), "cross", name)
                ),
            }
        else:
            theirs = _checked(getattr(outputs, "attentions", None), "self", name)
        causal = _is_causal(theirs)
        max_diff = None
        if engine == "transformers":
            attention = torch.stack([a[0] for a in theirs])  # (L, H, T, T)
        else:
            if len(hidden) != len(theirs):
                raise UnsupportedModelError(
                    f"{name!r} has {len(theirs)} attention layers but {len(hidden)} that our "
                    f"module can load. Supported: {SUPPORTED_FOR_MHSA}."
                )
            modules = _own_modules(lm, layers, seed if engine == "mhsa-random" else None)
            attention = _own_module_attention(
                modules, hidden, inputs.get("attention_mask"), causal=causal
            )
            if engine == "mhsa":
                max_diff = _max_abs_diff(attention, theirs)
        forward_seconds = time.perf_counter() - start
        array = attention.float().cpu().numpy()  # the one move to the CPU
    tokens = encoded.tokens
    return AttentionResult(
        text=text,
        tokens=list(tokens.strings),
        attention=np.ascontiguousarray(array, dtype=np.float32),
        offsets=list(tokens.offsets),
        special=list(tokens.special),
        punctuation=list(tokens.punctuation),
        word_ids=list(tokens.word_ids),
        model=lm.display_name,
        engine=engine,
        device=str(lm.device),
        num_parameters=lm.num_parameters,
        timings={"load": lm.load_seconds, "forward": forward_seconds},
        causal=causal,
        truncated_tokens=encoded.truncated,
        max_abs_diff=max_diff,
        seed=seed if engine == "mhsa-random" else None,
        text_pair=text_pair,
        **result_extra,
    )

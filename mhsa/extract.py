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
    kwargs: dict[str, Any] = {"return_tensors": "pt", "return_offsets_mapping": fast}
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
    inputs = {k: v for k, v in enc.items() if k != "offset_mapping"}
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


def _stack(attentions: Any, what: str, name: str) -> torch.Tensor:
    if not attentions or any(a is None for a in attentions):
        raise ModelLoadError(
            f"Model {name!r} returned no {what} weights: its architecture does not expose "
            f"attention with eager attention. Choose a BERT-, GPT-2- or T5/BART-style model."
        )
    return torch.stack([a[0] for a in attentions])  # (L, H, T, S)


def _is_causal(attention: torch.Tensor) -> bool:
    n = attention.shape[-1]
    return n > 1 and bool((attention.triu(1) == 0).all())


def _own_module_attention(
    lm: LoadedModel,
    layers: list[tuple[nn.Module, Loader]],
    hidden: list[torch.Tensor],
    padding: torch.Tensor | None,
    *,
    causal: bool,
    seed: int | None,
) -> torch.Tensor:
    """Run our module on each layer's input; pretrained weights, or fresh ones when seed is set."""
    out = []
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        for (module, loader), h in zip(layers, hidden, strict=False):
            ours = loader(module)
            if seed is not None:
                ours = MultiHeadSelfAttention(ours.d_model, ours.num_heads)  # xavier, CPU RNG
            ours = ours.to(device=h.device, dtype=h.dtype).eval()
            _, weights = ours(h, attention_mask=padding, is_causal=causal)
            out.append(weights[0])  # (H, T, T)
    return torch.stack(out)  # (L, H, T, T)


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
        result_extra: dict[str, Any] = {}
        if lm.is_encoder_decoder:
            theirs = _stack(
                getattr(outputs, "encoder_attentions", None), "encoder attention", lm.display_name
            )
            result_extra = {
                "decoder_tokens": encoded.decoder_tokens,
                "decoder_attention": _stack(
                    getattr(outputs, "decoder_attentions", None),
                    "decoder attention",
                    lm.display_name,
                )
                .float()
                .cpu()
                .numpy(),
                "cross_attention": _stack(
                    getattr(outputs, "cross_attentions", None), "cross attention", lm.display_name
                )
                .float()
                .cpu()
                .numpy(),
            }
        else:
            theirs = _stack(getattr(outputs, "attentions", None), "attention", lm.display_name)
        causal = _is_causal(theirs)
        attention, max_diff = theirs, None
        if engine != "transformers":
            if len(hidden) != theirs.shape[0]:
                raise UnsupportedModelError(
                    f"{lm.display_name!r} has {theirs.shape[0]} attention layers but "
                    f"{len(hidden)} that our module can load. Supported: {SUPPORTED_FOR_MHSA}."
                )
            attention = _own_module_attention(
                lm,
                layers,
                hidden,
                inputs.get("attention_mask"),
                causal=causal,
                seed=seed if engine == "mhsa-random" else None,
            )
            if engine == "mhsa":
                max_diff = float((attention.float() - theirs.float()).abs().max())
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

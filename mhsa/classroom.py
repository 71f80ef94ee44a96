"""Inside MHSA: our module's computation on a sentence, one named step at a time, for teaching."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mhsa.attention import MultiHeadSelfAttention
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.extract import SUPPORTED_FOR_MHSA, _capture_inputs, _check_text, attention_layers
from mhsa.models import LoadedModel

__all__ = ["Step", "Walkthrough", "walkthrough"]

MAX_CLASSROOM_TOKENS = 64


@dataclass(frozen=True)
class Step:
    """One step: its name, its formula (plain text) and its value, batch axis first."""

    name: str
    formula: str
    value: np.ndarray

    @property
    def shape(self) -> list[int]:
        return list(self.value.shape)


@dataclass(frozen=True)
class Walkthrough:
    tokens: list[str]
    steps: list[Step]
    source: str
    d_model: int
    num_heads: int
    causal: bool
    truncated_tokens: int = 0

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)


def _token_embeddings(ids: list[int], d_model: int, seed: int) -> torch.Tensor:
    """A fixed random vector per token id (an untrained embedding table, built lazily)."""
    rows = []
    for token_id in ids:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + int(token_id))
        rows.append(torch.randn(d_model, generator=gen))
    return torch.stack(rows)[None]  # (1, T, D)


def walkthrough(
    text: str,
    *,
    model: LoadedModel,
    layer: int | None = 0,
    d_model: int = 64,
    num_heads: int = 4,
    causal: bool = False,
    seed: int = 0,
    max_tokens: int = MAX_CLASSROOM_TOKENS,
) -> Walkthrough:
    """Trace our module on ``text``.

    Args:
        text: the sentence (at most ``max_tokens`` tokens are used, so every step stays legible).
        model: supplies the tokenizer and, for ``layer`` given, that layer's weights and input.
        layer: a pretrained layer; ``None`` for fresh xavier weights of ``d_model``/``num_heads``
            over a random token embedding.
        causal: apply a causal mask (the "masked" step then shows -inf above the diagonal).
        seed: seed of the fresh weights and embedding.
    """
    text = _check_text(text)
    enc = model.tokenizer(
        text, truncation=True, max_length=max_tokens, return_tensors="pt", split_special_tokens=True
    )
    ids = enc["input_ids"][0].tolist()
    tokens = model.tokenizer.convert_ids_to_tokens(ids)
    full = len(model.tokenizer(text, split_special_tokens=True)["input_ids"])
    if layer is None:
        if d_model < 1 or num_heads < 1 or d_model % num_heads:
            raise InputError(f"d_model ({d_model}) must be a multiple of the heads ({num_heads}).")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            ours = MultiHeadSelfAttention(d_model, num_heads).eval()
        x = _token_embeddings(ids, d_model, seed)
        source = f"fresh xavier weights, d_model {d_model}, {num_heads} heads (seed {seed})"
    else:
        layers = attention_layers(model.model)
        if not layers:
            raise UnsupportedModelError(
                f"{model.display_name!r} has no attention layer our module can load. "
                f"Supported: {SUPPORTED_FOR_MHSA}."
            )
        if not 0 <= layer < len(layers):
            raise InputError(f"Layer {layer} does not exist: choose 0 to {len(layers) - 1}.")
        module, loader = layers[layer]
        with model.lock, torch.inference_mode(), _capture_inputs([module]) as hidden:
            model.model(**{k: v.to(model.device) for k, v in enc.items()})
        x = hidden[0].float().cpu()
        ours = loader(module).float().cpu().eval()
        source = f"layer {layer} of {model.display_name}"
    _, _, trace = ours.forward_with_trace(x, is_causal=causal)
    steps = [Step(s.name, s.formula, s.tensor.float().numpy()) for s in trace]
    return Walkthrough(
        tokens, steps, source, ours.d_model, ours.num_heads, causal, max(0, full - len(ids))
    )

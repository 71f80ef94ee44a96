"""Inside MHSA: our module's computation on a sentence, one named step at a time, for teaching."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.encoding import Encoded, check_text, encode
from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.runs.generation import Generation, generation_encoded
from mhsa.engine.runs.swap import OurPass, our_blocks, run_with_our_blocks
from mhsa.errors import InputError, UnsupportedModelError

__all__ = ["CROSS_STEPS", "Neuron", "Step", "Walkthrough", "cross_walkthrough", "walkthrough"]

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
class Neuron:
    """BertViz's neuron view of one query token in one head: how its weights come about.

    Attributes:
        head, token: the query head and the query token.
        query: ``q`` ``[d_head]`` (after the rotation, for RoPE models);
        keys: every ``k_j`` ``[n, d_head]`` of the key/value head that query head reads;
        products: ``q ⊙ k_j`` ``[n, d_head]`` (each row sums to ``q·k_j``);
        dots: ``q·k_j`` ``[n]``; scaled: ``q·k_j × scale`` after the mask (-inf where masked);
        probabilities: the softmax ``[n]``; scale: the factor (1/sqrt(d_head) by default).
    """

    head: int
    token: int
    query: np.ndarray
    keys: np.ndarray
    products: np.ndarray
    dots: np.ndarray
    scaled: np.ndarray
    probabilities: np.ndarray
    scale: float


#: the steps of a cross-attention walk-through whose rows are the encoder's tokens (K and V come
#: from the memory); every other step's rows are the decoder's
CROSS_STEPS = ("memory", "K", "V", "per-head K", "per-head V")


@dataclass(frozen=True)
class Walkthrough:
    """Our module's steps on a sentence.

    Attributes:
        tokens: the queries' tokens (the rows of most steps; cross-attention: the decoder's).
        steps: every observation point, in order.
        source: what the weights and the input are, in words.
        key_tokens: cross-attention only: the encoder's tokens, the keys and values (the
            columns of the scores, the rows of ``CROSS_STEPS``); None for self-attention.
    """

    tokens: list[str]
    steps: list[Step]
    source: str
    d_model: int
    num_heads: int
    num_kv_heads: int
    d_head: int
    causal: bool
    rotary: bool
    truncated_tokens: int = 0
    scale: float = 1.0
    key_tokens: list[str] | None = None

    @property
    def keys(self) -> list[str]:
        """The keys' tokens: ``key_tokens`` for cross-attention, else ``tokens``."""
        return self.tokens if self.key_tokens is None else self.key_tokens

    def rows(self, step: Step) -> list[str]:
        """The tokens down the rows of ``step``: the encoder's for the memory, K and V of
        cross-attention, else the queries'."""
        cross = self.key_tokens is not None and step.name in CROSS_STEPS
        return self.keys if cross else self.tokens

    @property
    def groups(self) -> int:
        """Query heads per key/value head (grouped-query attention; 1 = ordinary MHSA)."""
        return self.num_heads // self.num_kv_heads

    def kv_head(self, head: int) -> int:
        """The key/value head that query head ``head`` reads."""
        return head // self.groups

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def neuron(self, head: int, token: int) -> Neuron:
        """The neuron view of query ``token`` in query ``head``, from the traced steps."""
        if not 0 <= head < self.num_heads:
            raise InputError(f"Head {head} does not exist: choose 0 to {self.num_heads - 1}.")
        if not 0 <= token < len(self.tokens):
            raise InputError(f"Token {token} does not exist: choose 0 to {len(self.tokens) - 1}.")
        names = {s.name for s in self.steps}
        q_name, k_name = (
            ("rotated Q", "rotated K") if "rotated Q" in names else ("per-head Q", "per-head K")
        )
        q = self.step(q_name).value[0, head, token]
        keys = self.step(k_name).value[0, self.kv_head(head)]
        dots = self.step("raw scores").value[0, head, token]
        scaled = self.step("masked scores").value[0, head, token]
        return Neuron(
            head=head,
            token=token,
            query=q,
            keys=keys,
            products=q[None, :] * keys,
            dots=dots,
            scaled=scaled,
            probabilities=self.step("probabilities").value[0, head, token],
            scale=self.scale,
        )


class _Captured(Exception):
    """Raised by the observer once the chosen layer's input is captured: the rest of the forward
    pass is not needed."""


def _token_embeddings(ids: list[int], d_model: int, seed: int) -> torch.Tensor:
    """A fixed random vector per token id (an untrained embedding table, built lazily)."""
    rows = []
    for token_id in ids:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + int(token_id))
        rows.append(torch.randn(d_model, generator=gen))
    return torch.stack(rows)[None]  # (1, T, D)


def _layer_input(
    model: LoadedModel, enc: dict, layer: int, kinds: tuple[str, ...] = ("self", "encoder")
) -> tuple[torch.Tensor, Any]:
    """The input of attention block ``layer`` (counted among the blocks of ``kinds``) when the
    model runs through our module, and our module for that block. Holds the model's lock."""
    # encoder-decoders: by default the encoder's layers (their tokens are the text's; the
    # decoder's and the cross-attention's are not the walk-through's self-attention over it)
    every = our_blocks(model)
    blocks = [b for b in every if b.kind in kinds]
    if not 0 <= layer < len(blocks):
        raise InputError(f"Layer {layer} does not exist: choose 0 to {len(blocks) - 1}.")
    captured: list[torch.Tensor] = []

    def capture(name: str, tensor: torch.Tensor) -> None:
        if name == "X":
            captured.append(tensor.detach())
            raise _Captured

    our_pass = OurPass(need_weights=False, observers={blocks[layer].layer: capture})
    with contextlib.suppress(_Captured):
        run_with_our_blocks(model, every, our_pass, enc)
    return captured[0], blocks[layer].ours


def _fresh_module(d_model: int, num_heads: int, seed: int) -> MultiHeadSelfAttention:
    """Our module with fresh xavier weights from ``seed`` (the global random state left as it
    was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MultiHeadSelfAttention(d_model, num_heads).eval()


def _fresh_layer(
    ids: list[int], d_model: int, num_heads: int, seed: int
) -> tuple[torch.Tensor, MultiHeadSelfAttention, str]:
    """The untrained contrast: our module with fresh xavier weights (seeded, the global random
    state left as it was), its input (a random embedding per token id), and what it is."""
    ours = _fresh_module(d_model, num_heads, seed)
    x = _token_embeddings(ids, d_model, seed)
    source = f"fresh xavier weights, d_model {d_model}, {num_heads} heads (seed {seed})"
    return x, ours, source


def walkthrough(
    text: str | Generation,
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
        text: the sentence (at most ``max_tokens`` tokens are used, so every step stays legible),
            or what a model generated (``generate_ids``): then the ids it chose.
        model: supplies the tokenizer and, for ``layer`` given, that layer's weights and input
            (the input the layer gets when the model runs through our module).
        layer: a pretrained layer; ``None`` for fresh xavier weights of ``d_model``/``num_heads``
            over a random token embedding.
        causal: apply a causal mask (the "masked" step then shows -inf above the diagonal).
        seed: seed of the fresh weights and embedding.
    """
    if not isinstance(text, Generation):
        text = check_text(text)
    if layer is None and (d_model < 1 or num_heads < 1 or d_model % num_heads):
        raise InputError(f"d_model ({d_model}) must be a multiple of the heads ({num_heads}).")
    with model.lock, torch.inference_mode():  # the tokenizer and the model are shared
        if isinstance(text, Generation):
            encoded = generation_encoded(model, text, max_tokens)
        else:
            encoded = encode(model, text, None, max_tokens)  # the tokenizing every view shares
        ids = encoded.inputs["input_ids"][0].tolist()
        tokens = list(encoded.tokens.strings)
        if layer is None:
            x, ours, source = _fresh_layer(ids, d_model, num_heads, seed)
        else:
            x, ours = _layer_input(model, dict(encoded.inputs), layer)
            source = f"layer {layer} of {model.display_name}"
        _, _, trace = ours.forward_with_trace(x, is_causal=causal)
    steps = [Step(s.name, s.formula, s.tensor.float().cpu().numpy()) for s in trace]
    return _walkthrough_of(ours, tokens, steps, source, causal, encoded.truncated)


def _walkthrough_of(
    ours: MultiHeadSelfAttention,
    tokens: list[str],
    steps: list[Step],
    source: str,
    causal: bool,
    truncated: int,
    key_tokens: list[str] | None = None,
) -> Walkthrough:
    """The ``Walkthrough`` of ``steps`` traced through ``ours`` (formulas without key/value
    groups where every query head has its own: ``ungrouped_formula``)."""
    if ours.num_kv_heads == ours.num_heads:
        steps = [Step(s.name, ungrouped_formula(s.formula), s.value) for s in steps]
    return Walkthrough(
        tokens,
        steps,
        source,
        d_model=ours.d_model,
        num_heads=ours.num_heads,
        num_kv_heads=ours.num_kv_heads,
        d_head=ours.d_head,
        causal=causal,
        rotary=ours.rotary is not None,
        truncated_tokens=truncated,
        scale=float(ours.scale),
        key_tokens=key_tokens,
    )


def _encoded_pair(
    model: LoadedModel, text: str | Generation, target: str, max_tokens: int
) -> tuple[Encoded, list[int], list[str]]:
    """The encoder's encoding, and the decoder's ids and tokens, for ``cross_walkthrough``: an
    encoder-decoder's own (the target as its decoder input, or the ids it generated), else the
    sentence and the target (the sentence again when empty) each tokenized on its own. The
    caller holds the model's lock."""
    if isinstance(text, Generation):
        enc = generation_encoded(model, text, max_tokens)
    else:
        enc = encode(
            model, text, (target or None) if model.is_encoder_decoder else None, max_tokens
        )
    if model.is_encoder_decoder:
        return enc, enc.inputs["decoder_input_ids"][0].tolist(), list(enc.decoder_tokens or [])
    sentence = text.text if isinstance(text, Generation) else text
    dec = encode(model, target or sentence, None, max_tokens)
    return enc, dec.inputs["input_ids"][0].tolist(), list(dec.tokens.strings)


def _model_cross(
    model: LoadedModel, enc: Encoded, dec_ids: list[int], layer: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, MultiHeadSelfAttention, str]:
    """An encoder-decoder's cross step: the decoder states entering the cross-attention of
    decoder layer ``layer`` ``[1, m, D]``, the encoder's output ``[1, n, D]`` (what every
    cross-attention block reads), our module with that block's weights, and what they are. A
    model our module cannot load: its decoder's token embeddings and fresh weights of its
    width and heads instead. The caller holds the model's lock."""
    inputs = enc.inputs_on(model.device)
    memory = model.model.get_encoder()(
        input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask")
    ).last_hidden_state.float()
    name = model.display_name
    try:
        x, ours = _layer_input(model, dict(enc.inputs), layer, ("cross",))
    except UnsupportedModelError as e:
        facts = model.facts()
        ours = _fresh_module(int(facts["d_model"]), int(facts["heads"]), seed)
        decoder = model.model.get_decoder()
        embed = getattr(decoder, "embed_tokens", None) or model.model.get_input_embeddings()
        x = embed(torch.tensor([dec_ids], device=model.device)).float()
        source = (
            f"fresh xavier weights (seed {seed}) of {name}'s width and heads; queries from its "
            f"decoder's token embeddings, keys and values from its encoder's output (our "
            f"module cannot load its blocks: {e})"
        )
        return x, memory, ours.to(model.device), source
    source = (
        f"the cross-attention of decoder layer {layer} of {name}, its weights in our module; "
        "queries from the decoder's states entering it, keys and values from the encoder's "
        "output"
    )
    return x.float(), memory, ours, source


def cross_walkthrough(
    text: str | Generation,
    target: str = "",
    *,
    model: LoadedModel,
    layer: int = 0,
    d_model: int = 64,
    num_heads: int = 4,
    seed: int = 0,
    max_tokens: int = MAX_CLASSROOM_TOKENS,
) -> Walkthrough:
    """Trace our module's cross-attention: queries from the decoder's tokens ``[m, d]``, keys
    and values from the encoder's ``[n, d]``, scores and weights ``[m, n]``.

    An encoder-decoder model: the cross-attention block of decoder layer ``layer``, its
    weights loaded into our module, on the decoder states that enter it (the model run
    through our module) and the model's encoder output (a model our module cannot load:
    fresh weights of its width and heads on its decoder's token embeddings). Any other model:
    fresh weights of ``d_model``/``num_heads`` over a random embedding per token id, the
    sentence playing the encoder and ``target`` the decoder. ``source`` says which.

    Args:
        text: the sentence (the encoder's input), or what an encoder-decoder generated for it
            (``generate_ids``: the decoder then reads the ids it chose).
        target: the decoder's text (empty: the sentence itself).
        model: supplies the tokenizer (and, for an encoder-decoder, the states).
        layer: an encoder-decoder's decoder layer whose cross-attention is traced.
        d_model, num_heads: the fresh module's sizes for a model that is not an encoder-decoder.
        seed: seed of the fresh weights (and of the random embedding).
        max_tokens: at most this many tokens on each side.
    """
    if not isinstance(text, Generation):
        text = check_text(text)
    if target:
        target = check_text(target, "target text")
    with model.lock, torch.inference_mode():
        enc, dec_ids, dec_tokens = _encoded_pair(model, text, target, max_tokens)
        enc_ids = enc.inputs["input_ids"][0].tolist()
        if model.is_encoder_decoder:
            x, memory, ours, source = _model_cross(model, enc, dec_ids, layer, seed)
        else:
            if d_model < 1 or num_heads < 1 or d_model % num_heads:
                raise InputError(
                    f"d_model ({d_model}) must be a multiple of the heads ({num_heads})."
                )
            x = _token_embeddings(dec_ids, d_model, seed)
            memory = _token_embeddings(enc_ids, d_model, seed)
            source = (
                f"fresh xavier weights, d_model {d_model}, {num_heads} heads (seed {seed}) over "
                "a random embedding per token: the sentence plays the encoder, the target "
                "text the decoder"
            )
            ours = _fresh_module(d_model, num_heads, seed)
        _, _, trace = ours.forward_with_trace(x, memory=memory)
    memory_step = Step(
        "memory", "M: the encoder's states, where K and V come from", memory.cpu().numpy()
    )
    steps = [memory_step] + [
        Step(t.name, _cross_formula(t.name, t.formula), t.tensor.float().cpu().numpy())
        for t in trace
    ]
    return _walkthrough_of(
        ours, dec_tokens, steps, source, False, enc.truncated, list(enc.tokens.strings)
    )


#: how the core's formulas name grouped key/value heads, and the same for one K and V per head
_GROUPED = (
    ("   (query head h reads key/value head g(h))", ""),
    ("K_g(h)", "K_h"),
    ("V_g(h)", "V_h"),
    ("K_g", "K_h"),
    ("V_g", "V_h"),
    ("kv heads", "heads"),
)


def ungrouped_formula(formula: str) -> str:
    """A formula of ``mhsa.engine.attention.core.OBSERVATION_POINTS`` for a module whose every query
    head has its own key and value head (no grouped-query attention): ``Q_h K_h^T``, not
    ``Q_h K_g(h)^T``, which names groups the model does not have."""
    for grouped, own in _GROUPED:
        formula = formula.replace(grouped, own)
    return formula


def _cross_formula(name: str, formula: str) -> str:
    """A step's formula in cross-attention: X is the decoder's, K and V read the memory M."""
    if name == "X":
        return "X: the decoder tokens' states, where Q comes from"
    if name in ("K", "V"):
        return formula.replace("X W_", "M W_")
    return formula

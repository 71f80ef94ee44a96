"""Repeated random tokens: the induction test of TransformerLens's demo (random token ids, each
sequence followed by itself, no BOS), and one such sequence as an ``AttentionResult`` so that
the figures of a test show the input the test ran on."""

from __future__ import annotations

import time

import numpy as np
import torch

from mhsa.engine.encoding import Encoded
from mhsa.engine.extract import engine_spec
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.batches import batch_attention
from mhsa.engine.runs.forward import make_result
from mhsa.engine.tokens import Tokens
from mhsa.errors import InputError

__all__ = [
    "REPEAT_COUNT",
    "REPEAT_LENGTH",
    "random_repeats",
    "repeat_length",
    "repeated_tokens",
]

#: the random-token induction test of TransformerLens's demo: sequences, and length of each half
REPEAT_COUNT = 10
REPEAT_LENGTH = 50


def random_repeats(lm: LoadedModel, length: int, count: int, seed: int) -> torch.Tensor:
    """``[count, 2 * length]`` token ids: random ids from the vocabulary (special tokens left
    out), each row's first half repeated."""
    tok = lm.tokenizer
    size = min(len(tok), getattr(lm.config, "vocab_size", None) or len(tok))
    special = set(tok.all_special_ids)
    pool = np.array([i for i in range(size) if i not in special])
    if len(pool) == 0:
        raise InputError(f"{lm.display_name}'s vocabulary has no ordinary tokens to draw from.")
    half = np.random.default_rng(seed).choice(pool, size=(count, length))  # (B, length)
    return torch.from_numpy(np.concatenate([half, half], axis=1))  # (B, 2 length)


def repeat_length(lm: LoadedModel, length: int | None, count: int = 1) -> int:
    """The length of each random half: ``length``, or 50 (the demo's) or, for models of fewer
    positions, half of them.

    Raises:
        InputError: the length does not fit the model (each sequence is ``2 * length`` tokens),
            or an encoder-decoder (the test runs one stack).
    """
    limit = lm.max_positions
    if length is None:
        length = REPEAT_LENGTH if limit is None else min(REPEAT_LENGTH, limit // 2)
    if length < 2 or (limit is not None and 2 * length > limit) or count < 1:
        raise InputError(
            f"The repeated random tokens need a length from 2 to {(limit or 10**9) // 2} for "
            f"{lm.display_name} and at least one sequence, got length {length}, count {count}."
        )
    if lm.is_encoder_decoder:
        raise InputError("The random-token test takes encoder or decoder models: give texts.")
    return length


def repeated_tokens(
    model: str | LoadedModel = DEFAULT_MODEL,
    *,
    engine: str = "transformers",
    seed: int = 0,
    length: int | None = None,
) -> tuple[AttentionResult, list[int]]:
    """The first sequence of the random-token induction test
    (``mhsa.analysis.roles.induction_scores``
    with the same ``seed`` and ``length`` averages over it and nine more) as an attention
    result, and its token ids (for its detection patterns): what a test's figures show.

    Raises:
        InputError: the length does not fit the model, or an encoder-decoder.
    """
    lm = resolve_model(model)
    spec = engine_spec(engine)
    length = repeat_length(lm, length)
    ids = random_repeats(lm, length, 1, seed)  # (1, 2 length)
    start = time.perf_counter()
    with lm.lock, torch.inference_mode():
        inputs = {"input_ids": ids.to(lm.device), "attention_mask": torch.ones_like(ids)}
        inputs["attention_mask"] = inputs["attention_mask"].to(lm.device)
        layers, causal = batch_attention(lm, spec, inputs, seed)  # L x (1, H, T, T)
        attention = torch.stack([a[0].float() for a in layers]).cpu().numpy()
        strings = lm.tokenizer.convert_ids_to_tokens(ids[0].tolist())
    n = len(strings)
    tokens = Tokens(tuple(strings), ((0, 0),) * n, (False,) * n, tuple(range(n)))
    encoded = Encoded({"input_ids": ids}, tokens, 0, None)
    text = " ".join(strings)
    forward = time.perf_counter() - start
    result = make_result(
        lm,
        encoded,
        text,
        attention,
        engine=engine,
        timings={"load": lm.load_seconds, "forward": forward},
        causal=causal,
        seed=seed if spec.seeded else None,
    )
    return result, ids[0].tolist()

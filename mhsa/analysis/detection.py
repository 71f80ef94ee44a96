"""Head detection on an attention result already computed: patterns built from rules of the
sentence's tokens (or typed by hand), the token ids an attention result ran over, and tables of
every head's scores. The Head roles page, the Head statistics' role columns and the command line
share them; ``mhsa.analysis.roles.detect_heads(..., result=...)`` uses them on one text, as
TransformerLens's ``detect_head(..., cache=...)`` takes a cache instead of running the model.

The scores themselves are ``mhsa.analysis.roles.detection_scores`` (TransformerLens's
``compute_head_attention_similarity_score``); the named patterns ``mhsa.analysis.roles.
detection_pattern`` (``transformer_lens/head_detector.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from mhsa.analysis.roles import DETECTION_PATTERNS, detection_pattern, detection_scores
from mhsa.engine.encoding import encode
from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.generation import Generation, generation_encoded
from mhsa.errors import InputError

__all__ = [
    "CUSTOM_RULES",
    "MAX_RULE_K",
    "RULES_WITH_K",
    "TYPED_RULE",
    "detection_table",
    "head_table",
    "named_patterns",
    "rule_pattern",
    "sequence_ids",
    "string_ids",
    "typed_pattern",
]

#: a pattern typed as rows of numbers (``typed_pattern``)
TYPED_RULE = "typed rows"
#: the rules that take a distance ``k``
RULES_WITH_K = ("k back", "k forward")
#: every rule ``rule_pattern`` builds a pattern from
CUSTOM_RULES = (*RULES_WITH_K, "same token", "token after its earlier occurrence", TYPED_RULE)
#: the largest ``k`` the pages offer
MAX_RULE_K = 64


def typed_pattern(rows: str) -> np.ndarray:
    """A pattern typed as rows of numbers (one row per line; spaces or commas between).

    Raises:
        InputError: no rows, rows of different lengths, or an item that is not a number.
    """
    lines = [line.replace(",", " ").split() for line in rows.splitlines() if line.strip()]
    if not lines:
        raise InputError("Type the pattern: one row of numbers per token of the sentence.")
    for i, line in enumerate(lines, start=1):
        if len(line) != len(lines[0]):
            raise InputError(
                f"Row {i} has {len(line)} numbers and row 1 has {len(lines[0])}: every row "
                "needs one number per token."
            )
        for item in line:
            try:
                float(item)
            except ValueError:
                raise InputError(f"Row {i}: {item[:20]!r} is not a number.") from None
    return np.array(lines, dtype=np.float64)


def rule_pattern(rule: str, token_ids: Sequence[int], *, k: int = 1, rows: str = "") -> np.ndarray:
    """A rule's ``[n, n]`` detection pattern for the token ids: 1 at the key ``k`` before
    (``k back``) or after (``k forward``) each query, at earlier occurrences of the query's
    token (``same token``: TransformerLens's duplicate-token pattern), at the token after them
    (``token after its earlier occurrence``: the induction pattern), or the typed ``rows``
    (``typed rows``, ``typed_pattern``).

    Raises:
        InputError: an unknown rule, or badly typed rows.
    """
    n = len(token_ids)
    if rule == "k back":
        return np.eye(n, k=-k)
    if rule == "k forward":
        return np.eye(n, k=k)
    if rule == "same token":
        return detection_pattern("duplicate token", token_ids)
    if rule == "token after its earlier occurrence":
        return detection_pattern("induction", token_ids)
    if rule == TYPED_RULE:
        return typed_pattern(rows)
    raise InputError(f"Unknown rule {rule!r}: choose one of {', '.join(CUSTOM_RULES)}.")


def named_patterns(token_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """Each named detector's pattern (``DETECTION_PATTERNS``) for the token ids."""
    return {name: detection_pattern(name, token_ids) for name in DETECTION_PATTERNS}


def string_ids(tokens: Sequence[str]) -> list[int]:
    """Ids standing for token strings where the model's ids are not at hand (attention read
    from a file, ``mhsa.from_attention``): equal strings share an id, numbered in order of
    first appearance. The detection patterns compare ids for equality only, so these give the
    tokenizer's patterns wherever each string is one id (a tokenizer that writes two ids
    alike would be read as one token)."""
    seen: dict[str, int] = {}
    return [seen.setdefault(t, len(seen)) for t in tokens]


def sequence_ids(
    lm: LoadedModel,
    text: str | Generation,
    *,
    text_pair: str | None = None,
    decoder: bool = False,
    max_tokens: int | None = None,
) -> list[int]:
    """The token ids an attention result of ``text`` runs over, as the model's tokenizer gives
    them, special tokens included, cut to ``max_tokens`` as ``attend`` cuts them: the ids the
    model chose for a ``Generation``; ``decoder``: an encoder-decoder's decoder ids (its
    ``text_pair``, or the generated target) instead of the encoder's."""
    with lm.lock:
        if isinstance(text, Generation):
            encoded = generation_encoded(lm, text, max_tokens)
        else:
            encoded = encode(lm, text, text_pair, max_tokens)
    return encoded.inputs["decoder_input_ids" if decoder else "input_ids"][0].tolist()


def head_table(result: AttentionResult, columns: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """``[layers, heads]`` scores per column as a table of heads: ``layer``, ``head``, then the
    columns (float64), indexed ``L{l}H{h}`` (index name ``name``)."""
    layers, heads = result.num_layers, result.num_heads
    frame = pd.DataFrame(
        {
            "layer": np.repeat(np.asarray(result.layers, dtype=int), heads),  # the model's
            "head": np.tile(np.asarray(result.heads, dtype=int), layers),
            **{name: np.asarray(s, dtype=np.float64).reshape(-1) for name, s in columns.items()},
        },
        index=result.head_labels(),
    )
    frame.index.name = "name"
    return frame


def detection_table(
    result: AttentionResult,
    patterns: Mapping[str, np.ndarray],
    *,
    error_measure: str = "mul",
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
) -> pd.DataFrame:
    """Every head's score on ``result`` against each of ``patterns``
    (``mhsa.analysis.roles.detection_scores`` with these options), one column per pattern, as
    ``head_table`` lays it out."""
    scores = {
        name: detection_scores(
            result.attention,
            pattern,
            error_measure=error_measure,
            exclude_bos=exclude_bos,
            exclude_current_token=exclude_current_token,
        )
        for name, pattern in patterns.items()
    }
    return head_table(result, scores)

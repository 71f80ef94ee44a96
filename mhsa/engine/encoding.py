"""Texts -> model inputs: checking what a user typed, tokenizing one text or a corpus."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.tokens import Tokens
from mhsa.errors import InputError

__all__ = [
    "Encoded",
    "answer_ids",
    "check_text",
    "encode",
    "encode_clean_corrupted",
    "encode_many",
    "teacher_forced",
]


@dataclass(frozen=True)
class Encoded:
    """One text tokenized for one model.

    Attributes:
        inputs: the model's input tensors (batch 1, on the CPU): ``input_ids``, the attention
            mask, ..., and ``decoder_input_ids`` for encoder-decoder models.
        tokens: the tokens as the model sees them, with offsets and flags.
        truncated: tokens dropped to fit ``max_tokens``.
        decoder_tokens: the decoder's tokens (encoder-decoder models), else None.
        decoder_labels: an encoder-decoder's typed target as the labels its teacher-forced
            ``decoder_input_ids`` are shifted from (``teacher_forced``), ``[1, m]``; else None.
    """

    inputs: dict[str, torch.Tensor]
    tokens: Tokens
    truncated: int
    decoder_tokens: list[str] | None
    decoder_labels: torch.Tensor | None = None

    def inputs_on(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The input tensors moved to ``device``."""
        return {k: v.to(device) for k, v in self.inputs.items()}


def check_text(text: object, what: str = "text") -> str:
    """``text`` when it is a string with something besides spaces in it.

    Raises:
        InputError: not a string, or empty; the message names the text as ``what``.
    """
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


def encode_many(
    lm: LoadedModel, texts: Sequence[str], max_tokens: int | None = None
) -> list[Encoded | InputError]:
    """``encode(lm, text, None, max_tokens)`` of every text, or the InputError it raises, in one
    call of a fast tokenizer (a corpus: the tokenizer's per-call Python overhead, which would
    otherwise outweigh tokenizing a short sentence, is paid once). Truncation, other tokenizers
    and encoder-decoder models: one text at a time."""
    tok = lm.tokenizer
    if max_tokens is not None or lm.is_encoder_decoder or not getattr(tok, "is_fast", False):
        out: list[Encoded | InputError] = []
        for text in texts:
            try:
                out.append(encode(lm, text, None, max_tokens))
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
            out.append(Encoded(inputs, Tokens.from_encoding(tok, enc, ids, i), 0, None))
    return out


def encode(lm: LoadedModel, text: str, text_pair: str | None, max_tokens: int | None) -> Encoded:
    """One text (and its second segment or decoder text) tokenized for ``lm``.

    Args:
        lm: the loaded model whose tokenizer runs.
        text: the sentence, already checked (``check_text``).
        text_pair: second segment (encoders) or decoder text (encoder-decoder models).
        max_tokens: truncate to this many tokens; None: a text over the model's limit is an
            error.

    Raises:
        InputError: no tokens, too long, or ``max_tokens`` below the special tokens' count.
    """
    tok = lm.tokenizer
    limit = _token_limit(lm, text_pair, max_tokens)
    pair = None if lm.is_encoder_decoder else text_pair
    fast = bool(getattr(tok, "is_fast", False))
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
    tokens = Tokens.from_encoding(tok, enc, enc["input_ids"][0].tolist())
    inputs = {k: v for k, v in enc.items() if k not in ("offset_mapping", "special_tokens_mask")}
    decoder_tokens = None
    if lm.is_encoder_decoder:
        labels = _decoder_labels(lm, text_pair if text_pair is not None else text, limit)
        inputs["decoder_input_ids"] = teacher_forced(lm, labels)
        decoder_tokens = tok.convert_ids_to_tokens(inputs["decoder_input_ids"][0].tolist())
        return Encoded(inputs, tokens, truncated, decoder_tokens, labels)
    return Encoded(inputs, tokens, truncated, decoder_tokens)


def _token_limit(lm: LoadedModel, text_pair: str | None, max_tokens: int | None) -> int | None:
    """Most tokens the text may have: the model's limit, lowered to ``max_tokens``.

    Raises:
        InputError: ``max_tokens`` leaves no room beside the special tokens.
    """
    limit = lm.max_positions
    if max_tokens is None:
        return limit
    special = lm.tokenizer.num_special_tokens_to_add(
        pair=text_pair is not None and not lm.is_encoder_decoder
    )
    if max_tokens < special + 1:
        raise InputError(
            f"max_tokens must be at least {special + 1}: {lm.display_name} adds {special} "
            f"special tokens to every text, got {max_tokens}."
        )
    return max_tokens if limit is None else min(limit, max_tokens)


def _decoder_labels(lm: LoadedModel, target: str, limit: int | None) -> torch.Tensor:
    """An encoder-decoder's target as labels ``[1, m]``: the tokenizer's ids of it, less a
    leading decoder start token when the tokenizer writes one itself (the toy models': their
    decoder reads ``[BOS]`` once, as trained), cut to ``limit``."""
    ids = lm.tokenizer(target, return_tensors="pt", truncation=limit is not None, max_length=limit)[
        "input_ids"
    ]
    start = getattr(lm.config, "decoder_start_token_id", None)
    if ids.shape[1] > 1 and start is not None and int(ids[0, 0]) == start:
        ids = ids[:, 1:]
    return ids


def teacher_forced(lm: LoadedModel, labels: torch.Tensor) -> torch.Tensor:
    """The decoder input an encoder-decoder reads when trained on ``labels`` ``[B, m]``
    (teacher forcing): the model's own ``prepare_decoder_input_ids_from_labels`` where its
    generation head has one (BART's ``shift_tokens_right``, T5's ``_shift_right``, mBART's
    own), else the labels shifted right after ``decoder_start_token_id`` (-100 read as the
    padding token). Attention views, the language-model loss and knock-outs all read this
    input, so that they describe one decoder input."""
    head = lm.head_model
    if head is not None and hasattr(head, "prepare_decoder_input_ids_from_labels"):
        return head.prepare_decoder_input_ids_from_labels(labels=labels)
    config = lm.config
    pad = getattr(config, "pad_token_id", None) or 0
    start = getattr(config, "decoder_start_token_id", None)
    shifted = labels.new_full(labels.shape, pad)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = pad if start is None else start
    return shifted.masked_fill(shifted == -100, pad)


def _one_token(lm: LoadedModel, word: object, what: str) -> tuple[int, str]:
    """The id of ``word`` after a space (as it would follow the text), and the word stripped."""
    text = check_text(str(word or ""), what).strip()
    ids = lm.tokenizer(" " + text, add_special_tokens=False)["input_ids"]
    tokens = lm.tokenizer.convert_ids_to_tokens(ids)
    if len(ids) != 1:
        raise InputError(
            f"The {what} {text!r} must be exactly one token after a space; it gives "
            f"{len(ids)}: {tokens!r}. Pick a word the model's tokenizer keeps whole."
        )
    if ids[0] == lm.tokenizer.unk_token_id:
        raise InputError(
            f"The {what} {text!r} is not in the model's vocabulary (it becomes {tokens[0]}): "
            "pick a word the model knows."
        )
    return int(ids[0]), text


def answer_ids(lm: LoadedModel, answer: object, wrong: object) -> tuple[int, int, str, str]:
    """The token ids of ``answer`` and ``wrong`` and the words as read: each a word that, after a
    space, is exactly one token of ``lm``'s tokenizer (the metric logit(answer) - logit(wrong) of
    patching and direct logit attribution). Caller holds the lock.

    Raises:
        InputError: a word is empty, more than one token (the message names the tokens), the
            unknown token, or both are the same token.
    """
    a, a_text = _one_token(lm, answer, "answer")
    w, w_text = _one_token(lm, wrong, "wrong answer")
    if a == w:
        raise InputError(
            f"The answer and the wrong answer are the same token ({a_text!r}): the metric "
            "logit(answer) - logit(wrong) would be 0 for every run. Give two different words."
        )
    return a, w, a_text, w_text


def encode_clean_corrupted(
    lm: LoadedModel, clean: object, corrupted: object, max_tokens: int | None, why: str
) -> tuple[Encoded, Encoded]:
    """The clean and the corrupted text of a patching run (activation patching, edge
    attribution), each checked (``check_text``) and encoded, with as many tokens as each other.

    Args:
        why: what swaps activations position by position, said in the error (``"patching
            replaces activations"``).

    Raises:
        InputError: a text that is not one, or token counts that differ (both token lists
            named).
    """
    clean_enc = encode(lm, check_text(clean, "clean text"), None, max_tokens)
    corrupted_enc = encode(lm, check_text(corrupted, "corrupted text"), None, max_tokens)
    n_clean, n_corrupted = (e.inputs["input_ids"].shape[1] for e in (clean_enc, corrupted_enc))
    if n_clean != n_corrupted:
        raise InputError(
            f"The clean text has {n_clean} tokens and the corrupted text {n_corrupted}: {why} "
            "position by position, so both need the same number of tokens (clean: "
            f"{list(clean_enc.tokens.strings)!r}; corrupted: "
            f"{list(corrupted_enc.tokens.strings)!r})."
        )
    return clean_enc, corrupted_enc

"""Tokens as the model sees them, with offsets, special/punctuation flags and word grouping."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ["Tokens", "find_tokens", "is_punctuation", "word_groups"]

_PIECE_MARKS = ("##", "Ġ", "▁", "Ċ")


@lru_cache(maxsize=1 << 16)  # a vocabulary's worth: a corpus asks about the same tokens again
def is_punctuation(token: str) -> bool:
    """True when the token, without sub-word markers, is made only of punctuation characters."""
    text = token
    for mark in _PIECE_MARKS:
        text = text.replace(mark, "")
    text = text.strip()
    return bool(text) and all(unicodedata.category(ch).startswith("P") for ch in text)


def _bare(token: str) -> str:
    for mark in _PIECE_MARKS:
        token = token.replace(mark, "")
    return token.strip().casefold()


def find_tokens(tokens: list[str], needle: str) -> list[int]:
    """Positions of the tokens that match ``needle`` (case-insensitive, sub-word markers such
    as ``##`` and ``Ġ`` ignored): exact matches first, then tokens that contain it, each in
    order of position. An empty needle matches nothing."""
    want = needle.strip().casefold()
    if not want:
        return []
    bare = [_bare(t) for t in tokens]
    exact = [i for i, t in enumerate(bare) if t == want]
    partial = [i for i, t in enumerate(bare) if want in t and t != want]
    return exact + partial


@dataclass(frozen=True)
class Tokens:
    """One tokenized sequence.

    Attributes:
        strings: token strings as the tokenizer names them (``"##ing"``, ``"Ġcat"``, ``"[CLS]"``).
        offsets: ``(start, end)`` character span in the text per token; ``(0, 0)`` for specials.
        special: True for special tokens ([CLS], [SEP], BOS/EOS, padding).
        word_ids: index of the word a token belongs to; -1 for special tokens.
    """

    strings: tuple[str, ...]
    offsets: tuple[tuple[int, int], ...]
    special: tuple[bool, ...]
    word_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.strings)

    @property
    def punctuation(self) -> tuple[bool, ...]:
        pairs = zip(self.strings, self.special, strict=True)
        return tuple(is_punctuation(t) and not s for t, s in pairs)

    @classmethod
    def from_encoding(cls, tokenizer: Any, encoding: Any, ids: list[int], index: int = 0) -> Tokens:
        """Build from a fast tokenizer's ``BatchEncoding`` (tensors or lists; text ``index`` of
        its batch) and that text's input ids."""

        def row(key: str) -> list:
            value = encoding[key][index]
            return value.tolist() if hasattr(value, "tolist") else list(value)

        strings = tuple(tokenizer.convert_ids_to_tokens(ids))
        if "special_tokens_mask" in encoding:  # the tokens the tokenizer added ([CLS], [SEP])
            special = tuple(bool(m) for m in row("special_tokens_mask"))
        else:
            added = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
            special = tuple(i in added for i in ids)
        offsets = (
            tuple((int(a), int(b)) for a, b in row("offset_mapping"))
            if "offset_mapping" in encoding
            else ((0, 0),) * len(ids)
        )
        word_ids = _word_ids(encoding, special, len(ids), index)
        return cls(strings, offsets, special, word_ids)


def _word_ids(encoding: Any, special: tuple[bool, ...], n: int, index: int = 0) -> tuple[int, ...]:
    """Number words across both sequences of a pair; specials get -1."""
    try:
        words = encoding.word_ids(index)
        seqs = encoding.sequence_ids(index)
    except (ValueError, AttributeError):  # slow tokenizers have no word alignment
        words, seqs = list(range(n)), [0] * n
    out: list[int] = []
    last_key: tuple[int | None, int | None] | None = None
    counter = -1
    for w, s, sp in zip(words, seqs, special, strict=False):
        if w is None or sp:
            out.append(-1)
            last_key = None
            continue
        if (s, w) != last_key:
            counter += 1
            last_key = (s, w)
        out.append(counter)
    return tuple(out)


def word_groups(word_ids: tuple[int, ...]) -> np.ndarray:
    """Membership matrix ``[units, tokens]``: a unit is a word, or one special token alone."""
    units: list[list[int]] = []
    last = None
    for i, w in enumerate(word_ids):
        if w >= 0 and w == last:
            units[-1].append(i)
        else:
            units.append([i])
        last = w if w >= 0 else None
    member = np.zeros((len(units), len(word_ids)), dtype=np.float32)
    for u, idx in enumerate(units):
        member[u, idx] = 1.0
    return member

"""Attention programs: a small language whose every program maps a text to an attention pattern.

A program says, for each query of a text, which keys it attends to; the pattern spreads each
query's weight uniformly over those keys (Hayes, Li and Andreas 2026, "Explaining Attention with
Program Synthesis", explain heads by such programs; Clark et al. 2019, "What Does BERT Look At?",
read heads as fixed offsets, special tokens and syntactic relations). The forms:

- positional: ``offset(d)`` (the token ``d`` away: -1 the previous one), ``first``, ``last``
  (the text's last token), ``self``;
- token classes: ``special`` ([CLS], [SEP], BOS, EOS), ``punctuation``, ``same_token`` (earlier
  copies of the query's token), ``induction`` (the token after an earlier copy of the query's
  token: TransformerLens's induction pattern), ``same_word`` (the pieces of the query's word,
  itself included), ``word_start`` (the first piece of the query's word);
- linguistic (the corpus's part-of-speech tags, Petrov, Das and McDonald 2012's Universal
  tagset): ``pos(TAG, left|right|any, nearest|all)`` (keys of that tag in another word, on
  that side of the query, the nearest one or all of them; ``any``: either side, the nearest
  by distance, both at a tie) and ``when(QTAG, program)`` (the program for queries tagged
  QTAG; other queries get no key);
- combinations: ``a | b`` (a's keys; b's where a gives the query none) and ``mix(a, b, w)``
  (``w a + (1 - w) b``, each row renormalised where only one of them gives keys).

A query may see every key in an encoder, only keys at or before it in a causal model: a program
never gives weight to a key the query cannot see. **A query with no key** gets an all-zero row
(``offset(-1)`` at the first token, ``pos(DET, left, nearest)`` with no determiner before it).
``a | b`` is the way to give such queries a fallback; a zero row that remains in the final
pattern counts as a miss in every score (``mhsa.explain.scores``: it adds the head's whole row
to the IoU's denominator and nothing to its numerator, and its strongest key is never one the
program weights), so a program that leaves queries out is not rewarded for it.

``str(program)`` is the canonical text, and ``parse_program`` reads it (or any spacing, keyword
case and ``offset(+1)``) back to an equal program; ``program.describe()`` is one sentence.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mhsa.atlas.tags import UNIVERSAL_TAGS
from mhsa.errors import InputError

if TYPE_CHECKING:
    from mhsa.engine.models.loading import LoadedModel
    from mhsa.engine.tokens import Tokens

__all__ = [
    "ATOMS",
    "DIRECTIONS",
    "KINDS",
    "SELECTIONS",
    "TAG_NAMES",
    "Atom",
    "Fallback",
    "Mix",
    "Offset",
    "Pos",
    "Program",
    "ProgramError",
    "TextFeatures",
    "When",
    "parse_program",
    "program_pattern",
]

#: the words ``describe`` uses for each of Petrov, Das and McDonald 2012's Universal
#: part-of-speech tags (``mhsa.atlas.tags.UNIVERSAL_TAGS``, the tagset Brown's tags are mapped to)
TAG_NAMES = {
    "NOUN": ("a noun", "noun"),
    "VERB": ("a verb", "verb"),
    "ADJ": ("an adjective", "adjective"),
    "ADV": ("an adverb", "adverb"),
    "PRON": ("a pronoun", "pronoun"),
    "DET": ("a determiner", "determiner"),
    "ADP": ("an adposition", "adposition"),
    "NUM": ("a numeral", "numeral"),
    "CONJ": ("a conjunction", "conjunction"),
    "PRT": ("a particle", "particle"),
    ".": ("a punctuation mark", "punctuation mark"),
    "X": ("another word (X)", "word tagged X"),
}
DIRECTIONS = ("left", "right", "any")
SELECTIONS = ("nearest", "all")
#: the kinds of program (``Program.kind``)
KINDS = ("positional", "token", "linguistic", "combination")

#: the atoms without arguments: name -> (kind, what ``describe`` says)
ATOMS = {
    "first": ("positional", "to the first token"),
    "last": ("positional", "to the last token"),
    "self": ("positional", "to itself"),
    "special": ("token", "to the special tokens ([CLS], [SEP], BOS, EOS)"),
    "punctuation": ("token", "to punctuation"),
    "same_token": ("token", "to earlier copies of its own token"),
    "induction": ("token", "to the token after an earlier copy of its own token"),
    "same_word": ("token", "to the pieces of its own word"),
    "word_start": ("token", "to the first piece of its own word"),
}


class ProgramError(InputError):
    """A program that does not parse, names an unknown tag, or cannot apply to a text."""


# --- the features a program reads ---------------------------------------------------------------


@dataclass(frozen=True)
class TextFeatures:
    """What programs read of one text: its tokens as the model sees them, which are special,
    the word of each token, the tokens' part-of-speech tags (Universal tags; None for special
    tokens; ``tags`` None where the corpus has none), and whether queries see later keys.

    Attributes:
        tokens: token strings (``"[CLS]"``, ``"##ing"``, ``"Ġcat"``).
        special: one flag per token.
        word_ids: the word each token belongs to, -1 for special tokens (``Tokens.word_ids``).
        tags: one tag per token or None.
        causal: a decoder's queries see keys at or before them only.
    """

    tokens: tuple[str, ...]
    special: tuple[bool, ...]
    word_ids: tuple[int, ...]
    tags: tuple[str | None, ...] | None = None
    causal: bool = False

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0:
            raise ProgramError("A text for a program needs at least one token.")
        if len(self.special) != n or len(self.word_ids) != n:
            raise ProgramError(
                f"The text's features disagree in length: {n} tokens, {len(self.special)} "
                f"special flags, {len(self.word_ids)} word ids."
            )
        if self.tags is not None:
            if len(self.tags) != n:
                raise ProgramError(f"{len(self.tags)} tags for {n} tokens: give one per token.")
            bad = sorted({str(t) for t in self.tags if t is not None and t not in TAG_NAMES})
            if bad:
                raise ProgramError(f"Unknown tags {bad}: the tags are {_tag_list()}.")

    @classmethod
    def of(
        cls, tokens: Tokens, *, causal: bool, tags: Sequence[str | None] | None = None
    ) -> TextFeatures:
        """The features of a tokenized text (``mhsa.engine.tokens.Tokens``)."""
        return cls(
            tuple(tokens.strings),
            tuple(bool(s) for s in tokens.special),
            tuple(int(w) for w in tokens.word_ids),
            None if tags is None else tuple(tags),
            bool(causal),
        )

    def __len__(self) -> int:
        return len(self.tokens)

    @functools.cached_property
    def visible(self) -> np.ndarray:
        """``[n, n]`` bool: the keys each query may see."""
        n = len(self.tokens)
        full = np.ones((n, n), bool)
        return np.tril(full) if self.causal else full

    @functools.cached_property
    def position(self) -> tuple[np.ndarray, np.ndarray]:
        """Query and key positions as ``[n, 1]`` and ``[1, n]``."""
        pos = np.arange(len(self.tokens))
        return pos[:, None], pos[None, :]

    @functools.cached_property
    def same_token(self) -> np.ndarray:
        """``[n, n]`` bool: key k holds the query's token."""
        ids = {t: i for i, t in enumerate(dict.fromkeys(self.tokens))}
        codes = np.array([ids[t] for t in self.tokens])
        return codes[:, None] == codes[None, :]

    @functools.cached_property
    def words(self) -> np.ndarray:
        return np.array(self.word_ids)

    def tag_mask(self, tag: str) -> np.ndarray:
        """``[n]`` bool: the tokens tagged ``tag``."""
        if self.tags is None:
            raise ProgramError(
                f"pos and when programs read part-of-speech tags, and this text has none "
                f"(its corpus is not tagged): {tag!r} cannot be looked for."
            )
        return np.array([t == tag for t in self.tags])


def _normalised(keys: np.ndarray) -> np.ndarray:
    """Each row of a key set spread uniformly over its keys (a row of none stays zero)."""
    counts = keys.sum(1, keepdims=True)
    return np.divide(keys, counts, out=np.zeros(keys.shape), where=counts > 0)


# --- the programs -------------------------------------------------------------------------------


class Program:
    """An attention program (see the module docstring): a frozen tree of the classes below."""

    def __str__(self) -> str:
        raise NotImplementedError

    @property
    def kind(self) -> str:
        """``"positional"``, ``"token"``, ``"linguistic"`` (it reads tags) or ``"combination"``."""
        raise NotImplementedError

    @property
    def parts(self) -> tuple[Program, ...]:
        """The programs this one is made of (none for an atom)."""
        return ()

    @property
    def size(self) -> int:
        """The number of nodes: the search prefers the smaller of two equal programs."""
        return 1 + sum(p.size for p in self.parts)

    @property
    def needs_tags(self) -> bool:
        """Whether it reads part-of-speech tags (a ``pos`` or ``when`` in it)."""
        return any(p.needs_tags for p in self.parts)

    @property
    def main(self) -> Program:
        """The part with the most weight: a mix's heavier part (``mix(a, b, w)`` is
        ``w a + (1 - w) b``: ``a`` when w >= 0.5), a fallback's first (``a | b``: b only where
        a has no key), followed down; an atom, ``pos`` or ``when`` itself."""
        return self

    def phrase(self) -> str:
        """Where a query attends, as a phrase ("to the previous token")."""
        raise NotImplementedError

    def describe(self) -> str:
        """One sentence saying what the program does, generated from its parts."""
        return f"Attends {self.phrase()}."

    def pattern(self, features: TextFeatures) -> np.ndarray:
        """``[n, n]`` float64: each query's row sums to 1 over the keys it may see, or is all
        zero where the program gives the query no key."""
        return _normalised(self.keys(features) & features.visible)

    def keys(self, features: TextFeatures) -> np.ndarray:
        """``[n, n]`` bool: the keys of each query before visibility (atoms only)."""
        raise NotImplementedError

    def __or__(self, other: Program) -> Fallback:
        return Fallback(self, other)


@dataclass(frozen=True)
class Offset(Program):
    """The token ``d`` positions away (``key = query + d``)."""

    d: int

    def __str__(self) -> str:
        return f"offset({self.d})"

    @property
    def kind(self) -> str:
        return "positional"

    def phrase(self) -> str:
        d = self.d
        if d == 0:
            return "to itself"
        if abs(d) == 1:
            return "to the previous token" if d < 0 else "to the next token"
        return f"to the token {abs(d)} {'before' if d < 0 else 'after'} it"

    def keys(self, features: TextFeatures) -> np.ndarray:
        q, k = features.position
        return k == q + self.d


@dataclass(frozen=True)
class Atom(Program):
    """An atom without arguments: one of ``ATOMS``."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in ATOMS:
            raise ProgramError(f"No atom {self.name!r}: the atoms are {', '.join(ATOMS)}.")

    def __str__(self) -> str:
        return self.name

    @property
    def kind(self) -> str:
        return ATOMS[self.name][0]

    def phrase(self) -> str:
        return ATOMS[self.name][1]

    def keys(self, features: TextFeatures) -> np.ndarray:
        n = len(features)
        q, k = features.position
        name = self.name
        if name == "first":
            return np.broadcast_to(k == 0, (n, n))
        if name == "last":
            return np.broadcast_to(k == n - 1, (n, n))
        if name == "self":
            return q == k
        if name == "special":
            return np.broadcast_to(np.array(features.special)[None, :], (n, n))
        if name == "punctuation":
            from mhsa.engine.tokens import is_punctuation

            pairs = zip(features.tokens, features.special, strict=True)
            flags = [is_punctuation(t) and not s for t, s in pairs]
            return np.broadcast_to(np.array(flags)[None, :], (n, n))
        if name == "same_token":
            return features.same_token & (k < q)
        if name == "induction":
            earlier = features.same_token & (k < q)  # [q, j]: j an earlier copy
            after = np.zeros((n, n), bool)
            after[:, 1:] = earlier[:, :-1]  # key j + 1
            return after
        words = features.words
        in_word = (words[:, None] == words[None, :]) & (words[:, None] >= 0)
        if name == "same_word":
            return in_word
        # word_start: the first key of the query's word
        first = np.zeros((n, n), bool)
        rows = np.flatnonzero(words >= 0)
        if len(rows):
            starts = in_word[rows].argmax(1)
            first[rows, starts] = True
        return first


@dataclass(frozen=True)
class Pos(Program):
    """Keys tagged ``tag`` in another word than the query's, on side ``direction`` of it: the
    nearest one (``any``: nearest by distance, both at a tie) or ``all`` of them."""

    tag: str
    direction: str = "left"
    select: str = "nearest"

    def __post_init__(self) -> None:
        _check_tag(self.tag)
        if self.direction not in DIRECTIONS:
            raise ProgramError(
                f"pos's direction must be one of {', '.join(DIRECTIONS)}, got {self.direction!r}."
            )
        if self.select not in SELECTIONS:
            raise ProgramError(
                f"pos's selection must be one of {', '.join(SELECTIONS)}, got {self.select!r}."
            )

    def __str__(self) -> str:
        return f"pos({self.tag}, {self.direction}, {self.select})"

    @property
    def kind(self) -> str:
        return "linguistic"

    @property
    def needs_tags(self) -> bool:
        return True

    def phrase(self) -> str:
        noun = TAG_NAMES[self.tag][1]
        side = {"left": "on its left", "right": "on its right", "any": "on either side"}
        which = f"the nearest {noun}" if self.select == "nearest" else f"every {noun}"
        return f"to {which} {side[self.direction]}"

    def keys(self, features: TextFeatures) -> np.ndarray:
        q, k = features.position
        words = features.words
        other_word = (words[:, None] != words[None, :]) | (words[:, None] < 0)
        side = {"left": k < q, "right": k > q, "any": k != q}[self.direction]
        # visibility first: "nearest" is the nearest key the query may see
        keys = features.tag_mask(self.tag)[None, :] & other_word & side & features.visible
        if self.select == "all":
            return keys
        distance = np.where(keys, np.abs(k - q), np.iinfo(np.int64).max)
        nearest = distance.min(1, keepdims=True)
        return keys & (distance == nearest)


@dataclass(frozen=True)
class When(Program):
    """``program`` for the queries tagged ``tag``; other queries get no key."""

    tag: str
    program: Program

    def __post_init__(self) -> None:
        _check_tag(self.tag)

    def __str__(self) -> str:
        return f"when({self.tag}, {self.program})"

    @property
    def kind(self) -> str:
        return "linguistic"

    @property
    def parts(self) -> tuple[Program, ...]:
        return (self.program,)

    @property
    def needs_tags(self) -> bool:
        return True

    def phrase(self) -> str:
        return f"from {TAG_NAMES[self.tag][0]} {self.program.phrase()}"

    def pattern(self, features: TextFeatures) -> np.ndarray:
        rows = features.tag_mask(self.tag)
        return self.program.pattern(features) * rows[:, None]


@dataclass(frozen=True)
class Fallback(Program):
    """``first``'s keys; ``then``'s for the queries ``first`` gives none (``first | then``)."""

    first: Program
    then: Program

    def __str__(self) -> str:
        right = f"({self.then})" if isinstance(self.then, Fallback) else str(self.then)
        return f"{self.first} | {right}"

    @property
    def kind(self) -> str:
        return "combination"

    @property
    def parts(self) -> tuple[Program, ...]:
        return (self.first, self.then)

    @property
    def main(self) -> Program:
        return self.first.main

    def phrase(self) -> str:
        return f"{self.first.phrase()}; otherwise {self.then.phrase()}"

    def pattern(self, features: TextFeatures) -> np.ndarray:
        a = self.first.pattern(features)
        covered = a.sum(1) > 0
        return np.where(covered[:, None], a, self.then.pattern(features))


@dataclass(frozen=True)
class Mix(Program):
    """``w a + (1 - w) b``, rows renormalised (a row only one of them fills is that one's)."""

    a: Program
    b: Program
    w: float

    def __post_init__(self) -> None:
        w = self.w
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 < w < 1:
            raise ProgramError(f"mix's weight must be a number between 0 and 1, got {w!r}.")
        # to the digits ``str`` prints, so that a program equals its text read back
        object.__setattr__(self, "w", float(f"{float(w):g}"))

    def __str__(self) -> str:
        return f"mix({self.a}, {self.b}, {self.w:g})"

    @property
    def kind(self) -> str:
        return "combination"

    @property
    def parts(self) -> tuple[Program, ...]:
        return (self.a, self.b)

    @property
    def main(self) -> Program:
        return (self.a if self.w >= 0.5 else self.b).main

    def phrase(self) -> str:
        share = round(100 * self.w)
        return f"{share}% {self.a.phrase()} and {100 - share}% {self.b.phrase()}"

    def pattern(self, features: TextFeatures) -> np.ndarray:
        mixed = self.w * self.a.pattern(features) + (1 - self.w) * self.b.pattern(features)
        total = mixed.sum(1, keepdims=True)
        return np.divide(mixed, total, out=np.zeros_like(mixed), where=total > 0)


def _tag_list() -> str:
    return ", ".join(UNIVERSAL_TAGS)


def _check_tag(tag: object) -> None:
    if tag not in TAG_NAMES:
        raise ProgramError(
            f"Unknown part-of-speech tag {tag!r}: the tags are the Universal tagset's "
            f"{_tag_list()}."
        )


# --- parsing ------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<number>[+-]?\d+(?:\.\d*)?|[+-]?\.\d+)|(?P<name>[A-Za-z_]+)|(?P<op>[(),|.]))"
)


@dataclass
class _Parser:
    """A recursive-descent parser of the grammar::

    program := term ("|" term)*          (left to right: a | b | c is (a | b) | c)
    term    := "(" program ")" | ATOM | "offset" "(" INT ")"
             | "pos" "(" TAG "," DIRECTION "," SELECTION ")"
             | "when" "(" TAG "," program ")" | "mix" "(" program "," program "," NUMBER ")"
    """

    text: str
    tokens: list[tuple[str, str, int]]
    at: int = 0

    @classmethod
    def of(cls, text: str) -> _Parser:
        tokens, pos = [], 0
        while text[pos:].strip():
            m = _TOKEN.match(text, pos)
            if m is None:
                where = len(text) - len(text[pos:].lstrip())
                raise _error(text, where, f"unexpected character {text[where]!r}")
            kind = m.lastgroup or "op"
            tokens.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        tokens.append(("end", "", len(text)))
        return cls(text, tokens)

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.at]

    def take(self) -> tuple[str, str, int]:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def expect(self, op: str, what: str) -> None:
        kind, value, pos = self.take()
        if (kind, value) != ("op", op):
            found = "the end" if kind == "end" else repr(value)
            raise _error(self.text, pos, f"expected {op!r} {what}, found {found}")

    def program(self) -> Program:
        left = self.term()
        while self.peek()[:2] == ("op", "|"):
            self.take()
            left = Fallback(left, self.term())
        return left

    def term(self) -> Program:
        kind, value, pos = self.take()
        if (kind, value) == ("op", "("):
            inner = self.program()
            self.expect(")", "to close the parenthesis")
            return inner
        if kind != "name":
            found = "the end of the text" if kind == "end" else repr(value)
            raise _error(self.text, pos, f"expected a program, found {found}")
        name = value.lower()
        if name in ATOMS:
            return Atom(name)
        if name == "offset":
            self.expect("(", "after offset")
            d = self.number(integer=True, what="offset's distance")
            self.expect(")", "after offset's distance")
            return Offset(int(d))
        if name == "pos":
            self.expect("(", "after pos")
            tag = self.tag()
            self.expect(",", "after pos's tag")
            direction = self.word(DIRECTIONS, "pos's direction")
            self.expect(",", "after pos's direction")
            select = self.word(SELECTIONS, "pos's selection")
            self.expect(")", "after pos's selection")
            return Pos(tag, direction, select)
        if name == "when":
            self.expect("(", "after when")
            tag = self.tag()
            self.expect(",", "after when's tag")
            inner = self.program()
            self.expect(")", "after when's program")
            return When(tag, inner)
        if name == "mix":
            self.expect("(", "after mix")
            a = self.program()
            self.expect(",", "after mix's first program")
            b = self.program()
            self.expect(",", "after mix's second program")
            at = self.peek()[2]
            w = self.number(integer=False, what="mix's weight")
            self.expect(")", "after mix's weight")
            if not 0 < w < 1:
                raise _error(self.text, at, f"mix's weight must be between 0 and 1, got {w:g}")
            return Mix(a, b, w)
        names = ", ".join([*ATOMS, "offset(d)", "pos(...)", "when(...)", "mix(...)"])
        raise _error(self.text, pos, f"unknown program {value!r} (the forms are {names})")

    def number(self, *, integer: bool, what: str) -> float:
        kind, value, pos = self.take()
        if kind != "number" or (integer and "." in value):
            want = "a whole number" if integer else "a number"
            found = "the end" if kind == "end" else repr(value)
            raise _error(self.text, pos, f"expected {want} for {what}, found {found}")
        return float(value)

    def tag(self) -> str:
        kind, value, pos = self.take()
        tag = value.upper()
        if kind in ("name", "op") and tag in TAG_NAMES:
            return tag
        found = "the end" if kind == "end" else repr(value)
        raise _error(
            self.text, pos, f"unknown part-of-speech tag {found}: the tags are {_tag_list()}"
        )

    def word(self, choices: tuple[str, ...], what: str) -> str:
        kind, value, pos = self.take()
        if kind == "name" and value.lower() in choices:
            return value.lower()
        found = "the end" if kind == "end" else repr(value)
        raise _error(self.text, pos, f"{what} must be one of {', '.join(choices)}, found {found}")


def _error(text: str, pos: int, why: str) -> ProgramError:
    return ProgramError(f"Cannot read the program {text!r} at character {pos + 1}: {why}.")


def parse_program(text: str | Program) -> Program:
    """The program written in ``text`` (``str(program)`` reads back to an equal program).

    Raises:
        ProgramError: the text does not parse (the message names the character where and what
            was expected) or names an unknown tag (it lists the tags).
    """
    if isinstance(text, Program):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ProgramError(
            f"A program is a text such as 'offset(-1)' or 'when(NOUN, pos(DET, left, nearest))', "
            f"got {text!r}."
        )
    parser = _Parser.of(text)
    program = parser.program()
    kind, value, pos = parser.peek()
    if kind != "end":
        raise _error(text, pos, f"unexpected {value!r} after a whole program")
    return program


def program_pattern(
    program: str | Program,
    text: str,
    *,
    model: str | LoadedModel = "default",
    tags: Sequence[str | None] | None = None,
) -> np.ndarray:
    """The program's ``[n, n]`` pattern on ``text`` as ``model`` tokenizes it (the tokens of
    ``mhsa.attend``); ``tags``: one Universal tag per token (None for special tokens), needed
    by pos and when programs.

    Raises:
        ProgramError: the program does not parse, or it reads tags and none were given.
        InputError: an empty text, or a text over the model's limit.
    """
    from mhsa.engine.encoding import check_text, encode
    from mhsa.engine.models.loading import resolve_model
    from mhsa.engine.runs.swap import our_blocks

    parsed = parse_program(program)
    lm = resolve_model(model)
    with lm.lock:
        encoded = encode(lm, check_text(text), None, None)
        causal = bool(our_blocks(lm)[0].causal)
    features = TextFeatures.of(encoded.tokens, causal=causal, tags=tags)
    return parsed.pattern(features)

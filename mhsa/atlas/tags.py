"""Part-of-speech tags for the atlas: the Universal tagset, the Brown Corpus's tags mapped to it,
and a corpus's word tags aligned to the model's word pieces.

The Universal tagset is Petrov, Das and McDonald's (2012, "A Universal Part-of-Speech Tagset",
LREC; arXiv:1104.2086): twelve coarse tags, ``NOUN VERB ADJ ADV PRON DET ADP NUM CONJ PRT . X``.
Their project (universal-pos-tags, shipped by NLTK as ``taggers/universal_tagset``) maps the
Brown Corpus's tags to it in ``en-brown.map``, one line per tag as it occurs in the corpus,
affixes included (``ABN-HL``, ``FW-NN``, ``PPS+BEZ``); NLTK's ``brown.tagged_words(tagset=
"universal")`` reads it, and gives ``X`` to a tag the file lacks.

``BROWN_BASE`` is that mapping's table of base tags, and ``brown_to_universal`` its rules for
the affixes, written from the file's published rows (``ABL PRT``, ``ABN PRT``, ``ABN-HL PRT``,
``ABN-NC PRT``, ``ABN-TL PRT``, ``ABX DET``, ``AP ADJ``, ``AP$ PRT``, ``AP+AP-NC ADJ``,
``AP-HL ADJ``, ``AP-NC ADJ``, ``AP-TL ADJ``, ``AT DET``) and checked against NLTK's counts of
the Brown news category under the Universal tagset (NLTK book, chapter 5, section 2.3):
over the category's 100,554 tokens, VERB 14,399, ADP 12,355, ``.`` 11,928, DET 11,389,
ADJ 6,706, ADV 3,349, CONJ 2,717, PRON 2,535, NUM 2,166 and X 92 come out equal; NOUN and
PRT come out 30,652 and 2,266 (NLTK's book: 30,640 and 2,264, its twelve counts adding to 14
fewer than the category's tokens). The rules:

- ``FW-`` (a foreign word, any tag after it): ``X``;
- ``-HL`` (headline), ``-TL`` (title), ``-NC`` (cited word) and the corpus's cut forms ``-T``
  and ``-N`` after a tag: the tag's own;
- a compound tag (``PPS+BEZ`` "it's", ``PPSS+MD`` "I'd"): its parts' tag when they share one
  (``AP+AP`` "many-much": ADJ, as the published row ``AP+AP-NC ADJ``), else ``VERB`` when its
  first part is a verb (``MD+HV``, ``VB+PPO``), else ``PRT``: a contraction is not one word
  class, and the mapping files it with the function words (the news counts above decide
  this: PRON is exact only with ``PPS+BEZ`` and its kin out of it);
- ``*`` after a verb tag (negated, ``BEDZ*`` "wasn't"): the verb's; ``*`` alone ("not"): ADV;
- ``$`` (genitive) after a noun, pronoun or determiner tag: that tag's (``NN$``, ``PP$$``);
  after any other (``AP$`` "other's", ``CD$``, ``RB$``): ``PRT``;
- any other tag: ``X``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from mhsa.errors import InputError

__all__ = [
    "BROWN_BASE",
    "NO_TAG",
    "TAG_MEANINGS",
    "UNIVERSAL_TAGS",
    "align_tags",
    "brown_to_universal",
    "check_tag",
    "tag_id",
]

#: Petrov, Das and McDonald's twelve tags, in their paper's order; a tag's id in an atlas is
#: its index here
UNIVERSAL_TAGS: tuple[str, ...] = (
    "NOUN",
    "VERB",
    "ADJ",
    "ADV",
    "PRON",
    "DET",
    "ADP",
    "NUM",
    "CONJ",
    "PRT",
    ".",
    "X",
)
#: each tag in words, as Petrov, Das and McDonald gloss them (``"none"``: a token without a
#: tag, as ``Atlas.tag_histogram`` names it)
TAG_MEANINGS: dict[str, str] = {
    "NOUN": "noun (common and proper)",
    "VERB": "verb (all tenses and modes)",
    "ADJ": "adjective",
    "ADV": "adverb",
    "PRON": "pronoun",
    "DET": "determiner, article",
    "ADP": "adposition (preposition, postposition)",
    "NUM": "numeral",
    "CONJ": "conjunction",
    "PRT": "particle or other function word",
    ".": "punctuation",
    "X": "other (foreign word, typo, abbreviation)",
    "none": "no tag (special token)",
}
#: the tag id an atlas stores for a token without a tag (a special token, a piece no word covers)
NO_TAG = 255

_VERBS = (
    "BE BED BEDZ BEG BEM BEN BER BEZ DO DOD DOZ HV HVD HVG HVN HVZ MD VB VBD VBG VBN VBZ"
).split()
#: the Brown Corpus's base tags (Francis and Kucera's manual) and their Universal tags, as
#: en-brown.map gives them (see the module's docstring)
BROWN_BASE: dict[str, str] = {
    **{p: "." for p in (".", ",", ":", "(", ")", "--", "``", "''", "'")},
    "*": "ADV",
    "ABL": "PRT",
    "ABN": "PRT",
    "ABX": "DET",
    "AP": "ADJ",
    "AT": "DET",
    **{v: "VERB" for v in _VERBS},
    "CC": "CONJ",
    "CD": "NUM",
    "CS": "ADP",
    "DT": "DET",
    "DTI": "DET",
    "DTS": "DET",
    "DTX": "DET",
    "EX": "PRT",
    "IN": "ADP",
    "JJ": "ADJ",
    "JJR": "ADJ",
    "JJS": "ADJ",
    "JJT": "ADJ",
    "NN": "NOUN",
    "NNS": "NOUN",
    "NP": "NOUN",
    "NPS": "NOUN",
    "NR": "NOUN",
    "NRS": "NOUN",
    "OD": "ADJ",
    "PN": "NOUN",
    "PP$": "DET",
    "PP$$": "PRON",
    "PPL": "PRON",
    "PPLS": "PRON",
    "PPO": "PRON",
    "PPS": "PRON",
    "PPSS": "PRON",
    "QL": "ADV",
    "QLP": "ADV",
    "RB": "ADV",
    "RBR": "ADV",
    "RBT": "ADV",
    "RN": "ADV",
    "RP": "PRT",
    "TO": "PRT",
    "UH": "PRT",
    "WDT": "DET",
    "WP$": "DET",
    "WPO": "PRON",
    "WPS": "PRON",
    "WQL": "ADV",
    "WRB": "ADV",
}
_AFFIXES = re.compile(r"(?:-(?:HL|TL|NC|T|N))+$")
_GENITIVE_KEEPS = {"NOUN", "PRON", "DET"}


def _base(tag: str) -> str | None:
    """A simple tag's (no ``+``, no affix) Universal tag; None when the table lacks it."""
    if tag in BROWN_BASE:
        return BROWN_BASE[tag]
    if tag.endswith("*") and tag.rstrip("*") in BROWN_BASE:
        return BROWN_BASE[tag.rstrip("*")]
    if tag.endswith("$"):
        inner = _base(tag[:-1])
        if inner is None:
            return None
        return inner if inner in _GENITIVE_KEEPS else "PRT"
    return None


def brown_to_universal(tag: str) -> str:
    """The Universal tag of a Brown Corpus tag (any case, with its affixes: ``np-tl``,
    ``FW-NN``, ``PPS+BEZ``, ``BEDZ*``), by the rules of the module's docstring.

    >>> brown_to_universal("nn-tl"), brown_to_universal("PPS+BEZ"), brown_to_universal("fw-at")
    ('NOUN', 'PRT', 'X')
    """
    t = str(tag).strip().upper()
    if t.startswith("FW-"):
        return "X"
    if t not in BROWN_BASE:  # "--" and "---HL" are a dash, not an affix
        t = _AFFIXES.sub("", t) or t
    parts = t.split("+")
    if len(parts) > 1:
        mapped = {_base(p) for p in parts}
        if len(mapped) == 1 and None not in mapped:
            return mapped.pop()
        return "VERB" if _base(parts[0]) == "VERB" else "PRT"
    found = _base(t)
    return "X" if found is None else found


def check_tag(tag: object, what: str = "tag") -> str:
    """``tag`` when it is one of ``UNIVERSAL_TAGS`` (any case).

    Raises:
        InputError: another value, with the valid tags listed.
    """
    if isinstance(tag, str) and tag.strip().upper() in UNIVERSAL_TAGS:
        return tag.strip().upper()
    raise InputError(
        f"Unknown {what} {tag!r}: the atlas's tags are the Universal tagset's "
        f"{', '.join(UNIVERSAL_TAGS)} (Petrov, Das and McDonald 2012)."
    )


def tag_id(tag: str | None) -> int:
    """A tag's id in an atlas (its index in ``UNIVERSAL_TAGS``; ``NO_TAG`` for None)."""
    return NO_TAG if tag is None else UNIVERSAL_TAGS.index(check_tag(tag))


def _word_spans(text: str, words: Sequence[str]) -> list[tuple[int, int]]:
    """Each word's character span in ``text``, found left to right.

    Raises:
        InputError: a word that does not occur where the previous one ends or after it.
    """
    spans, cursor = [], 0
    for word in words:
        if not isinstance(word, str) or not word:
            raise InputError(f"A corpus word must be a non-empty string, got {word!r}.")
        start = text.find(word, cursor)
        if start < 0:
            raise InputError(
                f"The word {word!r} is not in the text after character {cursor}: a tagged "
                f"text's words must appear in it, in order ({text[:60]!r})."
            )
        spans.append((start, start + len(word)))
        cursor = start + len(word)
    return spans


def align_tags(
    text: str,
    words: Sequence[str],
    tags: Sequence[str],
    offsets: Sequence[tuple[int, int] | None],
) -> list[str | None]:
    """One tag per model token: each token takes the tag of the corpus word that covers its
    first character (its first that is not a space: a byte-level BPE token such as ``"Ġcat"``
    may start at the space before its word).

    Args:
        text: the text as the model read it.
        words: its words in order, each as it is written in ``text`` (a corpus's tokens:
            ``"do"`` and ``"n't"``, ``"well-known"``, ``"1,200"``).
        tags: one Universal tag per word.
        offsets: each token's ``(start, end)`` character span in ``text``, as a fast
            tokenizer's ``offset_mapping`` gives it; an empty span (``(0, 0)``: the special
            tokens) or None gets no tag.

    Returns:
        A tag or None per token (None: a special token, or a piece no word covers).

    Raises:
        InputError: words and tags of different lengths, a tag outside the Universal tagset,
            or a word not found in the text.
    """
    if len(words) != len(tags):
        raise InputError(
            f"A tagged text needs one tag per word: {len(words)} words, {len(tags)} tags."
        )
    tags = [check_tag(t) for t in tags]
    spans = _word_spans(text, words)
    starts = [a for a, _ in spans]
    out: list[str | None] = []
    for span in offsets:
        if span is None or span[1] <= span[0]:
            out.append(None)
            continue
        first = span[0]
        while first < span[1] and text[first].isspace():
            first += 1
        if first >= span[1]:  # a token of spaces alone
            out.append(None)
            continue
        w = bisect.bisect_right(starts, first) - 1
        out.append(tags[w] if w >= 0 and first < spans[w][1] else None)
    return out

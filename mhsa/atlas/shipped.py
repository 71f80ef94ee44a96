"""Where the app finds atlases, and the atlases it ships: the embedded model's over the Brown
Corpus and ``toy:induction``'s over its task (``python -m mhsa atlas build --default``; the
Docker image builds them)."""

from __future__ import annotations

import os
from pathlib import Path

from mhsa.atlas.corpora import default_corpus
from mhsa.atlas.reader import Atlas, open_atlas
from mhsa.atlas.run import build_atlas
from mhsa.engine.models.store import default_store_folder, store_root
from mhsa.errors import InputError

__all__ = [
    "DEFAULT_ATLASES",
    "DEFAULT_SENTENCES",
    "atlas_dir",
    "atlas_dirs",
    "build_default_atlases",
    "list_atlases",
]

#: model -> folder name of the atlases ``--default`` builds
DEFAULT_ATLASES = {"default": "minilm-brown", "toy:induction": "toy-induction"}
#: Brown Corpus sentences of the shipped MiniLM atlas (about 100,000 tokens, 110 MB)
DEFAULT_SENTENCES = 4000


def atlas_dirs() -> list[Path]:
    """The folders of the app's atlases: ``MHSA_ATLAS_DIR`` (several separated by ``:``; the
    first receives atlases built from the page: the Docker image lists the store's volume, then
    its own prebuilt ones), else ``_atlases`` in the store: ``MHSA_STORE``'s folder, or where it
    is unset or blank the default store folder that ``scripts/run-app.sh`` gives its server
    (``mhsa.engine.models.store.default_store_folder``), so that a shell's ``python -m mhsa
    atlas build --default`` fills the atlases that server shows. Atlases sit beside the
    store's managed entries, which ``mhsa.engine.models.store`` leaves alone: an atlas is never
    evicted by ``MHSA_STORE_MB``."""
    given = [p for p in os.environ.get("MHSA_ATLAS_DIR", "").split(os.pathsep) if p.strip()]
    if given:
        return [Path(p.strip()).expanduser() for p in given]
    store = store_root() or default_store_folder()
    return [store / "_atlases"]


def atlas_dir() -> Path:
    """Where new atlases go: the first of ``atlas_dirs``."""
    return atlas_dirs()[0]


def list_atlases(folder: Path | None = None) -> dict[str, Atlas | InputError]:
    """Every atlas in ``folder`` (default: each of ``atlas_dirs()``, the first holding a name
    wins) by folder name, or the reason one cannot be opened (reported, never raised: one bad
    folder hides none of the others)."""
    found: dict[str, Atlas | InputError] = {}
    for root in atlas_dirs() if folder is None else [folder]:
        if not root.is_dir():
            continue
        for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if sub.name in found:
                continue
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

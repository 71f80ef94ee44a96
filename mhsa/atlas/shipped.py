"""Where the app finds atlases, and the atlases it ships: the embedded model's over the Brown
Corpus and ``toy:induction``'s over its task (``python -m mhsa atlas build --default``; the
Docker image builds them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mhsa.atlas.corpora import default_corpus
from mhsa.atlas.reader import Atlas, open_atlas
from mhsa.atlas.run import build_atlas
from mhsa.engine.models.store import default_store_folder, store_root
from mhsa.errors import InputError

__all__ = [
    "BUILDING",
    "DEFAULT_ATLASES",
    "DEFAULT_SENTENCES",
    "atlas_dir",
    "atlas_dirs",
    "build_default_atlases",
    "build_in_background",
    "build_status",
    "list_atlases",
    "run_background_build",
]

#: the file, in an atlas's folder, where a build in the background keeps its state (its
#: process, texts done, or why it failed); removed when the atlas is there
BUILDING = ".building.json"

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
    folder hides none of the others). A folder that a background build is filling
    (``BUILDING``) is left out until its atlas is there."""
    found: dict[str, Atlas | InputError] = {}
    for root in atlas_dirs() if folder is None else [folder]:
        if not root.is_dir():
            continue
        for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if sub.name in found:
                continue
            if (sub / BUILDING).is_file() and not (sub / "manifest.json").is_file():
                continue  # building in the background: its state is build_status's
            try:
                found[sub.name] = open_atlas(sub)
            except InputError as e:
                found[sub.name] = e
    return found


def build_default_atlases(
    sentences: int | None = None, root: Path | None = None, models: list[str] | None = None
) -> dict[str, Path]:
    """Build (or resume, or reuse) the shipped atlases (``models``: those of them alone);
    returns model -> folder.

    Raises:
        InputError: a model that has no shipped atlas, or a corpus that cannot be read (the
            Brown Corpus with no network and no copy: the message says how to give one).
    """
    root = atlas_dir() if root is None else root
    count = _count(sentences)
    out = {}
    for model in _shipped(models):
        folder = root / DEFAULT_ATLASES[model]
        build_atlas(default_corpus(model, count), folder, model=model)
        out[model] = folder
    return out


def _count(sentences: int | None) -> int | None:
    return DEFAULT_SENTENCES if sentences is None else (None if sentences == 0 else sentences)


def _shipped(models: list[str] | None) -> list[str]:
    chosen = list(DEFAULT_ATLASES) if models is None else list(models)
    unknown = [m for m in chosen if m not in DEFAULT_ATLASES]
    if unknown:
        raise InputError(
            f"No shipped atlas of {unknown[0]!r}: the app ships atlases of "
            f"{', '.join(DEFAULT_ATLASES)}."
        )
    return chosen


def build_status(model: str, root: Path | None = None) -> dict | None:
    """The state of the shipped atlas of ``model`` being built in the background
    (``build_in_background``): None when no such build was started or its atlas is there;
    else ``{"state": "running" | "failed" | "stopped", "texts": done, "total": texts,
    "started": seconds since the epoch, "message": why it failed ("" otherwise)}``;
    "stopped": its process is gone without a word (killed; a new start resumes it)."""
    folder = (atlas_dir() if root is None else root) / DEFAULT_ATLASES[model]
    if (folder / "manifest.json").is_file():
        return None
    try:
        state = json.loads((folder / BUILDING).read_text())
    except (OSError, ValueError):
        return None
    if state.get("state") == "running" and not _alive(int(state.get("pid", 0))):
        state["state"] = "stopped"
    return state


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it is there
        return True
    return True


def build_in_background(model: str, root: Path | None = None, sentences: int | None = None) -> str:
    """Start building the shipped atlas of ``model`` in a process of its own (``python -m
    mhsa atlas build --default --only MODEL``, its output in ``BUILDING``'s folder as
    ``.building.log``), unless its atlas is there or a build of it runs: returns "ready",
    "running" or "started". A lock in the atlas directory keeps two starters apart, so a
    build is never started twice; a stopped or failed one is started again (and resumes)."""
    root = atlas_dir() if root is None else root
    _shipped([model])
    folder = root / DEFAULT_ATLASES[model]
    folder.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(root / f".{DEFAULT_ATLASES[model]}.start.lock")):
        if (folder / "manifest.json").is_file():
            return "ready"
        status = build_status(model, root)
        if status is not None and status["state"] == "running":
            return "running"
        command = [sys.executable, "-m", "mhsa", "atlas", "build", "--default", "--only", model]
        if sentences is not None:
            command += ["--sentences", str(sentences)]
        env = {**os.environ, "MHSA_ATLAS_DIR": str(root)}
        with open(folder / ".building.log", "ab") as log:
            child = subprocess.Popen(
                [*command, "--as-background"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # outlives the server that started it
            )
        _write_state(folder, {"state": "running", "pid": child.pid, "texts": 0, "total": 0})
        return "started"


def run_background_build(model: str, sentences: int | None = None) -> None:
    """The body of a background build (``build_in_background``'s process): the build, its
    progress in ``BUILDING`` as it goes, and on failure the reason there."""
    from mhsa.errors import MHSAError

    root = atlas_dir()
    folder = root / DEFAULT_ATLASES[model]
    started = time.time()
    state = {"state": "running", "pid": os.getpid(), "texts": 0, "total": 0, "started": started}
    _write_state(folder, state)

    def report(texts: int, total: int, _tokens: int) -> None:
        _write_state(folder, {**state, "texts": texts, "total": total})

    try:
        build_atlas(default_corpus(model, _count(sentences)), folder, model=model, progress=report)
    except MHSAError as e:
        _write_state(folder, {**state, "state": "failed", "message": str(e)})
        raise
    (folder / BUILDING).unlink(missing_ok=True)


def _write_state(folder: Path, state: dict) -> None:
    state = {"started": time.time(), "message": "", **state}
    tmp = folder / f"{BUILDING}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, folder / BUILDING)

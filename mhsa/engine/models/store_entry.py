"""One entry of the store on disk (``mhsa.engine.models.store``): its manifest, the check that reads
it back, and the ``flock`` locks the store's writers and readers take."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "Entry", "flock", "folder_files", "read_entry", "versions"]

#: the store's on-disk format: a store or an entry of a higher one was written by a newer version
FORMAT = 1


@dataclass(frozen=True)
class Entry:
    """One entry: where its files are, and its manifest (``settings`` is what it was made with)."""

    kind: str
    id: str
    folder: Path
    manifest: Mapping[str, Any]
    used: float  # seconds since the epoch of its last use

    @property
    def bytes(self) -> int:
        return int(self.manifest["bytes"])

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.manifest.get("settings", {})


def flock(path: Path, exclusive: bool, *, block: bool = True) -> int | None:
    """An open descriptor of ``path`` holding a flock (None: not free and ``block`` is False)."""
    import fcntl  # POSIX only: the store needs a system with flock

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if block else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, mode)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def folder_files(folder: Path) -> dict[str, int]:
    """Each file under ``folder`` (relative path) and its size in bytes."""
    return {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def versions() -> dict[str, str]:
    """The versions of what wrote an entry (those installed as packages)."""
    found = {"python": platform.python_version()}
    for name, dist in (("mhsa", "mhsa-explorer"), ("torch", "torch"), ("transformers", None)):
        try:
            found[name] = metadata.version(dist or name)
        except metadata.PackageNotFoundError:
            continue
    return found


def read_entry(kind: str, folder: Path) -> Entry | str:
    """The entry of ``kind`` in ``folder``, or why it is skipped (a clause: "its file x is
    missing"): its manifest must parse, name it, be of a format this version reads, and list
    files that are all there at their sizes."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        if not isinstance(manifest, dict):
            raise ValueError("not an object")
    except FileNotFoundError:
        return "it has no manifest.json"
    except (OSError, ValueError) as e:
        return f"its manifest.json cannot be read ({type(e).__name__}: {e})"
    fmt = manifest.get("format")
    if isinstance(fmt, int) and fmt > FORMAT:
        return f"a newer version wrote it (entry format {fmt}; this one reads {FORMAT})"
    files = manifest.get("files")
    if manifest.get("kind") != kind or manifest.get("id") != folder.name:
        return "its manifest.json names another entry"
    if not isinstance(files, dict) or not isinstance(manifest.get("bytes"), int):
        return "its manifest.json lists no files"
    for name, size in files.items():
        try:
            found = (folder / name).stat().st_size
        except OSError:
            return f"its file {name} is missing"
        if found != size:
            return f"its file {name} has {found} bytes where the manifest says {size}"
    try:
        used = folder.stat().st_mtime
    except OSError:
        return "it was removed while being read"
    return Entry(kind, folder.name, folder, manifest, used)

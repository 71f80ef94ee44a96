"""The store: what a server keeps by id on disk, across restarts and across replicas that share
one folder (``MHSA_STORE``): the models trained on the Train heads page (kind ``"trained"``,
``mhsa.engine.models.trained``) and the head atlases (kind ``"atlas"``). Any kind of entry uses the
same few calls:

- ``store_root()``: the folder ``MHSA_STORE`` names (None: unset, each process keeps its own).
- ``Store(root, max_mb=...)`` / ``Store.from_env()`` (``MHSA_STORE_MB`` bounds it).
- ``with store.writing(kind, entry_id, settings) as folder:`` write the entry's files into
  ``folder``, a temporary folder inside the store; when the block ends without an error, the
  manifest is written and the folder is renamed into place in one step (an error, or a process
  killed meanwhile, leaves nothing listed). Writers of one id take turns (a file lock).
- ``store.get_or_build(kind, entry_id, build, settings)``: the entry, built by ``build(folder)``
  unless it is there; a second process asking for the same id meanwhile waits for the first
  and reuses its entry (two replicas building the same atlas build it once).
- ``store.get(kind, entry_id)`` (marks it used), ``store.entries(kind)`` (least recently used
  first), ``store.path(kind, entry_id)``, ``store.touch``, ``store.remove``, ``store.clean()``.
- ``with store.pinned(kind, entry_id) as entry:`` (or ``store.pin(...)`` and ``release()``):
  an entry being read is never evicted or removed, by this process or any other.
- ``store.problems(kind)``: the bad entries, one line each (a corrupted manifest, a missing or
  truncated file, an entry written by a newer version); they are skipped, never raised.

On disk, under the root::

    store.json                   the store's format
    <kind>/<id>/                 an entry: its files, and manifest.json (written last): kind,
                                 id, when, settings, bytes, each file's size, the versions
    .tmp/<kind>--<id>--<random>  an entry being written (or the leftover of a killed writer:
                                 removed when a store opens, once no writer holds its lock)
    .locks/<kind>--<id>.lock     the writers' lock of an id
    .locks/<kind>--<id>.pin      the readers' pins (shared locks; eviction needs it exclusive)
    .locks/store.lock            held while an entry is fitted under the bound and put in place

A folder's modification time is its last use. ``MHSA_STORE_MB`` bounds the bytes of all entries:
a new entry evicts the least recently used unpinned ones, or is refused (``StoreFullError``,
saying how many MB it needs and what to raise). Locks are ``flock`` locks, which the system
releases when a process dies (``kill -9`` included): a dead writer never blocks anyone, and its
leftovers are known by their free lock. On NFS (a ReadWriteMany volume) Linux maps ``flock`` to
NFS byte-range locks, which hold across the machines; each process also takes its own thread
locks, since such locks do not exclude threads of one process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mhsa.engine.models.store_entry import FORMAT, Entry, flock, folder_files, read_entry, versions
from mhsa.errors import MHSAError

__all__ = [
    "DEFAULT_MB",
    "FORMAT",
    "Entry",
    "EntryMissingError",
    "Pin",
    "Store",
    "StoreError",
    "StoreFullError",
    "default_store_folder",
    "store_mb",
    "store_root",
]

#: megabytes of entries a store holds when ``MHSA_STORE_MB`` is unset
DEFAULT_MB = 2048
_KIND = re.compile(r"[a-z][a-z0-9-]{0,31}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SEP = "--"
_log = logging.getLogger("mhsa.store")


class StoreError(MHSAError):
    """The store cannot be used as asked (not writable, written by a newer version...)."""


class EntryMissingError(StoreError):
    """No usable entry of that id (never written, removed, evicted or damaged)."""


class StoreFullError(StoreError):
    """A new entry does not fit under ``MHSA_STORE_MB``, even with every unpinned entry gone."""


def store_root() -> Path | None:
    """The folder named by ``MHSA_STORE`` (None when unset or blank)."""
    raw = os.environ.get("MHSA_STORE", "").strip()
    return Path(raw).expanduser() if raw else None


def default_store_folder() -> Path:
    """The store folder ``scripts/run-app.sh`` gives its server when ``MHSA_STORE`` is unset
    (``mhsa-explorer/store`` in the user's cache folder, ``XDG_CACHE_HOME`` or ``~/.cache``),
    and so where the atlases of a shell's ``python -m mhsa atlas build --default`` go: one
    folder that both read. ``python -m mhsa.engine.models.store`` prints it (the script asks)."""
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.expanduser("~/.cache")
    return Path(cache) / "mhsa-explorer" / "store"


def store_mb() -> int:
    """The bound ``MHSA_STORE_MB`` sets, in megabytes (``DEFAULT_MB`` when unset).

    Raises:
        StoreError: it is not a whole number of 1 or more.
    """
    raw = os.environ.get("MHSA_STORE_MB", "").strip()
    if not raw:
        return DEFAULT_MB
    if not raw.isdigit() or int(raw) < 1:
        raise StoreError(f"MHSA_STORE_MB={raw!r} is not a whole number of megabytes (1 or more)")
    return int(raw)


class Pin:
    """A held pin (``Store.pin``): ``release()`` it when done reading."""

    def __init__(self, store: Store, key: tuple[str, str], entry: Entry) -> None:
        self._store, self._key, self.entry = store, key, entry
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._store._unpin(self._key)


@dataclass
class _InProcess:
    """What the threads of one process share about one store folder: flock locks exclude
    processes (on NFS, only processes), so threads take these first, and a process keeps one
    descriptor per pinned entry (closing any descriptor drops a process's NFS locks)."""

    threads: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    pins: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (count, fd)
    reported: set[str] = field(default_factory=set)
    mutex: threading.Lock = field(default_factory=threading.Lock)
    pin_lock: threading.Lock = field(default_factory=threading.Lock)


_PROCESS: dict[Path, _InProcess] = {}
_PROCESS_LOCK = threading.Lock()


class Store:
    """The entries under ``root`` (see the module's docstring), at most ``max_mb`` megabytes
    (2**20 bytes) of them (None: no bound). Opening a store checks its format, and removes the
    leftovers of writers that died.

    Raises:
        StoreError: the folder cannot be created, or a newer version wrote it.
    """

    def __init__(self, root: str | Path, *, max_mb: int | None = None) -> None:
        self.root = Path(root).expanduser().absolute()
        self.max_mb = max_mb
        with _PROCESS_LOCK:  # every Store object of one folder in this process shares these
            shared = _PROCESS.setdefault(self.root, _InProcess())
        self._threads, self._pins, self._reported = shared.threads, shared.pins, shared.reported
        self._mutex, self._pin_lock = shared.mutex, shared.pin_lock
        try:
            for sub in (".tmp", ".locks"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(self._unwritable(e)) from e
        self._check_format()
        self.sweep()

    @classmethod
    def from_env(cls) -> Store | None:
        """The store ``MHSA_STORE`` names, bounded by ``MHSA_STORE_MB`` (None: unset).

        Raises:
            StoreError: the folder cannot be used, or ``MHSA_STORE_MB`` is no number.
        """
        root = store_root()
        return None if root is None else cls(root, max_mb=store_mb())

    def _unwritable(self, e: OSError) -> str:
        return (
            f"The store folder {str(self.root)!r} (MHSA_STORE) is not writable "
            f"({e.strerror or e}): give a folder the server's user may write, or unset MHSA_STORE."
        )

    def _check_format(self) -> None:
        marker = self.root / "store.json"
        try:
            found = json.loads(marker.read_text()).get("format", FORMAT)
        except FileNotFoundError:
            found = None
        except (OSError, ValueError, AttributeError):
            found = FORMAT  # a damaged marker: rewritten below
        if isinstance(found, int) and found > FORMAT:
            raise StoreError(
                f"The store {str(self.root)!r} was written by a newer version of MHSA Explorer "
                f"(store format {found}; this one reads format {FORMAT}): upgrade, or give "
                f"MHSA_STORE another folder."
            )
        if found is None or not isinstance(found, int):
            self._write_json(marker, {"format": FORMAT})

    def check_writable(self) -> None:
        """Write and remove a file, as every entry will.

        Raises:
            StoreError: naming the folder and what to do.
        """
        probe = self.root / ".tmp" / f"probe-{secrets.token_hex(4)}"
        try:
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as e:
            raise StoreError(self._unwritable(e)) from e

    def _write_json(self, path: Path, value: Any) -> None:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        try:
            tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise StoreError(self._unwritable(e)) from e

    # --- names and locks -------------------------------------------------------------------

    @staticmethod
    def check_name(kind: str, entry_id: str) -> None:
        """Raises ``StoreError`` unless ``kind`` and ``entry_id`` can name an entry (no path
        separators, no leading dot, not too long)."""
        if not isinstance(kind, str) or not _KIND.fullmatch(kind):
            raise StoreError(f"{kind!r} is no kind of store entry (lower-case letters, digits, -)")
        if not isinstance(entry_id, str) or not _ID.fullmatch(entry_id) or _SEP in entry_id:
            raise StoreError(f"{entry_id!r} is no store entry id (letters, digits, _ . -)")

    def path(self, kind: str, entry_id: str) -> Path:
        """Where the entry ``kind``/``entry_id`` lives (whether or not it is there)."""
        self.check_name(kind, entry_id)
        return self.root / kind / entry_id

    def _lock_file(self, kind: str, entry_id: str, suffix: str) -> Path:
        return self.root / ".locks" / f"{kind}{_SEP}{entry_id}.{suffix}"

    @contextlib.contextmanager
    def _id_lock(self, kind: str, entry_id: str) -> Iterator[None]:
        """The writers' lock of one id: this process's threads, then every process."""
        with self._mutex:
            thread_lock = self._threads.setdefault((kind, entry_id), threading.Lock())
        with thread_lock:
            fd = flock(self._lock_file(kind, entry_id, "lock"), exclusive=True)
            try:
                yield
            finally:
                os.close(fd)  # closing releases the flock

    # --- reading ---------------------------------------------------------------------------

    def _report(self, kind: str, folder: Path, why: str) -> str:
        line = f"store entry {kind}/{folder.name} skipped: {why} ({folder})"
        with self._mutex:
            first = line not in self._reported
            self._reported.add(line)
        if first:
            _log.warning(line)
        return line

    def scan(self, kind: str | None = None) -> tuple[list[Entry], list[str]]:
        """``entries`` and ``problems`` in one pass over the folders."""
        entries, problems = [], []
        kinds = [kind] if kind is not None else self.kinds()
        for k in kinds:
            try:
                folders = sorted(p for p in (self.root / k).iterdir() if p.is_dir())
            except OSError:
                continue
            for folder in folders:
                if not _ID.fullmatch(folder.name):
                    continue
                found = read_entry(k, folder)
                if isinstance(found, Entry):
                    entries.append(found)
                else:
                    problems.append(self._report(k, folder, found))
        entries.sort(key=lambda e: (e.used, e.kind, e.id))
        return entries, problems

    def kinds(self) -> list[str]:
        """The kinds of entries the store has folders for."""
        try:
            return sorted(p.name for p in self.root.iterdir() if _KIND.fullmatch(p.name))
        except OSError:
            return []

    def entries(self, kind: str | None = None) -> list[Entry]:
        """The usable entries (of ``kind``; None: every kind), least recently used first. Bad
        ones are left out, reported once each in the log (``problems``)."""
        return self.scan(kind)[0]

    def problems(self, kind: str | None = None) -> list[str]:
        """One line per entry that ``entries`` leaves out, saying why."""
        return self.scan(kind)[1]

    def get(self, kind: str, entry_id: str, *, touch: bool = True) -> Entry:
        """The entry (marked as used now, unless ``touch`` is False).

        Raises:
            EntryMissingError: none is there, or it is damaged (the message says how).
        """
        folder = self.path(kind, entry_id)
        if not folder.is_dir():
            raise EntryMissingError(f"The store holds no {kind} {entry_id!r}.")
        found = read_entry(kind, folder)
        if isinstance(found, str):
            raise EntryMissingError(self._report(kind, folder, found))
        if touch:
            self.touch(kind, entry_id)
        return found

    def touch(self, kind: str, entry_id: str) -> None:
        """Mark the entry as used now (the least recently used go first)."""
        now = time.time_ns()
        with contextlib.suppress(OSError):  # a read-only or vanished entry: nothing to mark
            os.utime(self.path(kind, entry_id), ns=(now, now))

    # --- pins ------------------------------------------------------------------------------

    def pin(self, kind: str, entry_id: str) -> Pin:
        """Keep the entry from eviction and removal until ``release()``.

        Raises:
            EntryMissingError: as ``get``.
        """
        key = (kind, entry_id)
        self.check_name(kind, entry_id)
        with self._pin_lock:  # one descriptor per entry and process (NFS: locks are per process)
            count, fd = self._pins.get(key, (0, -1))
            if not count:
                fd = flock(self._lock_file(kind, entry_id, "pin"), exclusive=False)
            try:
                entry = self.get(kind, entry_id)  # after the pin: an evictor finished or waits
            except BaseException:
                if not count:
                    os.close(fd)
                raise
            self._pins[key] = (count + 1, fd)
        return Pin(self, key, entry)

    def _unpin(self, key: tuple[str, str]) -> None:
        with self._pin_lock:
            count, fd = self._pins.pop(key, (0, -1))
            if count > 1:
                self._pins[key] = (count - 1, fd)
            elif fd >= 0:
                os.close(fd)

    @contextlib.contextmanager
    def pinned(self, kind: str, entry_id: str) -> Iterator[Entry]:
        """The entry, pinned while the block runs."""
        pin = self.pin(kind, entry_id)
        try:
            yield pin.entry
        finally:
            pin.release()

    def is_pinned_here(self, kind: str, entry_id: str) -> bool:
        with self._pin_lock:
            return (kind, entry_id) in self._pins

    # --- writing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(
        self, kind: str, entry_id: str, settings: Mapping[str, Any] | None = None
    ) -> Iterator[Path]:
        """A temporary folder inside the store to write the entry's files into; renamed into
        place, with its manifest, when the block ends (an error removes it). An existing entry
        of that id is replaced only if it is damaged.

        Raises:
            StoreError: the id is taken, or the store is not writable.
            StoreFullError: the entry does not fit under ``MHSA_STORE_MB``.
        """
        self.check_name(kind, entry_id)
        with self._id_lock(kind, entry_id):
            if isinstance(read_entry(kind, self.path(kind, entry_id)), Entry):
                raise StoreError(f"The store already holds {kind} {entry_id!r}.")
            with self._write(kind, entry_id, settings) as folder:
                yield folder

    def get_or_build(
        self,
        kind: str,
        entry_id: str,
        build: Callable[[Path], Any],
        settings: Mapping[str, Any] | None = None,
    ) -> Entry:
        """The entry, built first by ``build(folder)`` if the store lacks it. A process asking
        for an id that another is building waits for it, then reuses its entry."""
        self.check_name(kind, entry_id)
        with contextlib.suppress(EntryMissingError):
            return self.get(kind, entry_id)
        with self._id_lock(kind, entry_id):
            with contextlib.suppress(EntryMissingError):
                return self.get(kind, entry_id)  # built meanwhile by the one we waited for
            with self._write(kind, entry_id, settings) as folder:
                build(folder)
        return self.get(kind, entry_id)

    @contextlib.contextmanager
    def _write(
        self, kind: str, entry_id: str, settings: Mapping[str, Any] | None
    ) -> Iterator[Path]:
        """Under the id's lock: the temporary folder, then the manifest, room, and the rename."""
        name = f"{kind}{_SEP}{entry_id}{_SEP}{secrets.token_hex(4)}"
        tmp = self.root / ".tmp" / name
        try:
            tmp.mkdir(parents=True)
        except OSError as e:
            raise StoreError(self._unwritable(e)) from e
        try:
            yield tmp
            files = folder_files(tmp)
            manifest = {
                "format": FORMAT,
                "kind": kind,
                "id": entry_id,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "settings": dict(settings or {}),
                "bytes": sum(files.values()),
                "files": files,
                "versions": versions(),
                "writer": {"host": socket.gethostname(), "pid": os.getpid()},
            }
            self._write_json(tmp / "manifest.json", manifest)
            self._commit(tmp, kind, entry_id, manifest["bytes"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already when it was put in place

    def _commit(self, tmp: Path, kind: str, entry_id: str, size: int) -> None:
        """Fit ``size`` bytes under the bound (evicting) and rename ``tmp`` into place, holding
        the store's lock, so that two writers never both count the same free room."""
        fd = flock(self.root / ".locks" / "store.lock", exclusive=True)
        try:
            if self.max_mb is not None:
                self._make_room(size)
            final = self.path(kind, entry_id)
            final.parent.mkdir(exist_ok=True)
            if final.exists():  # a damaged entry of this id: out of the way first
                self._discard(final)
            os.rename(tmp, final)
            self.touch(kind, entry_id)
        finally:
            os.close(fd)

    def _make_room(self, size: int) -> None:
        limit = self.max_mb * 2**20
        entries = self.entries()
        held = sum(e.bytes for e in entries)
        for entry in entries:  # least recently used first
            if held + size <= limit:
                return
            if self._evict(entry):
                held -= entry.bytes
                _log.info(
                    "store: evicted %s/%s (%d bytes) for room", entry.kind, entry.id, entry.bytes
                )
        if held + size <= limit:
            return
        mb = 2**20
        raise StoreFullError(
            f"The store has no room for this {size / mb:.1f} MB: it holds at most "
            f"{self.max_mb} MB (MHSA_STORE_MB), and {held / mb:.1f} MB of it are entries in use "
            f"right now. Raise MHSA_STORE_MB to at least {-(-(held + size) // mb)}, or remove "
            f"entries (python -m mhsa store list, then store remove ID)."
        )

    def _evict(self, entry: Entry) -> bool:
        """Remove ``entry`` unless a process has it pinned (this one or another)."""
        if self.is_pinned_here(entry.kind, entry.id):
            return False
        fd = flock(self._lock_file(entry.kind, entry.id, "pin"), exclusive=True, block=False)
        if fd is None:
            return False
        try:
            return self._discard(entry.folder)
        finally:
            os.close(fd)

    def _discard(self, folder: Path) -> bool:
        """Rename ``folder`` out of sight at once, then delete it."""
        trash = self.root / ".tmp" / f"trash{_SEP}{folder.name}{_SEP}{secrets.token_hex(4)}"
        try:
            os.rename(folder, trash)
        except FileNotFoundError:
            return False  # another process removed it first
        shutil.rmtree(trash, ignore_errors=True)
        return True

    # --- managing --------------------------------------------------------------------------

    def remove(self, kind: str, entry_id: str) -> None:
        """Remove one entry (damaged ones too).

        Raises:
            EntryMissingError: there is none.
            StoreError: a process is reading it (pinned).
        """
        folder = self.path(kind, entry_id)
        if not folder.is_dir():
            raise EntryMissingError(f"The store holds no {kind} {entry_id!r}.")
        if self.is_pinned_here(kind, entry_id):
            raise StoreError(f"{kind} {entry_id!r} is in use: try again once it is closed.")
        fd = flock(self._lock_file(kind, entry_id, "pin"), exclusive=True, block=False)
        if fd is None:
            raise StoreError(
                f"{kind} {entry_id!r} is in use on a server (a page reads it): try again later."
            )
        try:
            self._discard(folder)
        finally:
            os.close(fd)

    def sweep(self) -> list[str]:
        """Remove what dead writers left in ``.tmp`` (a leftover's lock is free once its writer
        has died); returns what was removed."""
        removed = []
        try:
            leftovers = sorted((self.root / ".tmp").iterdir())
        except OSError:
            return removed
        for tmp in leftovers:
            parts = tmp.name.split(_SEP)
            if parts[0] == "trash":
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(tmp.name)
                continue
            if len(parts) != 3 or not _KIND.fullmatch(parts[0]) or not _ID.fullmatch(parts[1]):
                continue
            with self._mutex:
                thread_lock = self._threads.setdefault((parts[0], parts[1]), threading.Lock())
            if not thread_lock.acquire(blocking=False):
                continue  # this process is writing it
            try:
                fd = flock(self._lock_file(parts[0], parts[1], "lock"), True, block=False)
                if fd is None:
                    continue  # a live writer, in another process
                try:
                    if tmp.exists():
                        shutil.rmtree(tmp, ignore_errors=True)
                        removed.append(tmp.name)
                finally:
                    os.close(fd)
            finally:
                thread_lock.release()
        return removed

    def clean(self) -> list[str]:
        """Remove the leftovers of dead writers and the damaged entries (not those a newer
        version wrote: it still reads them); returns a line for each."""
        lines = [f"removed the leftover {name}" for name in self.sweep()]
        for kind in self.kinds():
            for folder in sorted(p for p in (self.root / kind).iterdir() if p.is_dir()):
                why = read_entry(kind, folder) if _ID.fullmatch(folder.name) else None
                if not isinstance(why, str) or why.startswith("a newer version"):
                    continue
                try:
                    self.remove(kind, folder.name)
                except StoreError as e:
                    lines.append(f"kept {kind}/{folder.name}: {e}")
                else:
                    lines.append(f"removed {kind}/{folder.name}: {why}")
        return lines


if __name__ == "__main__":  # the default folder, for scripts/run-app.sh
    print(default_store_folder())

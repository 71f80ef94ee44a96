"""Models trained on the Train heads page, held so that every page and both engines can open them
by name (``trained:<id>``) like any other model.

A trained model is a normal transformers folder (``mhsa.training.save_model``), an entry of kind
``"trained"`` in a store (``mhsa.engine.models.store``): written whole or not at all, with a
manifest
(its training settings, when, its size, the versions that wrote it).

- ``MHSA_STORE`` set: the store is that folder, shared by every process and replica that names
  it and kept across restarts. A ``trained:<id>`` link opens on any of them; ``models()`` lists
  them all. Each process pins the ``MHSA_TRAINED_MODELS`` models it used last (its pages read
  them), so that no other process evicts them under ``MHSA_STORE_MB``.
- unset (the library's default): a temporary store of this process, removed when it exits; it
  keeps the ``MHSA_TRAINED_MODELS`` models used last (the oldest removed), and a link naming
  one opens only in this process (``ui.state.model_param`` falls back with a notice otherwise).

Ids are random; a link's training settings and seed are what let anyone train the same model
again.
"""

from __future__ import annotations

import atexit
import functools
import re
import secrets
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mhsa.engine.models.limits import Limits
from mhsa.engine.models.names import TRAINED_PREFIX, is_trained_name
from mhsa.engine.models.store import Entry, EntryMissingError, Pin, Store
from mhsa.errors import ModelLoadError

__all__ = [
    "KIND",
    "TRAINED_PREFIX",
    "TrainedModel",
    "TrainedModelStore",
    "is_trained_name",
    "trained_store",
]

#: the store's kind of entry for a trained model
KIND = "trained"
_ID = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True)
class TrainedModel:
    """One held model: its name in the model box, its folder, and what it was trained with."""

    id: str
    folder: Path
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{TRAINED_PREFIX}{self.id}"

    @classmethod
    def of(cls, entry: Entry) -> TrainedModel:
        return cls(entry.id, entry.folder / "model", dict(entry.settings))


class TrainedModelStore:
    """Trained models in a store (``mhsa.engine.models.store.Store``; see the module's docstring).

    Args:
        capacity: models this process holds (pins), least recently used dropped first: from a
            shared store (``store``) it only unpins them; from its own temporary store it
            removes them.
        root: where the temporary store's folder goes (default: the system's temporary
            folder); ignored with ``store``.
        store: a shared store (``Store.from_env()``: ``MHSA_STORE``); None: a temporary one.

    Safe to use from several threads.
    """

    def __init__(
        self, capacity: int, *, root: str | Path | None = None, store: Store | None = None
    ) -> None:
        if capacity < 1:
            raise ValueError(f"a store of trained models needs room for at least 1, not {capacity}")
        self.capacity = capacity
        self.shared = store is not None
        if store is None:
            if root is not None:
                Path(root).mkdir(parents=True, exist_ok=True)
            store = Store(tempfile.mkdtemp(prefix="mhsa-store-", dir=root))
        self.store = store
        self._lock = threading.Lock()
        self._held: OrderedDict[str, tuple[TrainedModel, Pin]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.store.entries(KIND))

    def add(
        self, save: Callable[[Path], Any], info: Mapping[str, Any] | None = None
    ) -> TrainedModel:
        """Keep a new model: ``save(folder)`` writes it into a fresh folder (which it must
        create; it does not exist yet), inside a temporary folder of the store that is renamed
        into place once ``save`` has returned. A ``save`` that raises leaves nothing behind.

        Returns:
            The model, held; the least recently used one is dropped if this process holds
            ``capacity``.

        Raises:
            mhsa.engine.models.store.StoreFullError: it does not fit under ``MHSA_STORE_MB``.
        """
        model_id = secrets.token_hex(6)
        with self.store.writing(KIND, model_id, info) as folder:
            save(folder / "model")
        with self._lock:
            return self._hold(model_id)

    def _hold(self, model_id: str) -> TrainedModel:
        """Pin the entry and hold it (under ``_lock``); drop the oldest held beyond capacity."""
        pin = self.store.pin(KIND, model_id)
        model = TrainedModel.of(pin.entry)
        self._held[model_id] = (model, pin)
        while len(self._held) > self.capacity:
            old, old_pin = self._held.popitem(last=False)[1]
            old_pin.release()
            if not self.shared:
                self.store.remove(KIND, old.id)
        return model

    def __contains__(self, name: object) -> bool:
        model_id = self._id(name) if isinstance(name, str) else None
        if model_id is None:
            return False
        with self._lock:
            if model_id in self._held:
                return True
        try:
            self.store.get(KIND, model_id, touch=False)
        except EntryMissingError:
            return False
        return True

    def get(self, name: str) -> TrainedModel:
        """The model named ``trained:<id>`` (or just ``<id>``), marked as recently used and
        held by this process.

        Raises:
            ModelLoadError: the store has no such model (never trained with this store,
                removed, dropped to make room, or damaged: the server's log says how).
        """
        model_id = self._id(name)
        with self._lock:
            if model_id in self._held:
                self._held.move_to_end(model_id)
                self.store.touch(KIND, model_id)
                return self._held[model_id][0]
            if model_id is not None and self.shared:
                try:
                    return self._hold(model_id)
                except EntryMissingError as e:
                    if "skipped" in str(e):
                        raise ModelLoadError(
                            f"This server's copy of trained model {name.strip()!r} is damaged "
                            "and was skipped (the server's log says how). Train it again on the "
                            "Train heads page (a link to it carries the settings and the seed)."
                        ) from e
        raise ModelLoadError(self._missing(name))

    def _missing(self, name: str) -> str:
        shown = name.strip()
        if self.shared:
            where = (
                "its store (MHSA_STORE) has none of that name: it was removed, or dropped to "
                "make room for newer ones"
            )
        else:
            where = (
                "trained models live only in the server process that trained them, and only "
                f"the {self.capacity} most recently used are kept"
            )
        return (
            f"This server holds no trained model {shown!r}: {where}. Train it again on the Train "
            "heads page (a link to it carries the settings and the seed), or open a shipped one "
            "such as 'toy:induction'."
        )

    def models(self) -> list[TrainedModel]:
        """Every trained model in the store (a shared store: those of every process), least
        recently used first."""
        return [TrainedModel.of(e) for e in self.store.entries(KIND)]

    def release(self) -> None:
        """Drop what this process holds: unpin (a temporary store: remove) every model."""
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
        for model, pin in held:
            pin.release()
            if not self.shared:
                self.store.remove(KIND, model.id)

    def clear(self) -> None:
        """Remove every trained model of the store (a shared store: of every process too,
        except those another process has open)."""
        self.release()
        for entry in self.store.entries(KIND):
            try:
                self.store.remove(KIND, entry.id)
            except (EntryMissingError, ModelLoadError):
                continue
            except ValueError:  # in use elsewhere (StoreError): its process keeps it
                continue

    def close(self) -> None:
        """Release this process's models; a temporary store is removed with its folder."""
        self.release()
        if not self.shared:
            shutil.rmtree(self.store.root, ignore_errors=True)

    @staticmethod
    def _id(name: str) -> str | None:
        raw = name.strip().removeprefix(TRAINED_PREFIX)
        return raw if _ID.fullmatch(raw) else None


@functools.cache
def trained_store() -> TrainedModelStore:
    """The process's store of trained models: ``MHSA_STORE``'s folder, shared and kept, or
    (unset) a temporary one removed when the process exits; each process holds
    ``MHSA_TRAINED_MODELS`` of them.

    Raises:
        mhsa.engine.models.store.StoreError: ``MHSA_STORE`` names a folder that cannot be used.
    """
    shared = Store.from_env()
    store = TrainedModelStore(Limits.from_env().trained_models, store=shared)
    atexit.register(store.close)
    return store

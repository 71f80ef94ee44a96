"""Models trained in this process, held for a while so that every page and both engines can open
them by name (``trained:<id>``) like any other model.

A trained model is a normal transformers folder (``mhsa.training.save_model``) in a temporary
folder of its own. The store keeps at most ``MHSA_TRAINED_MODELS`` of them per process (least
recently used dropped, its folder removed), so that a class training all afternoon does not fill
the disk. Ids are random: a link naming one opens it only in the process that trained it, and
only while it is held (``ui.state.model_param`` falls back with a notice otherwise); the link's
training settings and seed are what let anyone else retrain the same model.
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

from mhsa.engine.limits import Limits
from mhsa.engine.model_names import TRAINED_PREFIX, is_trained_name
from mhsa.errors import ModelLoadError

__all__ = [
    "TRAINED_PREFIX",
    "TrainedModel",
    "TrainedModelStore",
    "is_trained_name",
    "trained_store",
]

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


class TrainedModelStore:
    """At most ``capacity`` trained models, each in a temporary folder of its own, least
    recently used dropped first (its folder removed). Safe to use from several threads."""

    def __init__(self, capacity: int, *, root: str | Path | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"a store of trained models needs room for at least 1, not {capacity}")
        self.capacity = capacity
        self._root = Path(root) if root is not None else None
        self._lock = threading.Lock()
        self._models: OrderedDict[str, TrainedModel] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._models)

    def add(
        self, save: Callable[[Path], Any], info: Mapping[str, Any] | None = None
    ) -> TrainedModel:
        """Hold a new model: ``save(folder)`` writes it into a fresh folder (which it must
        create; it does not exist yet). A ``save`` that raises leaves nothing behind.

        Returns:
            The held model; the least recently used one is dropped if the store was full.
        """
        if self._root is not None:
            self._root.mkdir(parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(prefix="mhsa-trained-", dir=self._root))
        try:
            save(home / "model")
        except BaseException:
            shutil.rmtree(home, ignore_errors=True)
            raise
        model = TrainedModel(secrets.token_hex(6), home / "model", dict(info or {}))
        with self._lock:
            self._models[model.id] = model
            dropped = [
                self._models.popitem(last=False)[1]
                for _ in range(len(self._models) - self.capacity)
            ]
        for old in dropped:
            shutil.rmtree(old.folder.parent, ignore_errors=True)
        return model

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        with self._lock:
            return self._id(name) in self._models

    def get(self, name: str) -> TrainedModel:
        """The held model named ``trained:<id>`` (or just ``<id>``), marked as recently used.

        Raises:
            ModelLoadError: no such model is held here (never trained in this process, or
                dropped to make room for newer ones).
        """
        with self._lock:
            model = self._models.get(self._id(name))
            if model is not None:
                self._models.move_to_end(model.id)
                return model
        raise ModelLoadError(
            f"This server holds no trained model {name.strip()!r}: trained models live only in "
            f"the server process that trained them, and only the {self.capacity} most recently "
            f"used are kept. Train it again on the Train heads page (a link to it carries the "
            f"settings and the seed), or open a shipped one such as 'toy:induction'."
        )

    def models(self) -> list[TrainedModel]:
        """The held models, least recently used first."""
        with self._lock:
            return list(self._models.values())

    def clear(self) -> None:
        """Drop every model and remove its folder."""
        with self._lock:
            dropped = list(self._models.values())
            self._models.clear()
        for model in dropped:
            shutil.rmtree(model.folder.parent, ignore_errors=True)

    @staticmethod
    def _id(name: str) -> str | None:
        raw = name.strip().removeprefix(TRAINED_PREFIX)
        return raw if _ID.fullmatch(raw) else None


@functools.cache
def trained_store() -> TrainedModelStore:
    """The process's store (``MHSA_TRAINED_MODELS`` models), emptied when the process exits."""
    store = TrainedModelStore(Limits.from_env().trained_models)
    atexit.register(store.clear)
    return store

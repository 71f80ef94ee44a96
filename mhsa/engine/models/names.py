"""What a model name means, in one place: ``"default"`` (the embedded all-MiniLM-L6-v2),
``"toy:<task>"`` (a shipped toy model, ``data/toy/<task>``), ``"trained:<id>"`` (a model trained
in this process, held by ``mhsa.engine.models.trained``), or anything else: a transformers model id
or a
folder; and whether the operator's limits allow it (``check_allowed``).

A leaf module (it imports nothing of ``mhsa`` but its errors): the limits, the store of trained
models, the model loader (``mhsa.engine.models.loading``, which maps a name to its folder) and the
training package all read it, so none of them needs another (no import cycle).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from mhsa.errors import ModelLoadError

__all__ = [
    "DATA_DIR",
    "DEFAULT_MODEL",
    "TOY_DIR",
    "TOY_PREFIX",
    "TRAINED_PREFIX",
    "AllowedModels",
    "allowed_description",
    "check_allowed",
    "is_toy_name",
    "is_trained_name",
    "shipped_toy_tasks",
    "toy_task",
]


class AllowedModels(Protocol):
    """What ``check_allowed`` reads of the operator's limits (``mhsa.engine.models.limits.Limits``):
    the models allowed besides the always-allowed ones (None: any model)."""

    allowed_models: tuple[str, ...] | None


#: the model box's name of the embedded all-MiniLM-L6-v2
DEFAULT_MODEL = "default"
#: the model box's name of a shipped toy model: ``toy:induction``
TOY_PREFIX = "toy:"
#: the model box's name of a model trained in this process: ``trained:<id>``
TRAINED_PREFIX = "trained:"


def _data_dir() -> Path:
    """The shipped data: ``mhsa/_data`` inside an installed wheel (pyproject.toml puts the
    repository's ``data/`` there), else ``data/`` of the repository this module sits in."""
    here = Path(__file__).resolve().parents[2]
    packaged = here / "_data"
    return packaged if packaged.is_dir() else here.parent / "data"


#: the shipped data (toy models, example sentences): ``data/`` of the repository, or
#: ``mhsa/_data`` of an installed wheel
DATA_DIR = _data_dir()
#: where the shipped toy models live: ``data/toy/<task>/`` (``DATA_DIR``)
TOY_DIR = DATA_DIR / "toy"
#: a task's name as a folder name: no path separators, no dots (``toy:../x`` names nothing)
_TASK = re.compile(r"[a-z0-9][a-z0-9-]*")


def shipped_toy_tasks() -> tuple[str, ...]:
    """The tasks of the shipped toy models: the folders of ``TOY_DIR`` holding a model
    (``config.json``), sorted."""
    if not TOY_DIR.is_dir():
        return ()
    found = (p.name for p in TOY_DIR.iterdir() if (p / "config.json").is_file())
    return tuple(sorted(t for t in found if _TASK.fullmatch(t)))


def toy_task(name: str) -> str | None:
    """The task of a model name ``toy:<task>`` naming a shipped toy model, else None."""
    if not isinstance(name, str) or not name.startswith(TOY_PREFIX):
        return None
    task = name[len(TOY_PREFIX) :]
    if not _TASK.fullmatch(task) or not (TOY_DIR / task / "config.json").is_file():
        return None
    return task


def is_toy_name(name: str) -> bool:
    """Whether ``name`` names a shipped toy model (``toy:<task>``)."""
    return toy_task(name) is not None


def is_trained_name(name: str) -> bool:
    """The name asks for a model trained in this process (whether or not it is held)."""
    return name.strip().startswith(TRAINED_PREFIX)


def check_allowed(name: str, limits: AllowedModels) -> None:
    """Refuse a model the operator has not allowed (``limits.allowed_models``; the embedded
    default, the shipped toy models, ``toy:<task>``, and the models this process trained,
    ``trained:<id>``, always are: a trained name opens only what ``mhsa.engine.models.trained``
    holds).

    Raises:
        ModelLoadError: the model is not allowed; the message lists those that are, in the same
            words whether or not such a folder or model exists.
    """
    if name == DEFAULT_MODEL or is_toy_name(name) or is_trained_name(name):
        return
    if limits.allowed_models is None:
        return
    wanted = name.rstrip("/")
    allowed = {m.rstrip("/") for m in limits.allowed_models}
    if wanted in allowed:
        return
    raise ModelLoadError(  # the same words whether or not such a folder or model exists
        f"This server does not load {name!r}. It loads {allowed_description(limits)}."
    )


def allowed_description(limits: AllowedModels) -> str:
    """What this server loads, in words: the default model, the shipped toy models, the models
    trained here, and the operator's list (``MHSA_ALLOWED_MODELS``; None: any model)."""
    toys = ", ".join(TOY_PREFIX + t for t in shipped_toy_tasks())
    parts = [
        f"the default model ({DEFAULT_MODEL})",
        f"the toy models ({toys})",
        "models trained on the Train heads page (trained:<id>)",
    ]
    if limits.allowed_models is None:
        parts.append("any model id or folder")
    elif limits.allowed_models:
        parts.append("these: " + ", ".join(limits.allowed_models))
    return ", ".join(parts[:-1]) + " and " + parts[-1]

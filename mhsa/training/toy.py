"""The shipped toy models (``data/toy/<task>/``, opened as ``toy:<task>``). What such a name
means is decided in ``mhsa.engine.models.names`` (re-exported here); saving a trained model as such
a
folder, with its model card, is ``mhsa.training.card``."""

from __future__ import annotations

from pathlib import Path

from mhsa.engine.models.names import TOY_DIR, TOY_PREFIX, is_toy_name, toy_task
from mhsa.training.card import model_card, save_model
from mhsa.training.tasks import task_spec

__all__ = [
    "TOY_DIR",
    "TOY_PREFIX",
    "is_toy_name",
    "model_card",
    "save_model",
    "toy_model_path",
    "toy_task",
]


def toy_model_path(task: str) -> Path:
    """The folder of the shipped ``task`` model: ``data/toy/<task>``.

    Raises:
        ValueError: no such task.
    """
    return TOY_DIR / task_spec(task).name

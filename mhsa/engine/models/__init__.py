"""Models and what their names mean: ``loading`` (loading a model and its tokenizer: the
embedded default, any model id or folder, the device), ``names`` (``"default"``, ``"toy:<task>"``,
``"trained:<id>"``, the shipped data), ``limits`` (a shared server's limits from the
environment), ``trained`` (models trained in this process, by name) and the store that keeps
trained models and atlases by id on disk (``store``, ``store_entry``: ``MHSA_STORE``).

May import: ``mhsa.engine.attention`` and the shared top-level modules of ``mhsa``
(``mhsa.errors``...). ``mhsa.engine.models.LoadedModel`` and the other names of ``loading``
are exported here too.
"""

from mhsa.registry import lazy_exports

__all__ = [
    "DEFAULT_MODEL",
    "LoadedModel",
    "check_allowed",
    "count_parameters",
    "cpu_threads",
    "default_model_path",
    "get_model",
    "last_logits_only",
    "load_model",
    "pick_device",
    "resolve_model",
]

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, __name__ + ".loading"))

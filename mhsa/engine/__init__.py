"""The engine: attention computed and read out of a model.

Sub-folders by concern, each saying in its docstring what it holds and may import:
``attention/`` (our ``MultiHeadSelfAttention`` and its parts: the core, rotary, q/k norms),
``families/`` (one module per model family: its blocks, weights and layer layout; which tools
run on which family), ``models/`` (loading models, what their names mean, limits, trained models
and the store by id), ``runs/`` (a model's forward pass through its own eager attention or our
module: swapping blocks, selected layers and heads, layer files, queries and keys, norms,
generation, corpora in batches) and ``stream/`` (the residual stream part by part). At this
level: texts in (``encoding``, ``tokens``), the engines (``extract``: text -> ``AttentionResult``),
the result (``result``), attention computed elsewhere (``interop``) and the process-wide cache of
results (``cache``).

May import: the shared top-level modules (``mhsa.errors``, ``mhsa.registry``,
``mhsa.deprecation``, ``mhsa.heads``) and nothing else of ``mhsa``: every other layer builds on
this one (``tests/test_layers.py``).

Its public names import from here (``mhsa.engine.attend_layers``), each when first asked
for: ``_EXPORTS`` says which module defines it.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "SUPPORTED_FOR_MHSA": "mhsa.engine.families.registry",
    "MultiHeadSelfAttention": "mhsa.engine.attention.module",
    "TraceStep": "mhsa.engine.attention.core",
    "attention_core": "mhsa.engine.attention.core",
    "scaled_dot_product_attention": "mhsa.engine.attention.core",
    "ENGINES": "mhsa.engine.extract",
    "ENGINE_DESCRIPTIONS": "mhsa.engine.extract",
    "ENGINE_LABELS": "mhsa.engine.extract",
    "ENGINE_SPECS": "mhsa.engine.extract",
    "EngineSpec": "mhsa.engine.extract",
    "attend": "mhsa.engine.extract",
    "attend_generated": "mhsa.engine.extract",
    "attend_layers": "mhsa.engine.extract",
    "MAX_NEW_TOKENS": "mhsa.engine.runs.generation",
    "Generation": "mhsa.engine.runs.generation",
    "generate": "mhsa.engine.runs.generation",
    "generate_ids": "mhsa.engine.runs.generation",
    "from_attention": "mhsa.engine.interop",
    "DEFAULT_MODEL": "mhsa.engine.models.names",
    "DEVICES": "mhsa.engine.models.loading",
    "LoadedModel": "mhsa.engine.models.loading",
    "cpu_threads": "mhsa.engine.models.loading",
    "get_model": "mhsa.engine.models.loading",
    "load_model": "mhsa.engine.models.loading",
    "pick_device": "mhsa.engine.models.loading",
    "norms_as_attention": "mhsa.engine.runs.norms",
    "ATTENTION_KINDS": "mhsa.engine.result",
    "AttentionResult": "mhsa.engine.result",
    "NotebookView": "mhsa.engine.result",
    "RotaryEmbedding": "mhsa.engine.attention.rotary",
    "ATTENTION_DTYPES": "mhsa.engine.runs.selection",
    "Selection": "mhsa.engine.runs.selection",
    "find_tokens": "mhsa.engine.tokens",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for (then kept)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

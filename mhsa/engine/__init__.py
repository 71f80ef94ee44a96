"""The engine: attention computed and read out of a model.

Holds the attention module and its parts (``attention``, ``core``, ``rotary``, ``rmsnorm``,
``frozen_norm``, ``layer_parts``), the model families (``families/``, ``adapters``,
``support``), swapping a model's blocks for ours and finding them (``swap``,
``block_search``), the runs (``forward``, ``residual``, ``postnorm_stream``,
``seq2seq_stream``, ``partial``, ``selection``, ``extract``, ``layer_files``, ``generation``),
text in and out (``encoding``, ``tokens``), corpora in padded batches (``batches``), models
and what their names mean (``models``,
``model_names``, ``limits``, ``trained``), the store that keeps trained models and atlases by
id (``store``, ``store_entry``: ``MHSA_STORE``), caches (``cache``), norms as attention (``norms``:
``attend(norms=True)`` computes them) and the result (``result``).

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
    "SUPPORTED_FOR_MHSA": "mhsa.engine.adapters",
    "MultiHeadSelfAttention": "mhsa.engine.attention",
    "TraceStep": "mhsa.engine.core",
    "attention_core": "mhsa.engine.core",
    "scaled_dot_product_attention": "mhsa.engine.core",
    "ENGINES": "mhsa.engine.extract",
    "ENGINE_DESCRIPTIONS": "mhsa.engine.extract",
    "ENGINE_LABELS": "mhsa.engine.extract",
    "ENGINE_SPECS": "mhsa.engine.extract",
    "EngineSpec": "mhsa.engine.extract",
    "attend": "mhsa.engine.extract",
    "attend_generated": "mhsa.engine.extract",
    "attend_layers": "mhsa.engine.extract",
    "MAX_NEW_TOKENS": "mhsa.engine.generation",
    "Generation": "mhsa.engine.generation",
    "generate": "mhsa.engine.generation",
    "generate_ids": "mhsa.engine.generation",
    "from_attention": "mhsa.engine.interop",
    "DEFAULT_MODEL": "mhsa.engine.model_names",
    "DEVICES": "mhsa.engine.models",
    "LoadedModel": "mhsa.engine.models",
    "cpu_threads": "mhsa.engine.models",
    "get_model": "mhsa.engine.models",
    "load_model": "mhsa.engine.models",
    "pick_device": "mhsa.engine.models",
    "norms_as_attention": "mhsa.engine.norms",
    "ATTENTION_KINDS": "mhsa.engine.result",
    "AttentionResult": "mhsa.engine.result",
    "NotebookView": "mhsa.engine.result",
    "RotaryEmbedding": "mhsa.engine.rotary",
    "ATTENTION_DTYPES": "mhsa.engine.selection",
    "Selection": "mhsa.engine.selection",
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

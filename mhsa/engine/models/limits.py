"""Operator limits for a shared server, read from environment variables (see README).

- MHSA_MAX_TOKENS (512): tokens per request; longer input is truncated, and the UI says how
  many tokens were dropped.
- MHSA_MAX_CHARS (100000): characters accepted from a text box or link.
- MHSA_ALLOWED_MODELS (empty): comma-separated model ids / folders allowed besides "default";
  empty (the default) allows only the embedded model, "*" allows any model id or folder (for a
  machine of one's own: on a shared server "*" lets anyone who sends a link make the server read
  any local folder or download any model).
- MHSA_MAX_PARAMETERS (400000000): larger models are refused, from their config, before loading.
- MHSA_MAX_ATTENTION_MB (256): megabytes of attention one request may keep, over its selected
  layers and heads in their storage dtype (``attend(max_attention_mb=...)``); a request over
  it is refused before the model runs, naming the numbers and the ways out (fewer layers or
  heads, float16). Pages over MHSA_MAX_TOKENS tokens or over this budget ask for a layer and
  a range of heads.
- MHSA_MODEL_CACHE (2): models kept loaded per process.
- MHSA_RESULT_CACHE_MB (512): megabytes of attention results kept per process, shared
  read-only by every session (least recently used dropped; one MiniLM result at the token
  limit holds layers x heads x tokens x tokens float32 weights, a large share of the default).
- MHSA_RESULT_CACHE (32): derived analyses (statistics, similarity...) kept per process.
- MHSA_MAX_CORPUS (50): sentences used from the statistics page's corpus box.
- MHSA_MAX_TRAIN_STEPS (5000): optimizer steps of one training run (``mhsa.training``).
- MHSA_MAX_TRAIN_PARAMETERS (5000000): parameters of a model trained here.
- MHSA_TRAINED_MODELS (4): models trained on the Train heads page (``trained:<id>`` in the model
  box) each process holds: with a store (MHSA_STORE) it keeps them pinned, without one they are
  all it keeps (least recently used dropped, its folder removed); ``mhsa.engine.models.trained``.
- MHSA_STORE (unset) and MHSA_STORE_MB (2048): the folder that keeps trained models and atlases
  across restarts and replicas, and its bound (``mhsa.engine.models.store``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from mhsa.engine.models.names import check_allowed

__all__ = ["Limits"]


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


@dataclass(frozen=True)
class Limits:
    max_tokens: int = 512
    max_chars: int = 100_000
    allowed_models: tuple[str, ...] | None = ()  # None: any model; (): the embedded one only
    max_parameters: int = 400_000_000
    max_attention_mb: int = 256
    model_cache: int = 2
    result_cache: int = 32
    result_cache_mb: int = 512
    max_corpus: int = 50
    max_train_steps: int = 5000
    max_train_parameters: int = 5_000_000
    trained_models: int = 4

    @classmethod
    def from_env(cls) -> Limits:
        raw = os.environ.get("MHSA_ALLOWED_MODELS", "").strip()
        allowed = None if raw == "*" else tuple(m.strip() for m in raw.split(",") if m.strip())
        ints = {
            f.name: _int_env(f"MHSA_{f.name.upper()}", f.default)
            for f in fields(cls)
            if f.type == "int"
        }
        return cls(allowed_models=allowed, **ints)

    def check_model(self, name: str) -> None:
        """Refuse a model the operator has not allowed:
        ``mhsa.engine.models.loading.check_allowed(name,
        self)`` (``mhsa.engine.models.names``, where what a model name means is decided)."""
        check_allowed(name, self)

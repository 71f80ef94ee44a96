"""The attention module and its parts: ``module`` (``MultiHeadSelfAttention``, the project's own
multi-head self-attention), ``core`` (the one function that computes attention, with its
observation points and backends), ``rotary`` (RoPE) and ``rmsnorm`` (q/k norms).

May import: ``torch`` and the shared top-level modules of ``mhsa`` (``mhsa.errors``,
``mhsa.deprecation``), nothing else of the engine: every other part of it builds on this one.
``mhsa.engine.attention.MultiHeadSelfAttention`` and the other names of ``module`` are exported
here too.
"""

from mhsa.registry import lazy_exports

__all__ = [
    "ATTENTION_BACKENDS",
    "OBSERVATION_POINTS",
    "MultiHeadSelfAttention",
    "Observer",
    "RMSNorm",
    "Recorder",
    "RotaryEmbedding",
    "TraceStep",
    "attention_backend",
    "attention_core",
    "combine_masks",
    "scaled_dot_product_attention",
]

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, __name__ + ".module"))

"""MHSA Explorer's engine: multi-head self-attention, attention extraction, head analysis.

Never imports streamlit; only ``mhsa.plots`` imports plotly.
"""

from mhsa.attention import MultiHeadSelfAttention, TraceStep, scaled_dot_product_attention
from mhsa.errors import InputError, MHSAError, ModelLoadError, UnsupportedModelError
from mhsa.extract import ENGINES, attend
from mhsa.models import DEFAULT_MODEL, LoadedModel, get_model, load_model, pick_device
from mhsa.result import AttentionResult
from mhsa.stats import (
    HeadClusters,
    attention_rollout,
    head_clusters,
    head_map,
    head_similarity,
    head_stats,
)

__all__ = [
    "DEFAULT_MODEL",
    "ENGINES",
    "AttentionResult",
    "HeadClusters",
    "InputError",
    "LoadedModel",
    "MHSAError",
    "ModelLoadError",
    "MultiHeadSelfAttention",
    "TraceStep",
    "UnsupportedModelError",
    "attend",
    "attention_rollout",
    "get_model",
    "head_clusters",
    "head_map",
    "head_similarity",
    "head_stats",
    "load_model",
    "pick_device",
    "scaled_dot_product_attention",
]

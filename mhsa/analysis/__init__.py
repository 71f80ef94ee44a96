"""Analyses of attention that only read it: per-head statistics (``stats``, ``stream``:
streamed over layers), head similarity (``similarity``), roles and detection (``roles``,
``detection``, ``repeats``: repeated-token runs), composition scores from the weights
(``composition``), OV and QK circuits from the weights (``weights``: copying scores, top
tokens, positional patterns), a head's scores split into residual parts
(``qk_attribution``), the teaching trace of Inside MHSA (``classroom``), tables for people
(``tables``), what they share (``blocks``), and the claims the app states about them, each with
its support (``claims``).

May import: ``mhsa.engine`` and the shared top-level modules (``tests/test_layers.py``).

The public analyses import from here (``mhsa.analysis.head_stats``), as do the names of the
module ``mhsa.analysis`` once was (``as_results``, ``rows_per_block``, ``BLOCK_ELEMS``, which live
in ``mhsa.analysis.blocks``). ``qk_attribution`` is the name of a module here, so the function
of that name is ``mhsa.analysis.qk_attribution.qk_attribution``: exported here, it would hide
the module.
"""

from mhsa.analysis.blocks import BLOCK_ELEMS, as_results, rows_per_block
from mhsa.analysis.composition import head_composition, strongest_inputs
from mhsa.analysis.qk_attribution import LayerSources, layer_sources
from mhsa.analysis.roles import (
    AttentionSinks,
    attention_sinks,
    detect_heads,
    induction_scores,
    sink_value_norms,
)
from mhsa.analysis.similarity import HeadClusters, head_clusters, head_map, head_similarity
from mhsa.analysis.stats import attention_rollout, head_stats, top_attended
from mhsa.analysis.stream import streamed_head_similarity, streamed_head_stats
from mhsa.analysis.weights import (
    PositionalQK,
    ov_copying_scores,
    ov_top_tokens,
    qk_positional_scores,
)

__all__ = [
    "BLOCK_ELEMS",
    "AttentionSinks",
    "HeadClusters",
    "LayerSources",
    "PositionalQK",
    "as_results",
    "attention_rollout",
    "attention_sinks",
    "detect_heads",
    "head_clusters",
    "head_composition",
    "head_map",
    "head_similarity",
    "head_stats",
    "induction_scores",
    "layer_sources",
    "ov_copying_scores",
    "ov_top_tokens",
    "qk_positional_scores",
    "rows_per_block",
    "sink_value_norms",
    "streamed_head_similarity",
    "streamed_head_stats",
    "strongest_inputs",
    "top_attended",
]

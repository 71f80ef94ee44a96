"""MHSA Explorer's engine: multi-head self-attention, attention extraction, head analysis.

Never imports streamlit; only ``mhsa.plots`` imports plotly.
"""

import mhsa.compat  # noqa: F401  (old names kept for a release: mhsa.deprecation)
from mhsa.analysis.qk_attribution import LayerSources, layer_sources, qk_attribution
from mhsa.analysis.roles import (
    AttentionSinks,
    attention_sinks,
    detect_heads,
    head_composition,
    induction_scores,
    sink_value_norms,
    strongest_inputs,
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
from mhsa.atlas import Atlas, AtlasParts, build_atlas, open_atlas
from mhsa.causal.attribution import HeadAttribution, LogitLens, head_attribution, logit_lens
from mhsa.causal.flow import FlowGraph, information_flow
from mhsa.causal.importance import Ablation, ablate, head_importance
from mhsa.causal.patching import (
    PATCH_POINTS,
    PATCH_TARGETS,
    attribution_patching,
    patch_heads,
    patch_positions,
    patching_correlation,
)
from mhsa.causal.pruning import pruning_curve
from mhsa.circuits import (
    EDGE_METHODS,
    MIB_PERCENTAGES,
    CircuitGraph,
    FaithfulnessCurve,
    PathPatch,
    circuit_faithfulness,
    circuit_graph,
    edge_attribution,
    faithfulness_curve,
    path_patch,
    top_edges,
)
from mhsa.engine.attention.module import (
    MultiHeadSelfAttention,
    RotaryEmbedding,
    TraceStep,
    attention_core,
    scaled_dot_product_attention,
)
from mhsa.engine.extract import (
    ENGINE_DESCRIPTIONS,
    ENGINE_LABELS,
    ENGINE_SPECS,
    ENGINES,
    MAX_NEW_TOKENS,
    EngineSpec,
    Generation,
    attend,
    attend_generated,
    attend_layers,
    generate,
    generate_ids,
)
from mhsa.engine.families.registry import SUPPORTED_FOR_MHSA
from mhsa.engine.interop import from_attention
from mhsa.engine.models.loading import (
    DEFAULT_MODEL,
    DEVICES,
    LoadedModel,
    cpu_threads,
    get_model,
    load_model,
    pick_device,
)
from mhsa.engine.result import ATTENTION_KINDS, AttentionResult, NotebookView, set_html_view
from mhsa.engine.runs.norms import norms_as_attention
from mhsa.engine.runs.selection import ATTENTION_DTYPES, Selection
from mhsa.engine.tokens import find_tokens
from mhsa.errors import InputError, MHSAError, ModelLoadError, UnsupportedModelError
from mhsa.heads import head_label, parse_head_label
from mhsa.training import (
    TASKS,
    TrainConfig,
    TrainResult,
    TrainSnapshot,
    save_model,
    toy_model_path,
    train,
)


def _notebook_html(result: AttentionResult, view: str = "heads", **options: object) -> str:
    """``mhsa.plots.notebook.result_html``, imported when a view is first drawn (plotly, which
    ``mhsa.plots`` imports, stays out of ``import mhsa``)."""
    from mhsa.plots.notebook import result_html

    return result_html(result, view, **options)  # type: ignore[arg-type]


def _result_html(name: str):
    """``mhsa.plots.notebook_results.<name>``, imported when it first draws."""

    def draw(value: object, **options: object) -> str:
        from mhsa.plots import notebook_results

        return getattr(notebook_results, name)(value, **options)

    return draw


def show(value: object, **options: object) -> NotebookView:
    """Any result as a notebook view (``mhsa.plots.notebook_results.show``): an
    ``AttentionResult``, a patching table (``patch_heads``), scored circuit edges
    (``edge_attribution``, ``top_edges``), a ``PatchingAgreement``, ``PathPatch``,
    ``CircuitGraph``, ``Atlas``, ``AtlasParts`` or ``FaithfulnessCurve``: its table and a
    small figure, self-contained."""
    from mhsa.plots.notebook_results import show as show_result

    return show_result(value, **options)


set_html_view(_notebook_html)
for _kind, _name in {
    "patching agreement": "agreement_html",
    "path patch": "path_patch_html",
    "circuit graph": "graph_html",
    "atlas": "atlas_html",
    "atlas parts": "atlas_parts_html",
    "faithfulness curve": "faithfulness_html",
}.items():
    set_html_view(_result_html(_name), _kind)

__all__ = [
    "ATTENTION_DTYPES",
    "ATTENTION_KINDS",
    "DEFAULT_MODEL",
    "DEVICES",
    "EDGE_METHODS",
    "ENGINES",
    "ENGINE_DESCRIPTIONS",
    "ENGINE_LABELS",
    "ENGINE_SPECS",
    "MAX_NEW_TOKENS",
    "MIB_PERCENTAGES",
    "PATCH_POINTS",
    "PATCH_TARGETS",
    "SUPPORTED_FOR_MHSA",
    "TASKS",
    "Ablation",
    "Atlas",
    "AtlasParts",
    "AttentionResult",
    "AttentionSinks",
    "CircuitGraph",
    "EngineSpec",
    "FaithfulnessCurve",
    "FlowGraph",
    "Generation",
    "HeadAttribution",
    "HeadClusters",
    "InputError",
    "LayerSources",
    "LoadedModel",
    "LogitLens",
    "MHSAError",
    "ModelLoadError",
    "MultiHeadSelfAttention",
    "PathPatch",
    "PositionalQK",
    "RotaryEmbedding",
    "Selection",
    "TraceStep",
    "TrainConfig",
    "TrainResult",
    "TrainSnapshot",
    "UnsupportedModelError",
    "ablate",
    "attend",
    "attend_generated",
    "attend_layers",
    "attention_core",
    "attention_rollout",
    "attention_sinks",
    "attribution_patching",
    "build_atlas",
    "circuit_faithfulness",
    "circuit_graph",
    "cpu_threads",
    "detect_heads",
    "edge_attribution",
    "faithfulness_curve",
    "find_tokens",
    "from_attention",
    "generate",
    "generate_ids",
    "get_model",
    "head_attribution",
    "head_clusters",
    "head_composition",
    "head_importance",
    "head_label",
    "head_map",
    "head_similarity",
    "head_stats",
    "induction_scores",
    "information_flow",
    "layer_sources",
    "load_model",
    "logit_lens",
    "norms_as_attention",
    "open_atlas",
    "ov_copying_scores",
    "ov_top_tokens",
    "parse_head_label",
    "patch_heads",
    "patch_positions",
    "patching_correlation",
    "path_patch",
    "pick_device",
    "pruning_curve",
    "qk_attribution",
    "qk_positional_scores",
    "save_model",
    "scaled_dot_product_attention",
    "show",
    "sink_value_norms",
    "streamed_head_similarity",
    "streamed_head_stats",
    "strongest_inputs",
    "top_attended",
    "top_edges",
    "toy_model_path",
    "train",
]

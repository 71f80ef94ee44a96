"""Plotly figures of attention results and head analyses, one module per view. No torch, no
streamlit; the only part of ``mhsa`` that imports plotly.

- ``common``: the app's colours (``TEMPLATE``), escaped labels (``label``), token axes, the
  layout every figure starts from, ``fit_margins`` and ``matrix_heatmap``;
- ``marks``: the found token and the start of generated text on any figure of tokens
  (``decorate``);
- ``export``: the numbers a figure draws, as a table (``figure_data``);
- ``alt``: each figure's text alternative, one sentence from its numbers (``alt_text``);
- one module per page: ``heads``, ``line_view``, ``similarity``, ``statistics``,
  ``importance``, ``roles``, ``patching``, ``rollout``, ``classroom`` (Inside MHSA),
  ``training`` (Train heads), ``flow`` (Information flow), ``circuits`` (Circuits), ``weights``
  (OV/QK circuits and "Why here?"), ``atlas``, ``tags`` and ``explain`` (Head atlas).

Every public name is re-exported here: ``from mhsa.plots import head_heatmap``.
"""

from mhsa.plots.alt import alt_text, describe_attention, set_alt
from mhsa.plots.atlas import atlas_histogram, example_heatmap
from mhsa.plots.circuits import (
    circuit_figure,
    circuit_node_xy,
    faithfulness_figure,
    k_composition_figure,
    k_support_figure,
)
from mhsa.plots.classroom import neuron_figure, step_heatmap
from mhsa.plots.common import (
    COLORSCALE,
    COLORWAY,
    MAX_TICKS,
    SIGNED_COLORSCALE,
    TEMPLATE,
    fit_margins,
    label,
    matrix_heatmap,
)
from mhsa.plots.explain import PROGRAM_KINDS, explanation_map, pattern_pair
from mhsa.plots.export import figure_data
from mhsa.plots.flow import attribution_figure, flow_figure, logit_lens_figure
from mhsa.plots.heads import (
    GRID_THUMB,
    WEIGHTED_BY_NORM,
    WEIGHTS,
    downsample,
    head_grid,
    head_heatmap,
    head_zoom,
    mark_window,
    mean_heatmap,
    token_focus,
)
from mhsa.plots.importance import (
    head_value_grid,
    importance_scatter,
    layer_change_figure,
    pruning_figure,
)
from mhsa.plots.line_view import (
    LINE_BINS,
    LINE_BUDGET,
    LINE_DENSE,
    LINE_MIN_WEIGHT,
    LINE_TOP_K,
    line_pairs,
    line_view,
)
from mhsa.plots.marks import decorate
from mhsa.plots.palette import HEAD_COLORS, LAYER_COLORSCALE, head_style
from mhsa.plots.patching import patching_maps, patching_positions_figure, patching_scatter
from mhsa.plots.roles import composition_figure, detection_pattern_figure, role_maps, sink_map
from mhsa.plots.rollout import rollout_figure
from mhsa.plots.similarity import head_map_figure, similarity_figure
from mhsa.plots.sizing import PRESENTATION_FONT, enlarge_fonts
from mhsa.plots.statistics import stat_grid
from mhsa.plots.tags import tag_histogram_figure
from mhsa.plots.training import (
    head_scores_figure,
    probe_mosaic,
    snapshot_history,
    snapshot_scores,
    training_curves,
)
from mhsa.plots.weights import (
    clickable_cells,
    copying_figure,
    positional_figure,
    qk_terms_figure,
)

__all__ = [
    "COLORSCALE",
    "COLORWAY",
    "GRID_THUMB",
    "HEAD_COLORS",
    "LAYER_COLORSCALE",
    "LINE_BINS",
    "LINE_BUDGET",
    "LINE_DENSE",
    "LINE_MIN_WEIGHT",
    "LINE_TOP_K",
    "MAX_TICKS",
    "PRESENTATION_FONT",
    "PROGRAM_KINDS",
    "SIGNED_COLORSCALE",
    "TEMPLATE",
    "WEIGHTED_BY_NORM",
    "WEIGHTS",
    "alt_text",
    "atlas_histogram",
    "attribution_figure",
    "circuit_figure",
    "circuit_node_xy",
    "clickable_cells",
    "composition_figure",
    "copying_figure",
    "decorate",
    "describe_attention",
    "detection_pattern_figure",
    "downsample",
    "enlarge_fonts",
    "example_heatmap",
    "explanation_map",
    "faithfulness_figure",
    "figure_data",
    "fit_margins",
    "flow_figure",
    "head_grid",
    "head_heatmap",
    "head_map_figure",
    "head_scores_figure",
    "head_style",
    "head_value_grid",
    "head_zoom",
    "importance_scatter",
    "k_composition_figure",
    "k_support_figure",
    "label",
    "layer_change_figure",
    "line_pairs",
    "line_view",
    "logit_lens_figure",
    "mark_window",
    "matrix_heatmap",
    "mean_heatmap",
    "neuron_figure",
    "patching_maps",
    "patching_positions_figure",
    "patching_scatter",
    "pattern_pair",
    "positional_figure",
    "probe_mosaic",
    "pruning_figure",
    "qk_terms_figure",
    "role_maps",
    "rollout_figure",
    "set_alt",
    "similarity_figure",
    "sink_map",
    "snapshot_history",
    "snapshot_scores",
    "stat_grid",
    "step_heatmap",
    "tag_histogram_figure",
    "token_focus",
    "training_curves",
]

"""Causal tools: what a head does to the output when it is changed. What is measured
(``metrics``: the output's registry; ``targets``: a task's answers), knocking heads out
(``importance``, ``pruning``), activation patching and attribution patching (``patching``,
``patch_runs``), direct logit attribution and the logit lens (``attribution``) and information
flow (``flow``).

May import: ``mhsa.engine``, ``mhsa.analysis`` and the shared top-level modules
(``tests/test_layers.py``).
"""

from mhsa.causal.attribution import HeadAttribution, LogitLens, head_attribution, logit_lens
from mhsa.causal.flow import FlowGraph, information_flow
from mhsa.causal.importance import Ablation, ablate, head_importance
from mhsa.causal.metrics import PATCH_TARGETS
from mhsa.causal.patching import (
    PATCH_POINTS,
    attribution_patching,
    patch_heads,
    patch_positions,
    patching_correlation,
)
from mhsa.causal.pruning import pruning_curve

__all__ = [
    "PATCH_POINTS",
    "PATCH_TARGETS",
    "Ablation",
    "FlowGraph",
    "HeadAttribution",
    "LogitLens",
    "ablate",
    "attribution_patching",
    "head_attribution",
    "head_importance",
    "information_flow",
    "logit_lens",
    "patch_heads",
    "patch_positions",
    "patching_correlation",
    "pruning_curve",
]

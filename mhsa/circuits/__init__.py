"""Circuits: which edges between heads carry the answer (``discovery``: EAP, EAP-IG, exact
scores, faithfulness curves, path patching), over the graph of nodes and edges (``graph``), run
with per-edge inputs (``runs``, ``layers``), in pairs of clean and corrupted runs (``pairs``),
through post-norm encoders (``postnorm``) and with gradient taps (``taps``).

May import: ``mhsa.engine``, ``mhsa.analysis``, ``mhsa.causal`` and the shared top-level
modules (``tests/test_layers.py``).

Its public names (``mhsa.circuits.discovery``'s and the others') import from here. Settings
read at run time (``EAP_ONE_PASS_MAX``, ``TAPPED_GRADIENTS``) are set on
``mhsa.circuits.discovery``.
"""

from mhsa.circuits.discovery import (
    EAP_ONE_PASS_MAX,
    EDGE_METHODS,
    MIB_PERCENTAGES,
    CircuitGraph,
    FaithfulnessCurve,
    PathPatch,
    circuit_faithfulness,
    circuit_graph,
    edge_attribution,
    edge_attribution_ids,
    faithfulness_curve,
    path_patch,
    top_edges,
)

__all__ = [
    "EAP_ONE_PASS_MAX",
    "EDGE_METHODS",
    "MIB_PERCENTAGES",
    "CircuitGraph",
    "FaithfulnessCurve",
    "PathPatch",
    "circuit_faithfulness",
    "circuit_graph",
    "edge_attribution",
    "edge_attribution_ids",
    "faithfulness_curve",
    "path_patch",
    "top_edges",
]

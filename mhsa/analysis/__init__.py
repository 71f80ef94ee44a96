"""Analyses of attention that only read it: per-head statistics (``stats``, ``stream``:
streamed over layers), head similarity (``similarity``), roles and detection (``roles``,
``detection``, ``repeats``: repeated-token runs), composition scores from the weights
(``composition``), OV and QK circuits from the weights (``weights``: copying scores, top
tokens, positional patterns), a head's scores split into residual parts
(``qk_attribution``), the teaching trace of Inside MHSA (``classroom``), tables for people
(``tables``) and what they share (``blocks``).

May import: ``mhsa.engine`` and the shared top-level modules (``tests/test_layers.py``).

``mhsa.analysis`` was a module before issue 45; its names (``as_results``, ``rows_per_block``,
``BLOCK_ELEMS``) live in ``mhsa.analysis.blocks`` and still import from here.
"""

from mhsa.analysis.blocks import BLOCK_ELEMS, as_results, rows_per_block

__all__ = ["BLOCK_ELEMS", "as_results", "rows_per_block"]

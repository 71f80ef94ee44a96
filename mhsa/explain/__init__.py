"""Explanations of attention heads: programs, their scores and their faithfulness. May import:
``mhsa.engine``, ``mhsa.analysis``, ``mhsa.causal``, ``mhsa.corpus``, ``mhsa.atlas`` and the
shared top-level modules of ``mhsa``."""

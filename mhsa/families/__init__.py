"""Attention-block families our module stands in for, one module per family (as TransformerLens
keeps one weight-conversion file per family). Each is registered in ``mhsa.adapters.FAMILIES``."""

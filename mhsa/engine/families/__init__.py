"""The model families our module stands in for, one module each (TransformerLens keeps one
weight-conversion file per family): each holds a ``Family`` record (``record``) saying which
attention blocks it recognises, how their weights map onto ``MultiHeadSelfAttention`` and back,
and its layers' layout; ``registry.FAMILIES`` lists them, ``support`` says which tools run on
which family, and ``layout`` finds a layer's parts (norms, MLP, final norm) for the streams.

May import: ``mhsa.engine.attention``, ``mhsa.engine.models`` and the shared top-level modules
of ``mhsa``; the rest of the engine builds on this.
"""

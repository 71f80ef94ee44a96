"""The engine: attention computed and read out of a model.

Sub-folders by concern, each saying in its docstring what it holds and may import:
``attention/`` (our ``MultiHeadSelfAttention`` and its parts: the core, rotary, q/k norms),
``families/`` (one module per model family: its blocks, weights and layer layout; which tools
run on which family), ``models/`` (loading models, what their names mean, limits, trained models
and the store by id), ``runs/`` (a model's forward pass through its own eager attention or our
module: swapping blocks, selected layers and heads, layer files, queries and keys, norms,
generation, corpora in batches) and ``stream/`` (the residual stream part by part). At this
level: texts in (``encoding``, ``tokens``), the engines (``extract``: text -> ``AttentionResult``),
the result (``result``), attention computed elsewhere (``interop``) and the process-wide cache of
results (``cache``).

May import: the shared top-level modules (``mhsa.errors``, ``mhsa.registry``,
``mhsa.deprecation``, ``mhsa.heads``) and nothing else of ``mhsa``: every other layer builds on
this one (``tests/test_layers.py``).
"""

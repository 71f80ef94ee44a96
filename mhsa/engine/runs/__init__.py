"""A model's forward pass, as the engine runs it: swapping its attention blocks for our module and
finding them (``swap``, ``block_search``), the pass itself (``forward``), a pass that keeps only
the selected layers and heads (``selection``, ``partial``) or writes them layer by layer
(``layer_files``), queries and keys (``query_keys``), value-weighted norms (``norms``), text
a model writes (``generation``) and corpora in padded batches (``batches``).

May import: ``mhsa.engine.attention``, ``mhsa.engine.families``, ``mhsa.engine.models``,
``mhsa.engine.stream``, the engine's own top-level modules (``encoding``, ``tokens``,
``result``, ``extract``) and the shared top-level modules of ``mhsa``.
"""

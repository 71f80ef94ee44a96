"""The engine: attention computed and read out of a model.

Holds the attention module and its parts (``attention``, ``core``, ``rotary``, ``rmsnorm``,
``frozen_norm``, ``layer_parts``), the model families (``families/``, ``adapters``,
``support``), swapping a model's blocks for ours and finding them (``swap``,
``block_search``), the runs (``forward``, ``residual``, ``postnorm_stream``,
``seq2seq_stream``, ``partial``, ``selection``, ``extract``, ``layer_files``, ``generation``),
text in and out (``encoding``, ``tokens``), corpora in padded batches (``batches``), models
and what their names mean (``models``,
``model_names``, ``limits``, ``trained``), the store that keeps trained models and atlases by
id (``store``, ``store_entry``: ``MHSA_STORE``), caches (``cache``), norms as attention (``norms``:
``attend(norms=True)`` computes them) and the result (``result``).

May import: the shared top-level modules (``mhsa.errors``, ``mhsa.registry``,
``mhsa.deprecation``, ``mhsa.heads``) and nothing else of ``mhsa``: every other layer builds on
this one (``tests/test_layers.py``).
"""

"""A model's residual stream, part by part: a pre-norm decoder's (``residual``), a post-norm
encoder's through its chain of frozen norms (``postnorm``), an encoder-decoder's two streams
(``seq2seq``) and the norm with its scale frozen that each of them passes parts through
(``frozen_norm``).

May import: ``mhsa.engine.attention``, ``mhsa.engine.families``, ``mhsa.engine.models``,
``mhsa.engine.runs``, the engine's own top-level modules and the shared top-level modules of
``mhsa``.
"""

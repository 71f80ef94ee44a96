"""A model's residual stream, part by part: a pre-norm decoder's (``residual``), a post-norm
encoder's through its chain of frozen norms (``postnorm``), an encoder-decoder's two streams
(``seq2seq``) and the norm with its scale frozen that each of them passes parts through
(``frozen_norm``).

The stream recorder (``record``, in ``recorder``): one forward pass through our module that
keeps the activations asked for by standard names (``points``: ``L{l}.resid_pre``,
``L{l}.pattern``, ``L{l}.z``, ... after TransformerLens's hook points, Nanda & Bloom 2022) in a
``StreamCache``, and replaces any of them in the pass. Every hook on a model's modules goes
through ``hooks``.

May import: ``mhsa.engine.attention``, ``mhsa.engine.families``, ``mhsa.engine.models``,
``mhsa.engine.runs``, the engine's own top-level modules and the shared top-level modules of
``mhsa``. ``record``, ``StreamCache``, ``NotRecordedError`` and ``stream_points`` are exported
here (imported on first use).
"""

from mhsa.registry import lazy_exports

__all__ = ["NotRecordedError", "StreamCache", "record", "stream_points"]

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, __name__ + ".recorder"))

"""Work over a whole corpus: per-head statistics of a corpus (``stats``), the same on a Ray
cluster (``distributed``) and the queue of heavy jobs a server runs (``jobs``).

May import: ``mhsa.engine``, ``mhsa.analysis``, ``mhsa.causal`` and the shared top-level
modules (``tests/test_layers.py``).

Its names import from here: reading corpora and running them in padded batches live in
``mhsa.engine.runs.batches`` (the analyses use them), the statistics in ``mhsa.corpus.stats``.
"""

from mhsa.corpus.stats import CorpusStats, corpus_stats
from mhsa.engine.runs.batches import (
    BATCH_TOKENS,
    Corpus,
    Entry,
    Problem,
    attend_batched,
    attend_batches,
    attend_one_by_one,
    batch_attention,
    batch_tokens_for,
    encode_entries,
    length_batches,
    read_corpus,
)

__all__ = [
    "BATCH_TOKENS",
    "Corpus",
    "CorpusStats",
    "Entry",
    "Problem",
    "attend_batched",
    "attend_batches",
    "attend_one_by_one",
    "batch_attention",
    "batch_tokens_for",
    "corpus_stats",
    "encode_entries",
    "length_batches",
    "read_corpus",
]

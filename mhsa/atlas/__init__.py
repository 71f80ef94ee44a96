"""The head atlas: what each head does over a whole corpus, built once and searched live.

OpenAI's Transformer Debugger shows a head's top token pairs by attention write norm, random and
quantile samples; exBERT (Hoover et al. 2020) searches a corpus for the contexts whose head
outputs are nearest a chosen token's. An atlas holds both, for any encoder or decoder the app
opens, and for an encoder-decoder's encoder and decoder self-attention (``AtlasParts``):
``build_atlas(corpus, out)`` streams the corpus through the model in resumable shards
(``run``, ``build``, with the per-head summaries of ``collect``), ``open_atlas(out)`` reads it
(``reader``: ``top``, ``sample``, ``summary``, ``heads``, ``search``, ``similar``; the context
index is ``index``), ``corpora`` gives the corpora the app ships atlases of, ``tags`` the
part-of-speech tags a tagged corpus gives each token (the Universal tagset; ``Atlas.tags``,
search by tag, ``Atlas.tag_histogram``).

May import: ``mhsa.engine``, ``mhsa.analysis``, ``mhsa.corpus`` and the shared top-level modules
(``tests/test_layers.py``).
"""

from mhsa.atlas.reader import Atlas, AtlasParts, open_atlas
from mhsa.atlas.run import build_atlas

__all__ = ["Atlas", "AtlasParts", "build_atlas", "open_atlas"]

"""The registry of the attention-block families our module can stand in for: ``FAMILIES``, in
the order a block is matched against them, and the lookups over it. Each family lives in its
own module of ``mhsa.engine.families`` (``bert``, ``gpt2``, ``llama``, ``neox``...: which
blocks it recognises, how their weights map onto ``MultiHeadSelfAttention`` and back, and its
layers' layout), as TransformerLens keeps one weight-conversion file per family.

Every list of supported families (error messages, ``SUPPORTED_FOR_MHSA``) is derived from
``FAMILIES``. The swap itself (our module running in the model's place) is
``mhsa.engine.runs.swap``. The loaders re-exported here (``load_bert``...) are kept for the
callers that import them from the registry; their home is their family's module.
"""

from __future__ import annotations

from torch import nn

from mhsa.engine.families import (
    albert,
    bart,
    bert,
    distilbert,
    falcon,
    gemma,
    gpt2,
    gptj,
    llama,
    modernbert,
    neox,
    olmo2,
    opt,
    phi,
    phi3,
    qwen3,
    t5,
)
from mhsa.engine.families.bart import load_bart, store_bart
from mhsa.engine.families.bert import load_bert, store_bert
from mhsa.engine.families.distilbert import load_distilbert, store_distilbert
from mhsa.engine.families.gpt2 import load_gpt2, store_gpt2
from mhsa.engine.families.llama import load_llama, store_llama
from mhsa.engine.families.record import Family, LayerLayout, ValueOf, rotary_of
from mhsa.engine.families.t5 import load_t5, store_t5, t5_position_bias

__all__ = [
    "FAMILIES",
    "SUPPORTED_FOR_MHSA",
    "Family",
    "LayerLayout",
    "ValueOf",
    "family_of",
    "load_bart",
    "load_bert",
    "load_distilbert",
    "load_gpt2",
    "load_llama",
    "load_t5",
    "rotary_of",
    "store_bart",
    "store_bert",
    "store_distilbert",
    "store_gpt2",
    "store_llama",
    "store_t5",
    "supported_families",
    "t5_position_bias",
]


FAMILIES: tuple[Family, ...] = (
    bert.FAMILY,
    distilbert.FAMILY,
    gpt2.FAMILY,
    llama.FAMILY,
    bart.FAMILY,
    t5.FAMILY,
    neox.FAMILY,
    gptj.FAMILY,
    phi.FAMILY,
    opt.FAMILY,
    falcon.FAMILY,
    albert.FAMILY,
    qwen3.FAMILY,
    gemma.FAMILY,
    gemma.FAMILY_2,
    gemma.FAMILY_3,
    olmo2.FAMILY,
    phi3.FAMILY,
    modernbert.FAMILY,
)

#: Every family our module can stand in for, with its layout, for messages.
SUPPORTED_FOR_MHSA = "; ".join(f.describe() for f in FAMILIES)


def supported_families() -> str:
    """The families' short names, for a message: "BERT family, DistilBERT, ... or Llama-style"."""
    names = [f.name for f in FAMILIES]
    return ", ".join(names[:-1]) + " or " + names[-1]


def family_of(block: nn.Module) -> Family | None:
    """The family whose layout ``block`` has, or None."""
    return next((f for f in FAMILIES if f.matches(block)), None)

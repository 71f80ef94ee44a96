"""The BERT family: ``self.query``/``self.key``/``self.value`` and ``output.dense`` inside a
post-norm attention block whose dropout, residual sum and LayerNorm live in the block itself
(BERT, RoBERTa, ELECTRA, MiniLM, XLM-R: recognised by structure, not class names).

transformers: ``models/bert/modeling_bert.py`` (``BertAttention``, ``BertSelfOutput``);
TransformerLens: ``pretrained/weight_conversions/bert.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.record import Family, LayerLayout, bias_of, store_linears, whole

__all__ = ["FAMILY", "LAYERS", "is_bert", "load_bert", "store_bert"]


def is_bert(m: nn.Module) -> bool:
    """A BERT-family self-attention block (``self.query`` and ``output``; not cross-attention)."""
    return (
        hasattr(m, "self")
        and hasattr(m.self, "query")
        and hasattr(m, "output")
        and not getattr(m, "is_cross_attention", False)
    )


def load_bert(attention: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a BERT-family attention block (``.self.query/key/value`` and
    ``.output.dense``)."""
    s, dense = attention.self, attention.output.dense
    return MultiHeadSelfAttention.from_projections(
        s.query.weight.detach(),
        s.key.weight.detach(),
        s.value.weight.detach(),
        dense.weight.detach(),
        *(bias_of(p) for p in (s.query, s.key, s.value, dense)),
        num_heads=s.num_attention_heads,
        scale=float(getattr(s, "scaling", s.attention_head_size**-0.5)),
    )


def store_bert(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a BERT-family attention block (the inverse of ``load_bert``)."""
    s = attention.self
    store_linears(ours, (s.query, s.key, s.value, attention.output.dense))


def _finish(block: nn.Module, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return block.output.LayerNorm(block.output.dropout(out) + x)


#: a post-norm ``BertLayer``: ``LN_a(x + attn(x))``, then ``LN_m(h + output.dense(
#: intermediate(h)))``; the masked-LM heads differ across the family (``cls.predictions``,
#: RoBERTa's ``lm_head``), so the unembedding is the head's own output embeddings
LAYERS = LayerLayout(
    attention="attention",
    projections=("self.query", "self.key", "self.value", "output.dense"),
    attention_sum_norm="attention.output.LayerNorm",
    mlp_sum_norm="output.LayerNorm",
    mlp="output.dense",
    mlp_input="intermediate",
    embeddings="embeddings.word_embeddings",
    positions="embeddings.position_embeddings",
    embedding_norm="embeddings.LayerNorm",
    unembedding=lambda head: head.get_output_embeddings(),
)

FAMILY = Family(
    "BERT family",
    "query/key/value + output.dense: BERT, RoBERTa, ELECTRA, MiniLM",
    is_bert,
    lambda block, _model: load_bert(block),
    lambda block: bool(getattr(block.self, "is_causal", False)),
    _finish,
    store_bert,
    lambda block: (block.self.value, whole),
    kinds=("encoder",),
    layers=LAYERS,
)

"""DistilBERT: ``q_lin``/``k_lin``/``v_lin``/``out_lin`` in a post-norm ``TransformerBlock``
(``sa_layer_norm`` after the attention's residual sum, ``output_layer_norm`` after the
feed-forward ``ffn``'s).

transformers: ``models/distilbert/modeling_distilbert.py`` (``MultiHeadSelfAttention``,
``TransformerBlock``).
"""

from __future__ import annotations

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.record import Family, LayerLayout, load_linears, store_linears, whole

__all__ = ["FAMILY", "LAYERS", "is_distilbert", "load_distilbert", "store_distilbert"]


def is_distilbert(m: nn.Module) -> bool:
    """A DistilBERT attention block (``q_lin`` and ``out_lin``)."""
    return hasattr(m, "q_lin") and hasattr(m, "out_lin")


def _linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q_lin, attention.k_lin, attention.v_lin, attention.out_lin)


def load_distilbert(attention: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a DistilBERT attention block (``q_lin``/``k_lin``/``v_lin``/``out_lin``)."""
    return load_linears(_linears(attention), num_heads=attention.n_heads)


def store_distilbert(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a DistilBERT attention block."""
    store_linears(ours, _linears(attention))


#: a post-norm ``TransformerBlock``: ``sa_layer_norm(x + attention(x))``, then
#: ``output_layer_norm(h + ffn(h))``
LAYERS = LayerLayout(
    attention="attention",
    projections=("q_lin", "k_lin", "v_lin", "out_lin"),
    attention_sum_norm="sa_layer_norm",
    mlp_sum_norm="output_layer_norm",
    mlp="ffn",
    embeddings="embeddings.word_embeddings",
    positions="embeddings.position_embeddings",
    embedding_norm="embeddings.LayerNorm",
    unembedding="vocab_projector",
)

FAMILY = Family(
    "DistilBERT",
    "q_lin/k_lin/v_lin/out_lin",
    is_distilbert,
    lambda block, _model: load_distilbert(block),
    lambda _block: False,
    store=store_distilbert,
    values=lambda block: (block.v_lin, whole),
    kinds=("encoder",),
    layers=LAYERS,
)

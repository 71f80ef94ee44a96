"""ALBERT: a BERT-like post-norm encoder block (``query``/``key``/``value``/``dense`` and the
residual LayerNorm inside the attention block) whose layers are shared: the model calls the
blocks of ``num_hidden_groups`` groups ``num_hidden_layers`` times in all. Our modules follow
the calls: layer ``i`` is a module of ours holding the weights of the block the model calls
there, and the layers that share a block share one module of ours (training changes them
together, as it changes the model's).

transformers: ``models/albert/modeling_albert.py`` (``AlbertTransformer.forward``).
"""

from __future__ import annotations

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.record import Family, LayerLayout, load_linears, store_linears, whole

__all__ = ["FAMILY", "LAYERS", "albert_call_order", "is_albert", "load_albert", "store_albert"]


def is_albert(m: nn.Module) -> bool:
    """An ALBERT attention block (``query``/``key``/``value``/``dense`` and ``LayerNorm`` in
    the block itself)."""
    parts = ("query", "key", "value", "dense", "LayerNorm", "output_dropout")
    return all(hasattr(m, p) for p in parts)


def _linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.query, attention.key, attention.value, attention.dense)


def load_albert(attention: nn.Module, _model: nn.Module | None = None) -> MultiHeadSelfAttention:
    """Our module from an ALBERT block."""
    return load_linears(
        _linears(attention),
        num_heads=attention.num_attention_heads,
        scale=float(attention.scaling),
    )


def store_albert(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into an ALBERT block (the inverse of ``load_albert``)."""
    store_linears(ours, _linears(attention))


def _finish(block: nn.Module, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return block.LayerNorm(x + block.output_dropout(out))


def albert_call_order(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """The block ALBERT calls in each of its ``num_hidden_layers`` layers: layer ``i`` runs
    group ``int(i / (num_hidden_layers / num_hidden_groups))`` (``AlbertTransformer``).

    Raises:
        ValueError: ``inner_group_num`` is not 1 (several layers inside one group call), or
            the blocks found do not match the groups.
    """
    config = model.config
    layers, groups = config.num_hidden_layers, config.num_hidden_groups
    if getattr(config, "inner_group_num", 1) != 1:
        raise ValueError(f"ALBERT's inner_group_num={config.inner_group_num} (only 1 is loaded)")
    if len(blocks) != groups:
        raise ValueError(f"{len(blocks)} attention blocks for {groups} ALBERT layer groups")
    return [blocks[int(i / (layers / groups))] for i in range(layers)]


#: a post-norm ``AlbertLayer``: ``attention.LayerNorm(x + attention(x))`` inside the block,
#: then ``full_layer_layer_norm(h + ffn_output(act(ffn(h))))``; the embeddings (of
#: ``embedding_size``) are projected to the layers' width by the encoder's
#: ``embedding_hidden_mapping_in``
LAYERS = LayerLayout(
    attention="attention",
    projections=("query", "key", "value", "dense"),
    attention_sum_norm="attention.LayerNorm",
    mlp_sum_norm="full_layer_layer_norm",
    mlp="ffn_output",
    mlp_input="ffn",
    embeddings="embeddings.word_embeddings",
    positions="embeddings.position_embeddings",
    embedding_norm="embeddings.LayerNorm",
    unembedding="predictions.decoder",
)

FAMILY = Family(
    "ALBERT",
    "query/key/value/dense + LayerNorm in the block, layers shared across groups: ALBERT",
    is_albert,
    load_albert,
    lambda _block: False,
    _finish,
    store_albert,
    values=lambda block: (block.value, whole),
    call_order=albert_call_order,
    kinds=("encoder",),
    layers=LAYERS,
)

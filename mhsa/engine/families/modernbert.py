"""ModernBERT: an encoder whose W_Q, W_K, W_V are fused in one ``Wqkv`` (rows: queries, keys,
values, as our fused projection), ``Wo``, rotary positions with one base on its global layers
and another on its local ones, and a bidirectional sliding window on the local layers: a token
sees tokens at most ``local_attention / 2`` positions away (the block's ``sliding_window`` is
that plus one, as ``attention_core`` counts windows)."""

from __future__ import annotations

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.fused import load_fused, store_fused
from mhsa.engine.families.parts import rotary_for, window_of
from mhsa.engine.families.record import Family, LayerLayout

__all__ = [
    "FAMILY",
    "LAYERS",
    "is_modernbert",
    "load_modernbert",
    "modernbert_finish",
    "store_modernbert",
]


def is_modernbert(m: nn.Module) -> bool:
    """A block with a fused ``Wqkv`` and a ``Wo``."""
    return hasattr(m, "Wqkv") and hasattr(m, "Wo")


def load_modernbert(block: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a ModernBERT block (``Wqkv`` split in three equal parts).

    Raises:
        ValueError: dynamic rope.
    """
    heads = block.config.num_attention_heads
    return load_fused(
        block.Wqkv,
        block.Wo,
        "stacked",
        heads=heads,
        kv_heads=heads,
        d_head=block.head_dim,
        scale=float(block.head_dim**-0.5),
        rotary=rotary_for(block, model),
        sliding_window=window_of(block),
    )


def store_modernbert(ours: MultiHeadSelfAttention, block: nn.Module) -> None:
    """Our module's weights into a ModernBERT block (``Wqkv`` whole again)."""
    store_fused(ours, block.Wqkv, block.Wo, "stacked")


def modernbert_finish(block: nn.Module, out: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
    """The block's dropout after ``Wo`` (the residual sum is the layer's)."""
    return block.out_drop(out)


def _values(block: nn.Module) -> tuple[nn.Module, object]:
    """V is the last ``hidden_size`` features of ``Wqkv``'s output."""
    d = block.config.hidden_size
    return block.Wqkv, lambda qkv: qkv[..., 2 * d :]


#: a pre-norm encoder layer: ``h = x + attn(attn_norm(x))`` (the first layer's ``attn_norm``
#: an ``nn.Identity``: the embeddings' ``norm`` came just before), then ``h + mlp(mlp_norm(h))``;
#: ``final_norm`` after the last
LAYERS = LayerLayout(
    attention="attn",
    projections=("Wqkv", "Wo"),
    attention_norm="attn_norm",
    mlp_norm="mlp_norm",
    final_norm="final_norm",
    embeddings="embeddings.tok_embeddings",
    embedding_norm="embeddings.norm",
    unembedding="decoder",
)

FAMILY = Family(
    "ModernBERT",
    "fused Wqkv + Wo with rotary positions, global and local (sliding-window) layers",
    is_modernbert,
    load_modernbert,
    lambda _block: False,
    finish=modernbert_finish,
    store=store_modernbert,
    values=_values,
    kinds=("encoder",),
    layers=LAYERS,
)

"""GPT-J: ``q_proj``/``k_proj``/``v_proj``/``out_proj`` without biases, rotary positions on the
first ``rotary_dim`` features of each head with GPT-J's interleaved pairs (feature ``2i`` with
``2i + 1``: ``rotate_every_two``), and parallel layers (attention and MLP read the same normed
input).

transformers: ``models/gptj/modeling_gptj.py`` (``GPTJAttention``); TransformerLens:
``pretrained/weight_conversions/gptj.py``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention, RotaryEmbedding
from mhsa.engine.families.record import Family, LayerLayout, load_linears, store_linears, whole

__all__ = ["FAMILY", "LAYERS", "is_gptj", "load_gptj", "store_gptj"]

#: GPT-J's rotary base (``create_sinusoidal_positions`` hard-codes it)
_BASE = 10000.0


def is_gptj(m: nn.Module) -> bool:
    """A GPT-J attention block (projections without ``o_proj``, ``rotary_dim`` and
    ``embed_positions``)."""
    parts = ("q_proj", "k_proj", "v_proj", "out_proj", "rotary_dim", "embed_positions")
    return all(hasattr(m, p) for p in parts)


def _linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj)


def load_gptj(attention: nn.Module, _model: nn.Module | None = None) -> MultiHeadSelfAttention:
    """Our module from a GPT-J block: interleaved rotary positions over ``rotary_dim`` features
    (the whole head when it is None), scores divided by ``sqrt(d_head)``."""
    d_head = attention.head_dim
    rotary = RotaryEmbedding.default(
        d_head, _BASE, rot_dim=attention.rotary_dim or d_head, interleaved=True
    )
    return load_linears(
        _linears(attention),
        num_heads=attention.num_attention_heads,
        scale=1.0 / math.sqrt(d_head),
        rotary=rotary.to(attention.q_proj.weight.device),
    )


def store_gptj(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a GPT-J block (the inverse of ``load_gptj``)."""
    store_linears(ours, _linears(attention))


def _finish(block: nn.Module, out: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
    return block.resid_dropout(out)


#: ``x + attn(ln_1(x)) + mlp(ln_1(x))``: one norm for both blocks
LAYERS = LayerLayout(
    attention="attn",
    projections=("q_proj", "k_proj", "v_proj", "out_proj"),
    attention_norm="ln_1",
    final_norm="ln_f",
    embeddings="wte",
    parallel=lambda _block: True,
)

FAMILY = Family(
    "GPT-J",
    "q_proj/k_proj/v_proj/out_proj, interleaved partial rotary positions (rotary_dim), "
    "parallel attention and MLP: GPT-J",
    is_gptj,
    load_gptj,
    lambda _block: True,
    _finish,
    store_gptj,
    values=lambda block: (block.v_proj, whole),
    kinds=("decoder",),
    layers=LAYERS,
)

"""GPT-2: W_Q, W_K, W_V fused in one ``c_attn`` and W_O in ``c_proj``, both ``Conv1D`` (weights
``[in, out]``, the transpose of ``nn.Linear``'s), learned absolute positions (``wpe``) and
pre-norm sequential layers (``ln_1``, ``attn``, ``ln_2``, ``mlp``; ``ln_f`` after the last).

transformers: ``models/gpt2/modeling_gpt2.py`` (``GPT2Attention``, ``GPT2Block``);
TransformerLens: ``pretrained/weight_conversions/gpt2.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.record import Family, LayerLayout, ValueOf

__all__ = ["FAMILY", "LAYERS", "is_gpt2", "load_gpt2", "store_gpt2"]


def is_gpt2(m: nn.Module) -> bool:
    """A GPT-2 self-attention block (``c_attn`` and ``c_proj``; not cross-attention)."""
    return hasattr(m, "c_attn") and hasattr(m, "c_proj") and not getattr(m, "is_cross_attention", 0)


def load_gpt2(attention: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a GPT-2 attention block; ``c_attn``/``c_proj`` are Conv1D, i.e.
    ``[in, out]``."""
    if getattr(attention, "is_cross_attention", False):
        raise ValueError("load_gpt2 loads self-attention blocks, not GPT-2 cross-attention")
    if getattr(attention, "reorder_and_upcast_attn", False):
        raise ValueError("load_gpt2 does not load blocks with reorder_and_upcast_attn=True")
    d = attention.embed_dim
    w_q, w_k, w_v = attention.c_attn.weight.detach().t().split(d)  # Conv1D -> Linear layout
    b_q, b_k, b_v = attention.c_attn.bias.detach().split(d)
    return MultiHeadSelfAttention.from_projections(
        w_q,
        w_k,
        w_v,
        attention.c_proj.weight.detach().t(),
        b_q,
        b_k,
        b_v,
        attention.c_proj.bias.detach(),
        num_heads=attention.num_heads,
        scale=float(attention.scaling),
    )


def store_gpt2(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a GPT-2 attention block (Conv1D layout, ``[in, out]``)."""
    (w_q, w_k, w_v, w_o), (b_q, b_k, b_v, b_o) = ours.projections()
    if b_q is None or b_o is None:
        raise ValueError("GPT-2 blocks have biases on every projection; our module has none")
    with torch.no_grad():
        attention.c_attn.weight.copy_(torch.cat([w_q, w_k, w_v]).t())
        attention.c_attn.bias.copy_(torch.cat([b_q, b_k, b_v]))
        attention.c_proj.weight.copy_(w_o.t())
        attention.c_proj.bias.copy_(b_o)


def _values(block: nn.Module) -> tuple[nn.Module, ValueOf]:
    """GPT-2 computes Q, K, V in one ``c_attn``: V is the last ``embed_dim`` of its output."""
    d = block.embed_dim
    return block.c_attn, lambda qkv: qkv[..., 2 * d :]


#: ``h = x + attn(ln_1(x))``, then ``h + mlp(ln_2(h))``
LAYERS = LayerLayout(
    attention="attn",
    projections=("c_attn", "c_proj"),
    attention_norm="ln_1",
    mlp_norm="ln_2",
    final_norm="ln_f",
    embeddings="wte",
    positions="wpe",
)

FAMILY = Family(
    "GPT-2 family",
    "c_attn/c_proj",
    is_gpt2,
    lambda block, _model: load_gpt2(block),
    lambda _block: True,
    lambda block, out, _x: block.resid_dropout(out),
    store_gpt2,
    _values,
    kinds=("decoder",),
    layers=LAYERS,
)

"""OPT: ``q_proj``/``k_proj``/``v_proj``/``out_proj`` (biases when ``enable_bias``), no rotary
positions: its learned positions (``OPTLearnedPositionalEmbedding``, looked up at position + 2,
the offset OPT keeps from fairseq) are added to the embeddings by the model, before the first
layer, so they are part of the residual stream's embedding term.

transformers: ``models/opt/modeling_opt.py`` (``OPTAttention``: Q is scaled before the scores,
which is the same as scaling the scores); TransformerLens: ``pretrained/weight_conversions/
opt.py``.
"""

from __future__ import annotations

from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.record import Family, LayerLayout, load_linears, store_linears, whole

__all__ = ["FAMILY", "LAYERS", "is_opt", "load_opt", "store_opt"]


def is_opt(m: nn.Module) -> bool:
    """An OPT attention block (four projections, ``scaling`` and ``enable_bias``)."""
    parts = ("q_proj", "k_proj", "v_proj", "out_proj", "scaling", "enable_bias")
    return all(hasattr(m, p) for p in parts)


def _linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj)


def load_opt(attention: nn.Module, _model: nn.Module | None = None) -> MultiHeadSelfAttention:
    """Our module from an OPT block."""
    return load_linears(
        _linears(attention), num_heads=attention.num_heads, scale=float(attention.scaling)
    )


def store_opt(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into an OPT block (the inverse of ``load_opt``)."""
    store_linears(ours, _linears(attention))


#: ``h = x + self_attn(self_attn_layer_norm(x))``, then ``h + fc2(act(fc1(final_layer_norm(h))))``
#: (the layer's ``final_layer_norm`` is its MLP's norm; the model's final norm is the
#: decoder's); ``do_layer_norm_before=False`` (OPT-350m) applies the same norms after the
#: residual sums instead, which ``layout.check_layer_norms`` refuses
LAYERS = LayerLayout(
    attention="self_attn",
    projections=("q_proj", "k_proj", "v_proj", "out_proj"),
    attention_norm="self_attn_layer_norm",
    mlp_norm="final_layer_norm",
    mlp="fc2",
    mlp_input="fc1",
    final_norm="decoder.final_layer_norm",
    embeddings="decoder.embed_tokens",
    positions="decoder.embed_positions",
)

FAMILY = Family(
    "OPT",
    "q_proj/k_proj/v_proj/out_proj with learned positions (offset 2): OPT",
    is_opt,
    load_opt,
    lambda _block: True,
    store=store_opt,
    values=lambda block: (block.v_proj, whole),
    kinds=("decoder",),
    layers=LAYERS,
)

"""The attention-block families our module can stand in for, one ``Family`` record each: which
blocks it recognises, how their weights map onto ``MultiHeadSelfAttention`` (and back), whether
they are causal and what they do after their output projection.

Every list of supported families (error messages, ``SUPPORTED_FOR_MHSA``) is derived from
``FAMILIES``. The swap itself (our module running in the model's place) is
``mhsa.engine.runs.swap``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention, RotaryEmbedding
from mhsa.engine.families import albert, falcon, gptj, neox, opt, phi
from mhsa.engine.families.gemma import is_gemma, is_gemma2, is_gemma3, load_gemma
from mhsa.engine.families.modernbert import (
    is_modernbert,
    load_modernbert,
    modernbert_finish,
    store_modernbert,
)
from mhsa.engine.families.olmo2 import is_olmo2, load_olmo2
from mhsa.engine.families.parts import window_of
from mhsa.engine.families.phi3 import is_phi3, load_phi3, phi3_values, store_phi3
from mhsa.engine.families.projected import store_projected
from mhsa.engine.families.qwen3 import is_qwen3, load_qwen3
from mhsa.engine.families.record import (
    Family,
    ValueOf,
    bias_of,
    load_linears,
    our_rotary,
    rotary_of,
    store_linears,
)
from mhsa.engine.families.record import (
    whole as _whole,
)

__all__ = [
    "FAMILIES",
    "SUPPORTED_FOR_MHSA",
    "Family",
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


def _gpt2_values(block: nn.Module) -> tuple[nn.Module, ValueOf]:
    """GPT-2 computes Q, K, V in one ``c_attn``: V is the last ``embed_dim`` of its output."""
    d = block.embed_dim
    return block.c_attn, lambda qkv: qkv[..., 2 * d :]


# --- BERT family ------------------------------------------------------------------------------
def _is_bert(m: nn.Module) -> bool:
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


def _bert_finish(block: nn.Module, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return block.output.LayerNorm(block.output.dropout(out) + x)


# --- DistilBERT -------------------------------------------------------------------------------
def _distilbert_linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q_lin, attention.k_lin, attention.v_lin, attention.out_lin)


def load_distilbert(attention: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a DistilBERT attention block (``q_lin``/``k_lin``/``v_lin``/``out_lin``)."""
    return load_linears(_distilbert_linears(attention), num_heads=attention.n_heads)


def store_distilbert(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a DistilBERT attention block."""
    store_linears(ours, _distilbert_linears(attention))


# --- GPT-2 ------------------------------------------------------------------------------------
def _is_gpt2(m: nn.Module) -> bool:
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


# --- Llama-style ------------------------------------------------------------------------------
def _is_llama(m: nn.Module) -> bool:
    """Llama's layout, less the blocks the newer families of the same layout claim (q/k norms:
    Qwen3, OLMo 2, Gemma 3; soft-capping: Gemma 2/3; Gemma)."""
    claimed = (is_qwen3, is_olmo2, is_gemma, is_gemma2, is_gemma3)
    layout = all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim"))
    return layout and not any(claims(m) for claims in claimed)


def _llama_linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj)


def _our_rotary(
    attention: nn.Module, rotary: RotaryEmbedding | nn.Module | None, d_head: int
) -> RotaryEmbedding:
    """The model's rotary embedding as ours (default: RoPE from the block's config)."""
    if rotary is None:
        params = getattr(getattr(attention, "config", None), "rope_parameters", None) or {}
        return RotaryEmbedding.default(d_head, float(params.get("rope_theta", 10000.0)))
    if isinstance(rotary, RotaryEmbedding):
        return rotary
    return our_rotary(rotary)


def load_llama(
    attention: nn.Module, rotary: RotaryEmbedding | nn.Module | None = None
) -> MultiHeadSelfAttention:
    """Our module from a Llama-layout block (``q_proj``/``k_proj``/``v_proj``/``o_proj``: Llama,
    Qwen2, Mistral and models with the same layout), with grouped-query attention.

    Args:
        attention: the block.
        rotary: the model's rotary embedding (``model.rotary_emb``: its ``inv_freq`` and
            ``attention_scaling`` carry the model's rope scaling) or a ``RotaryEmbedding``;
            default: RoPE from the block's config (``rope_theta``, no scaling).

    Raises:
        ValueError: the block normalises Q/K (Qwen3, OLMo-2...) or its rope is dynamic.
    """
    for norm in ("q_norm", "k_norm", "q_layernorm"):
        if getattr(attention, norm, None) is not None:
            raise ValueError(f"load_llama cannot load blocks with {norm} (Q/K normalisation)")
    d_head = attention.head_dim
    projections = _llama_linears(attention)
    return MultiHeadSelfAttention.from_projections(
        *(p.weight.detach() for p in projections),
        *(bias_of(p) for p in projections),
        num_heads=attention.q_proj.weight.shape[0] // d_head,
        num_kv_heads=attention.k_proj.weight.shape[0] // d_head,
        scale=float(attention.scaling),
        rotary=_our_rotary(attention, rotary, d_head).to(attention.q_proj.weight.device),
    )


def store_llama(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a Llama-layout block (the rotary positions are the model's)."""
    store_linears(ours, _llama_linears(attention))


def _load_llama_of_model(block: nn.Module, model: nn.Module) -> MultiHeadSelfAttention:
    config = getattr(block, "config", None)
    for unsupported in ("attn_logit_softcapping", "query_pre_attn_scalar"):
        if getattr(config, unsupported, None) is not None:
            raise ValueError(f"the model's attention uses {unsupported}")
    ours = load_llama(block, rotary_of(model))
    ours.sliding_window = window_of(block)  # Mistral, Qwen2 configs with a window
    return ours


# --- BART family ----------------------------------------------------------------------------
def _is_bart(m: nn.Module) -> bool:
    return all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj", "out_proj", "scaling")) and (
        hasattr(m, "is_decoder") and hasattr(m, "is_causal")
    )


def _bart_linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj)


def load_bart(attention: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a BART-family block (``q_proj``/``k_proj``/``v_proj``/``out_proj``,
    ``scaling``: BART, mBART, Marian); the same module serves its self- and cross-attention
    (cross-attention: ``forward(x, memory=encoder_output)``)."""
    return load_linears(
        _bart_linears(attention), num_heads=attention.num_heads, scale=float(attention.scaling)
    )


def store_bart(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a BART-family block (the inverse of ``load_bart``)."""
    store_linears(ours, _bart_linears(attention))


# --- T5 family --------------------------------------------------------------------------------
def _is_t5(m: nn.Module) -> bool:
    return all(hasattr(m, p) for p in ("q", "k", "v", "o", "relative_attention_num_buckets"))


def _t5_linears(attention: nn.Module) -> tuple[nn.Module, ...]:
    return (attention.q, attention.k, attention.v, attention.o)


def load_t5(attention: nn.Module) -> MultiHeadSelfAttention:
    """Our module from a T5 block (``q``/``k``/``v``/``o``, no biases, no score scaling: T5,
    Flan-T5 / T5 v1.1). Its relative position bias is not a weight of our module: it comes in
    as a float mask added to the scores (``t5_position_bias``)."""
    return load_linears(
        _t5_linears(attention), num_heads=attention.n_heads, scale=float(attention.scaling)
    )


def store_t5(ours: MultiHeadSelfAttention, attention: nn.Module) -> None:
    """Our module's weights into a T5 block (its relative position bias stays the model's)."""
    store_linears(ours, _t5_linears(attention))


def t5_position_bias(
    attention: nn.Module, given: torch.Tensor | None, t: int, s: int
) -> torch.Tensor | None:
    """The relative position bias ``[1, H, T, S]`` a T5 block adds to its scores: the one its
    layer passed down, else the block's own (the first layer's block holds the bucket
    embedding: the model's ``compute_bias``, reused rather than ported, so the buckets are the
    model's by construction), else none (cross-attention)."""
    if given is not None:
        return given
    if not attention.has_relative_attention_bias:
        return None
    return attention.compute_bias(t, s, device=attention.relative_attention_bias.weight.device)


def _t5_returns(
    out: torch.Tensor, weights: torch.Tensor | None, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(output, position_bias, weights)``, as a T5 block returns them: its layer hands the bias
    on to the next layers (None where there is none; T5 hands on zeros there, which the next
    block of ours would only add)."""
    return out, bias, weights


# --- the registry -----------------------------------------------------------------------------
def _causal_unless_told(block: nn.Module) -> bool:
    """The q_proj/k_proj/v_proj decoders' blocks: causal unless the block's ``is_causal`` says
    otherwise."""
    return bool(getattr(block, "is_causal", True))


def _v_proj_values(block: nn.Module) -> tuple[nn.Module, ValueOf]:
    """The values are the whole output of the block's ``v_proj``."""
    return block.v_proj, _whole


def _projected_decoder(
    name: str,
    layout: str,
    matches: Callable[[nn.Module], bool],
    load: Callable[[nn.Module, nn.Module], MultiHeadSelfAttention],
) -> Family:
    """A decoder family of separate ``q_proj/k_proj/v_proj/o_proj`` (``store_projected``, V
    from ``v_proj``), causal unless the block says otherwise."""
    return Family(
        name,
        layout,
        matches,
        load,
        _causal_unless_told,
        store=store_projected,
        values=_v_proj_values,
        kinds=("decoder",),
    )


FAMILIES: tuple[Family, ...] = (
    Family(
        "BERT family",
        "query/key/value + output.dense: BERT, RoBERTa, ELECTRA, MiniLM",
        _is_bert,
        lambda block, _model: load_bert(block),
        lambda block: bool(getattr(block.self, "is_causal", False)),
        _bert_finish,
        store_bert,
        lambda block: (block.self.value, _whole),
        kinds=("encoder",),
    ),
    Family(
        "DistilBERT",
        "q_lin/k_lin/v_lin/out_lin",
        lambda m: hasattr(m, "q_lin") and hasattr(m, "out_lin"),
        lambda block, _model: load_distilbert(block),
        lambda _block: False,
        store=store_distilbert,
        values=lambda block: (block.v_lin, _whole),
        kinds=("encoder",),
    ),
    Family(
        "GPT-2 family",
        "c_attn/c_proj",
        _is_gpt2,
        lambda block, _model: load_gpt2(block),
        lambda _block: True,
        lambda block, out, _x: block.resid_dropout(out),
        store_gpt2,
        _gpt2_values,
        kinds=("decoder",),
    ),
    Family(
        "Llama-style",
        "q_proj/k_proj/v_proj/o_proj with rotary positions and grouped-query attention: Llama, "
        "Qwen2, Mistral",
        _is_llama,
        _load_llama_of_model,
        _causal_unless_told,
        store=store_llama,
        values=_v_proj_values,
        kinds=("decoder",),
    ),
    Family(
        "BART family",
        "q_proj/k_proj/v_proj/out_proj with learned positions, self- and cross-attention: BART, "
        "mBART, Marian",
        _is_bart,
        lambda block, _model: load_bart(block),
        lambda block: bool(block.is_causal),
        store=store_bart,
        values=_v_proj_values,
        kinds=("encoder-decoder",),
    ),
    Family(
        "T5 family",
        "q/k/v/o without biases or scaling, relative position bias: T5, Flan-T5",
        _is_t5,
        lambda block, _model: load_t5(block),
        lambda block: bool(block.is_causal),
        store=store_t5,
        values=lambda block: (block.v, _whole),
        score_bias=t5_position_bias,
        returns=_t5_returns,
        kinds=("encoder-decoder",),
    ),
    neox.FAMILY,
    gptj.FAMILY,
    phi.FAMILY,
    opt.FAMILY,
    falcon.FAMILY,
    albert.FAMILY,
    _projected_decoder(
        "Qwen3",
        "q_proj/k_proj/v_proj/o_proj with an RMSNorm of each head's query and key (q_norm/k_norm)",
        is_qwen3,
        load_qwen3,
    ),
    _projected_decoder(
        "Gemma",
        "Llama's layout; embeddings scaled by sqrt(d_model), norms x / rms(x) * (1 + w)",
        is_gemma,
        load_gemma,
    ),
    _projected_decoder(
        "Gemma 2",
        "q_proj/k_proj/v_proj/o_proj with attention-logit soft-capping, query_pre_attn_scalar, "
        "sliding windows on alternate layers, norms after attention and MLP outputs",
        is_gemma2,
        load_gemma,
    ),
    _projected_decoder(
        "Gemma 3 (text)",
        "Gemma 2's layout with per-head q/k norms (1 + w) and local rope on sliding layers",
        is_gemma3,
        load_gemma,
    ),
    _projected_decoder(
        "OLMo 2",
        "q_proj/k_proj/v_proj/o_proj with an RMSNorm of the whole query and key projections, "
        "norms after attention and MLP outputs",
        is_olmo2,
        load_olmo2,
    ),
    Family(
        "Phi-3",
        "fused qkv_proj + o_proj with rotary positions (partial) and grouped-query attention",
        is_phi3,
        load_phi3,
        _causal_unless_told,
        store=store_phi3,
        values=phi3_values,
        kinds=("decoder",),
    ),
    Family(
        "ModernBERT",
        "fused Wqkv + Wo with rotary positions, global and local (sliding-window) layers",
        is_modernbert,
        load_modernbert,
        lambda _block: False,
        finish=modernbert_finish,
        store=store_modernbert,
        values=lambda block: (block.Wqkv, lambda qkv: qkv[..., 2 * block.config.hidden_size :]),
        kinds=("encoder",),
    ),
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

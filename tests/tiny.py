"""Tiny random transformers models for tests, saved to a folder as a user's model would be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mhsa

#: the sizes every tiny decoder shares: 2 layers, 4 query heads of 8 dimensions
DECODER_SIZES = {
    "vocab_size": 30522,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
}


#: the conftest fixtures (names) of the models both engines run: the embedded model and the
#: tiny random ones (Mistral's sliding window is shorter than a test sentence: the model's own
#: mask is used)
ENGINE_MODELS = (
    "minilm",
    "tiny_gpt2_path",
    "tiny_distilbert_path",
    "tiny_llama_path",
    "tiny_qwen2_path",
    "tiny_mistral_path",
)


def hand_result(attention, tokens: list[str], **fields) -> mhsa.AttentionResult:
    """An ``AttentionResult`` of hand-made ``attention`` (``[layers, heads, n, n]``, stored as
    float32) over ``tokens``: one word a token, no specials, no punctuation; ``fields``
    override any other field (``layer_ids``, ``model``...)."""
    import numpy as np

    n = len(tokens)
    values = {
        "text": " ".join(tokens),
        "tokens": tokens,
        "attention": np.asarray(attention).astype(np.float32),
        "offsets": [(0, 0)] * n,
        "special": [False] * n,
        "punctuation": [False] * n,
        "word_ids": list(range(n)),
        "model": "hand-made",
        "engine": "transformers",
        "device": "cpu",
    }
    return mhsa.AttentionResult(**{**values, **fields})


def save_tiny(folder: str | Path, model) -> str:
    """Save ``model`` with a tokenizer into ``folder``; any tokenizer available offline will do:
    the embedded model's WordPiece tokenizer."""
    from transformers import AutoTokenizer

    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(mhsa.engine.models.loading.default_model_path()).save_pretrained(
        folder
    )
    return str(folder)


#: token ids of the embedded WordPiece tokenizer the tiny encoder-decoders use: [PAD], [CLS],
#: [SEP] (the decoder starts from [PAD], as T5 and Marian do)
_PAD, _CLS, _SEP = 0, 101, 102


#: the encoder-decoder families ``tiny_seq2seq`` builds
SEQ2SEQ_FAMILIES = ("bart", "mbart", "marian", "t5", "t5-gated")


def tiny_bert(
    model_class: str = "BertModel", *, layers: int = 2, positions: int = 512, **config: Any
):
    """A tiny random BERT of the embedded model's architecture and vocabulary (30522 WordPiece
    tokens): ``layers`` layers of 4 heads, width 32, feed-forward 64, ``positions`` positions,
    as ``transformers.<model_class>`` (``"BertForMaskedLM"`` with its masked-LM head); ``config``
    adds to ``BertConfig`` (``initializer_range=0.4``). Not seeded: the caller seeds torch
    first."""
    import transformers as tf

    bert_config = tf.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=positions,
        **config,
    )
    return getattr(tf, model_class)(bert_config)


def tiny_seq2seq(family: str):
    """A tiny random encoder-decoder with its generation head (2 encoder and 2 decoder layers
    of 4 heads, width 32), seeded: ``bart``, ``mbart`` (pre-norm layers and a final norm per
    stack, the same attention), ``marian``, ``t5`` or ``t5-gated`` (Flan-T5's T5 v1.1 layout:
    gated-GELU feed-forward, untied head, the same attention)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    ids = {"pad_token_id": _PAD, "eos_token_id": _SEP, "decoder_start_token_id": _PAD}
    if family in ("t5", "t5-gated"):
        gated = {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}
        extra = gated if family == "t5-gated" else {}
        config = tf.T5Config(
            vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, **ids, **extra
        )
        return tf.T5ForConditionalGeneration(config)
    sizes = {
        "vocab_size": 30522,
        "d_model": 32,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "max_position_embeddings": 64,
        "bos_token_id": _CLS,
        "forced_eos_token_id": None,
    }
    if family == "bart":
        return tf.BartForConditionalGeneration(tf.BartConfig(**sizes, **ids))
    if family == "mbart":
        return tf.MBartForConditionalGeneration(tf.MBartConfig(**sizes, **ids))
    if family == "marian":
        return tf.MarianMTModel(tf.MarianConfig(**sizes, decoder_vocab_size=30522, **ids))
    raise ValueError(f"No tiny {family!r}: one of {', '.join(SEQ2SEQ_FAMILIES)}.")


def perturbed_biases(lm: mhsa.engine.LoadedModel) -> mhsa.engine.LoadedModel:
    """``lm`` with random non-zero biases and norm weights, in place (fresh models start them
    at 0 and 1, where a bias left out or a missing centring would go unnoticed). Call it before
    anything builds our modules from the weights."""
    import torch

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in lm.head_model.named_parameters():
            if name.endswith("bias") or "ln" in name or "norm" in name:
                p.copy_(p + 0.5 * torch.randn(p.shape, generator=gen))
    return lm


#: the families of issue 39 part A that ``tiny_family`` builds: decoders, then ModernBERT
FAMILY_MODELS = ("qwen3", "gemma", "gemma2", "gemma3", "olmo2", "phi3", "modernbert")


def tiny_family(name: str, **sizes: int):
    """A tiny random model of one of ``FAMILY_MODELS`` with its head (2 layers of 4 query heads
    of 8 dimensions sharing 2 key/value heads; ModernBERT: 3 layers of 4 heads), seeded, every
    norm weight and bias moved off its initial value (a ``1 + w`` taken for ``w``, or a norm
    left out, would go unnoticed at 0 or 1). Each turns on what its family adds, with windows
    shorter than a test sentence: Qwen3 a sliding window on layer 1; Gemma 2 soft-capping of
    the attention logits and of the final logits, ``query_pre_attn_scalar`` and a window on
    layer 0; Gemma 3 per-head q/k norms, a window and its own rope base on layer 0; Phi-3
    rotary positions on half of each head and a window; ModernBERT a local window on layers
    1 and 2. ``sizes`` override the decoders' sizes (``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, ``head_dim``...; ModernBERT takes the same names), for
    benchmarks."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    gqa = {
        **DECODER_SIZES,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "initializer_range": 0.2,  # 0.02 gives near-uniform heads, where little shows
        **sizes,
    }
    if name == "qwen3":
        config = tf.Qwen3Config(
            **gqa, use_sliding_window=True, sliding_window=4, max_window_layers=1
        )
        model = tf.Qwen3ForCausalLM(config)
    elif name == "gemma":
        model = tf.GemmaForCausalLM(tf.GemmaConfig(**gqa))
    elif name == "gemma2":
        config = tf.Gemma2Config(
            **gqa,
            query_pre_attn_scalar=16,
            attn_logit_softcapping=0.1,
            final_logit_softcapping=0.5,
            sliding_window=4,
        )
        model = tf.Gemma2ForCausalLM(config)
    elif name == "gemma3":
        config = tf.Gemma3TextConfig(
            **gqa,
            query_pre_attn_scalar=16,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"] * (gqa["num_hidden_layers"] // 2),
        )
        model = tf.Gemma3ForCausalLM(config)
    elif name == "olmo2":
        model = tf.Olmo2ForCausalLM(tf.Olmo2Config(**gqa))
    elif name == "phi3":
        sizes = {k: v for k, v in gqa.items() if k != "head_dim"}
        config = tf.Phi3Config(
            **sizes,
            partial_rotary_factor=0.5,
            sliding_window=8,
            pad_token_id=0,
        )
        model = tf.Phi3ForCausalLM(config)
    elif name == "modernbert":
        shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3}
        shape.update({k: v for k, v in sizes.items() if k in shape or k == "num_attention_heads"})
        config = tf.ModernBertConfig(
            vocab_size=30522,
            **{"num_attention_heads": 4, **shape},
            local_attention=4,
            initializer_range=0.2,
            pad_token_id=_PAD,
            bos_token_id=_CLS,
            eos_token_id=_SEP,
            cls_token_id=_CLS,
            sep_token_id=_SEP,
        )
        model = tf.ModernBertForMaskedLM(config)
    else:
        raise ValueError(f"No tiny {name!r}: one of {', '.join(FAMILY_MODELS)}.")
    return moved_off_init(model)


def moved_off_init(model, scale: float = 0.3):
    """``model`` with every bias and norm weight moved off its initial value by ``scale`` times
    seeded normal noise, in place (fresh models start them at 0 and 1, where a bias left out
    would go unnoticed); returns ``model``."""
    import torch

    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower() or ".ln" in name:
                p.add_(scale * torch.randn(p.shape, generator=gen))
    return model

"""A tiny random model of every family our module stands in for
(``mhsa.engine.families.registry.FAMILIES``),
and of some variants, built from a config, seeded, with random non-zero biases and norm weights
(fresh models start them at 0 and 1, where a bias left out would go unnoticed). Each comes with
its head, as checkpoints do (a causal LM, a masked LM, a seq2seq LM); ``save_tiny`` writes one
to a folder, opened by path. A variant is named ``<family> <variant>``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from tests.tiny import DECODER_SIZES, moved_off_init, tiny_bert, tiny_family, tiny_seq2seq

#: the weights' spread: wide enough that heads attend far from uniformly (transformers' 0.02
#: gives near-uniform attention in a tiny model, where a wrong weight hardly shows)
_INIT = 0.2


def _transformers(model_class: str, config_class: str, config: dict):
    """``transformers.<model_class>`` of ``transformers.<config_class>(**config)``, fresh."""
    import transformers as tf

    return getattr(tf, model_class)(getattr(tf, config_class)(**config))


_NEOX = {**DECODER_SIZES, "rotary_pct": 0.5, "attention_bias": True, "initializer_range": _INIT}
_FALCON = {
    "vocab_size": 30522,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "alibi": False,
    "bias": True,
    "parallel_attn": True,
    "max_position_embeddings": 128,
    "initializer_range": _INIT,
}

#: family name and variant -> the transformers model class, its config class and the config
#: of its tiny model
_CONFIGS: dict[str, tuple[str, str, dict]] = {
    "DistilBERT": (
        "DistilBertForMaskedLM",
        "DistilBertConfig",
        {
            "vocab_size": 30522,
            "max_position_embeddings": 64,
            "dim": 32,
            "n_layers": 2,
            "n_heads": 4,
            "hidden_dim": 64,
        },
    ),
    "GPT-2 family": (
        "GPT2LMHeadModel",
        "GPT2Config",
        {"vocab_size": 30522, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4},
    ),
    "Llama-style": ("LlamaForCausalLM", "LlamaConfig", {**DECODER_SIZES, "num_key_value_heads": 2}),
    "GPT-NeoX": ("GPTNeoXForCausalLM", "GPTNeoXConfig", {**_NEOX, "use_parallel_residual": True}),
    "GPT-NeoX sequential": (
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        {**_NEOX, "use_parallel_residual": False},
    ),
    "GPT-J": (
        "GPTJForCausalLM",
        "GPTJConfig",
        {
            "vocab_size": 30522,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_inner": 64,
            "rotary_dim": 4,
            "n_positions": 128,
            "bos_token_id": 101,
            "eos_token_id": 102,
            "initializer_range": _INIT,
        },
    ),
    "Phi": (
        "PhiForCausalLM",
        "PhiConfig",
        {**DECODER_SIZES, "partial_rotary_factor": 0.5, "initializer_range": _INIT},
    ),
    "OPT": (
        "OPTForCausalLM",
        "OPTConfig",
        {
            "vocab_size": 30522,
            "hidden_size": 32,
            "ffn_dim": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "word_embed_proj_dim": 32,
            "max_position_embeddings": 128,
            "pad_token_id": 0,
            "init_std": _INIT,
        },
    ),
    "Falcon": (
        "FalconForCausalLM",
        "FalconConfig",
        {**_FALCON, "multi_query": True, "new_decoder_architecture": False},
    ),
    "Falcon grouped": (
        "FalconForCausalLM",
        "FalconConfig",
        {**_FALCON, "new_decoder_architecture": True, "num_kv_heads": 2},
    ),
    "Falcon per-head": (
        "FalconForCausalLM",
        "FalconConfig",
        {**_FALCON, "multi_query": False, "new_decoder_architecture": False},
    ),
    "ALBERT": (
        "AlbertForMaskedLM",
        "AlbertConfig",
        {
            "vocab_size": 30522,
            "embedding_size": 16,
            "hidden_size": 32,
            "num_hidden_layers": 4,
            "num_hidden_groups": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "max_position_embeddings": 128,
            "initializer_range": _INIT,
        },
    ),
}


#: family name (as ``Family.name``) and variant -> a builder of a tiny random model
TINY_FAMILIES: dict[str, Callable[[], object]] = {
    "BERT family": partial(tiny_bert, "BertForMaskedLM", positions=64),
    "BART family": partial(tiny_seq2seq, "bart"),
    "T5 family": partial(tiny_seq2seq, "t5"),
    **{name: partial(_transformers, *record) for name, record in _CONFIGS.items()},
}


#: issue 39 part A's families (another branch): their tiny models are ``tests.tiny.tiny_family``
PART_A = {
    "Qwen3": "qwen3",
    "Gemma": "gemma",
    "Gemma 2": "gemma2",
    "Gemma 3 (text)": "gemma3",
    "OLMo 2": "olmo2",
    "Phi-3": "phi3",
    "ModernBERT": "modernbert",
}


#: each with its own seed and perturbed norms and biases
TINY_FAMILIES.update({name: partial(tiny_family, model) for name, model in PART_A.items()})


def tiny_family_model(name: str):
    """A tiny random model of ``name`` (a key of ``TINY_FAMILIES``), seeded, biases perturbed."""
    import torch

    torch.manual_seed(0)
    return moved_off_init(TINY_FAMILIES[name]())


def small_vocabulary_model(name: str, vocab: int = 128):
    """A tiny random model of ``name`` (a decoder of ``_CONFIGS`` or ``PART_A``) with a
    vocabulary of ``vocab`` tokens, seeded, biases perturbed: small enough that its
    vocabulary-square matrices (the full OV circuit) can be built in a test."""
    import torch

    torch.manual_seed(0)
    if name in PART_A:
        return moved_off_init(tiny_family(PART_A[name], vocab_size=vocab))
    model_class, config_class, config = _CONFIGS[name]
    return moved_off_init(_transformers(model_class, config_class, {**config, "vocab_size": vocab}))


_LOADED: dict[str, object] = {}


def loaded_tiny(name: str, folder_factory) -> object:
    """``name``'s tiny model saved to a fresh folder (``folder_factory(name)``: pytest's
    ``tmp_path_factory.mktemp``) and loaded by path on the CPU, once per test process (tests
    that change weights load their own copy with ``mhsa.load_model(lm.name)``)."""
    import mhsa
    from tests.tiny import save_tiny

    if name not in _LOADED:
        folder = folder_factory(name.replace(" ", "-"))
        _LOADED[name] = mhsa.load_model(save_tiny(folder, tiny_family_model(name)), device="cpu")
    return _LOADED[name]


def check_engine(
    lm, monkeypatch, text: str = "The quick brown fox jumps over the lazy dog."
) -> None:
    """Engine ``mhsa`` equals the model's eager run in every layer's attention (<= 1e-4) and in
    the final hidden state (a padded batch of two; ``verify`` for encoder-decoders) while the
    model's own attention blocks' ``forward`` raises if called."""
    import numpy as np
    import torch

    import mhsa
    from mhsa.engine.runs.swap import OurPass, forward_through_ours, our_blocks

    tol = 1e-4
    with lm.lock:
        blocks = our_blocks(lm)
    shared = len({id(b.original) for b in blocks}) < len(blocks)

    def refuse(*_args, **_kwargs):
        raise AssertionError("the model's own attention forward ran")

    inputs = dict(lm.tokenizer([text, "A short one."], return_tensors="pt", padding=True))
    with monkeypatch.context() as patched:
        for cls in {type(b.original) for b in blocks}:
            patched.setattr(cls, "forward", refuse)
        ours = mhsa.attend(text, model=lm, engine="mhsa")
        if not lm.is_encoder_decoder:
            with torch.inference_mode():
                mine = forward_through_ours(lm, inputs, OurPass(need_weights=False))
    theirs = mhsa.attend(text, model=lm, engine="transformers")
    assert ours.attention.shape == theirs.attention.shape
    per_layer = np.abs(ours.attention - theirs.attention).max(axis=(1, 2, 3))
    assert per_layer.max() <= tol, per_layer
    if shared:  # layers sharing a block (ALBERT) still attend differently: not one result
        assert np.abs(theirs.attention[0] - theirs.attention[-1]).max() > 1e-3
    if not lm.is_encoder_decoder:
        with torch.inference_mode(), lm.lock:
            own = lm.model(**inputs).last_hidden_state
        real = inputs["attention_mask"].bool()
        assert float((mine.last_hidden_state - own)[real].abs().max()) <= tol
        assert float(own.abs().max()) > 0.1
    verified = mhsa.attend(text, model=lm, engine="mhsa", verify=True)
    assert verified.max_abs_diff <= tol and verified.hidden_max_abs_diff <= tol

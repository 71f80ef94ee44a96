"""The transformers architectures training builds (``TrainConfig.family``), one record each: what
the trainer, the model card and the Train heads page need to know of a family. Adding one is a
record here (and, for the ``mhsa`` engine, its attention layout in
``mhsa.engine.families.registry.FAMILIES``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mhsa.registry import lookup

__all__ = ["MODEL_FAMILIES", "ModelFamily", "model_family"]


@dataclass(frozen=True)
class ModelFamily:
    """An architecture a toy model can have: a causal LM, or an encoder-decoder.

    Attributes:
        name: the ``TrainConfig.family`` value ("llama").
        label: for people (the page's choice).
        model_class: the transformers class the saved folder loads as (the model card).
        rotary: rotary positions rotate pairs of features, so a head's width must be even.
        config: the transformers config for ``(vocab_size, max_positions, layers, heads, width,
            special token ids)``.
        model: the transformers class itself, from the config (imported when needed).
        mlp_out: the path, from a layer, of the module that projects the feed-forward block's
            output (fixed at zero for an attention-only model).
        mlp_parts: the paths, from a layer, of the modules that make up its feed-forward block
            (frozen in an attention-only model); a module holding all of them is a layer.
        encoder_decoder: an encoder-decoder (trains the tasks with ``encoder_decoder``), whose
            config takes a decoder start token.
    """

    name: str
    label: str
    model_class: str
    rotary: bool
    config: Callable[..., Any]
    model: Callable[[], type]
    mlp_out: str
    mlp_parts: tuple[str, ...] = ("mlp",)
    encoder_decoder: bool = False


def _gpt2_config(vocab: int, positions: int, layers: int, heads: int, width: int, **ids: int):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
        **ids,
    )


def _llama_config(vocab: int, positions: int, layers: int, heads: int, width: int, **ids: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=positions,
        tie_word_embeddings=False,
        attn_implementation="eager",
        **ids,
    )


def _bart_config(vocab: int, positions: int, layers: int, heads: int, width: int, **ids: int):
    """``layers`` encoder and ``layers`` decoder layers; the feed-forward width twice the model's
    (the shipped folder stays small); no dropout; start decoding with ``[BOS]``."""
    from transformers import BartConfig

    return BartConfig(
        vocab_size=vocab,
        max_position_embeddings=positions,
        d_model=width,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=2 * width,
        decoder_ffn_dim=2 * width,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        attn_implementation="eager",
        decoder_start_token_id=ids["bos_token_id"],
        forced_eos_token_id=None,
        **ids,
    )


def _gpt2_class() -> type:
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel


def _llama_class() -> type:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM


def _bart_class() -> type:
    from transformers import BartForConditionalGeneration

    return BartForConditionalGeneration


#: every family training builds, by name; the first is the default
MODEL_FAMILIES: Mapping[str, ModelFamily] = MappingProxyType(
    {
        f.name: f
        for f in (
            ModelFamily(
                "llama",
                "Llama style (rotary positions)",
                "LlamaForCausalLM",
                True,
                _llama_config,
                _llama_class,
                "mlp.down_proj",
            ),
            ModelFamily(
                "gpt2",
                "GPT-2 style (learned positions)",
                "GPT2LMHeadModel",
                False,
                _gpt2_config,
                _gpt2_class,
                "mlp.c_proj",
            ),
            ModelFamily(
                "bart",
                "BART encoder-decoder (learned positions; self and cross attention)",
                "BartForConditionalGeneration",
                False,
                _bart_config,
                _bart_class,
                "fc2",
                mlp_parts=("fc1", "fc2"),
                encoder_decoder=True,
            ),
        )
    }
)


def model_family(name: str) -> ModelFamily:
    """The family called ``name``.

    Raises:
        ValueError: no such family; the message lists them.
    """
    return lookup(
        MODEL_FAMILIES,
        name,
        "family",
        error=ValueError,
        message=f"family must be one of {', '.join(MODEL_FAMILIES)}, not {name!r}.",
    )

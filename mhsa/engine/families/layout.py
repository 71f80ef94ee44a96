"""The parts of a decoder layer the residual decomposition (``mhsa.causal.attribution``,
``mhsa.causal.flow``) reads, found by structure: the final norm, each layer's MLP, and the checks
that a
model's layers are a sum the decomposition covers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mhsa.engine.models.loading import LoadedModel
from mhsa.errors import UnsupportedModelError

__all__ = [
    "attention_norm_of",
    "check_layer_norms",
    "check_sums",
    "final_norm_of",
    "mlp_of",
    "post_norm_error",
]


def post_norm_error(lm: LoadedModel) -> UnsupportedModelError:
    """The refusal of a post-norm model, saying why and what to use instead."""
    return UnsupportedModelError(
        f"{lm.display_name} is a post-norm encoder (BERT family): its LayerNorm sits inside each "
        "layer, after every residual sum, so its last hidden state is not a sum of the heads' "
        "and MLPs' outputs and a residual-stream decomposition does not apply. Use a causal "
        "language model with pre-norm layers: GPT-2, the Llama family (Llama, Qwen2, Mistral) "
        "or a toy model such as toy:induction."
    )


_FINAL_NORMS = ("ln_f", "norm", "final_layernorm", "final_layer_norm", "final_norm")


def final_norm_of(lm: LoadedModel) -> nn.Module:
    """The base model's final norm (OPT keeps it in its ``decoder``; ModernBERT names it
    ``final_norm``)."""
    for owner in (lm.model, getattr(lm.model, "decoder", None)):
        for name in _FINAL_NORMS:
            module = getattr(owner, name, None)
            if isinstance(module, nn.Module):
                return module
    raise UnsupportedModelError(
        f"{lm.display_name}: no final norm found ({', '.join(_FINAL_NORMS)}): the "
        "decomposition covers pre-norm decoders."
    )


def mlp_of(layer: nn.Module) -> nn.Module | None:
    """The module whose output is the layer's MLP output: ``mlp``, or OPT's ``fc2``."""
    for name in ("mlp", "fc2"):
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


#: the norm a layer applies to the residual before its attention, by attribute: GPT-2, GPT-J
#: (``ln_1``), the Llama layout, GPT-NeoX, Phi, Falcon (``input_layernorm``), Falcon's new
#: decoder architecture (``ln_attn``), OPT (``self_attn_layer_norm``)
_ATTENTION_NORMS = ("ln_1", "input_layernorm", "ln_attn", "self_attn_layer_norm", "attn_norm")


def attention_norm_of(layer: nn.Module) -> nn.Module | None:
    """The norm ``layer`` applies to the residual before its attention, or None where its
    attention reads the residual itself (OLMo 2 puts its norms after the blocks; post-norm
    encoders after the residual sums; ModernBERT's first layer an ``nn.Identity``)."""
    for name in _ATTENTION_NORMS:
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module) and getattr(module, "weight", None) is not None:
            return module
    return None


def check_layer_norms(lm: LoadedModel) -> None:
    """Refuse OPT's post-norm layers and its projection after the final norm by name."""
    config = lm.config
    if getattr(config, "do_layer_norm_before", True) is False:
        raise post_norm_error(lm)
    if getattr(getattr(lm.model, "decoder", None), "project_out", None) is not None:
        raise UnsupportedModelError(
            f"{lm.display_name}: a project_out after the final norm (word_embed_proj_dim "
            f"{config.word_embed_proj_dim} != hidden_size {config.hidden_size}): direct logit "
            "attribution, the logit lens and the information flow do not cover it."
        )


def check_sums(
    model: str,
    resid_pre: Sequence[torch.Tensor],
    attn_out: Sequence[torch.Tensor],
    mlp_out: Sequence[torch.Tensor],
    resid_post: Sequence[torch.Tensor],
) -> None:
    """Every layer's output is its input plus its attention and MLP outputs, as the
    decomposition assumes (a layer that norms or scales a block's output is refused here rather
    than decomposed wrongly).

    Raises:
        UnsupportedModelError: naming the first layer whose output is another sum.
    """
    for layer, whole in enumerate(resid_post):
        summed = resid_pre[layer] + attn_out[layer] + mlp_out[layer]
        gap = float((summed - whole).abs().max())
        if gap > 1e-4 * (1.0 + float(whole.abs().max())):
            raise UnsupportedModelError(
                f"{model}: layer {layer}'s output is not its input plus its attention and MLP "
                f"outputs (off by {gap:.3g}): the residual decomposition does not cover this "
                "layer's layout."
            )

"""A model's layer layout, read from its family's record (``Family.layers``, a
``LayerLayout`` written once in the family's module): the parts of a layer (its attention block,
the norms before and after its attention and MLP, the MLP) and of the model (embeddings,
position embeddings, final norm, unembedding) that the residual decomposition
(``mhsa.causal.attribution``, ``mhsa.causal.flow``), circuits, the weight analyses and QK
attribution read, and the checks that a model's layers are a sum the decomposition covers.

A layer finds its family by the attention block it holds (our ``OurBlock`` carries its
``family``; a model's own block is recognised by ``Family.matches``), a model by its first
attention block; both are remembered per module (weakly: a module let go is forgotten).
No module outside ``mhsa.engine.families`` looks a layer's parts up by a list of names.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import nn

from mhsa.engine.families.record import Family, LayerLayout, Part
from mhsa.engine.families.registry import family_of
from mhsa.engine.models.loading import LoadedModel
from mhsa.errors import UnsupportedModelError

__all__ = [
    "attention_norm_of",
    "attention_of",
    "attention_sum_norm_of",
    "check_layer_norms",
    "check_sums",
    "embedding_norm_of",
    "embeddings_of",
    "encoder_final_norm_of",
    "family_of_layer",
    "family_of_model",
    "final_norm_of",
    "layout_of_layer",
    "layout_of_model",
    "mlp_input_of",
    "mlp_norm_of",
    "mlp_of",
    "mlp_sum_norm_of",
    "part_of",
    "positions_of",
    "post_attention_norm_of",
    "post_mlp_norm_of",
    "post_norm_error",
    "post_norms_of",
    "unembedding_of",
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


_FAMILIES: weakref.WeakKeyDictionary[nn.Module, Family | None] = weakref.WeakKeyDictionary()


def _block_family(module: nn.Module) -> Family | None:
    """The family of ``module`` as an attention block: ours carries it, the model's matches it."""
    carried = getattr(module, "family", None)
    if isinstance(carried, Family):
        return carried
    return family_of(module)


def _first_family(owner: nn.Module) -> Family | None:
    """The family of the first attention block among ``owner``'s modules (itself included),
    remembered for ``owner``."""
    if owner in _FAMILIES:
        return _FAMILIES[owner]
    found = next((f for m in owner.modules() if (f := _block_family(m)) is not None), None)
    _FAMILIES[owner] = found
    return found


def family_of_layer(layer: nn.Module) -> Family | None:
    """The family of the attention block ``layer`` holds (ours or the model's), or None."""
    return _first_family(layer)


def family_of_model(model: nn.Module) -> Family | None:
    """The family of a model's (first) attention block, or None for a model of no registered
    family."""
    return _first_family(model)


def layout_of_layer(layer: nn.Module) -> LayerLayout | None:
    """The layout of ``layer``'s family, or None for a layer of no registered family."""
    family = family_of_layer(layer)
    return None if family is None else family.layers


def layout_of_model(model: nn.Module) -> LayerLayout | None:
    """The layout of a model's family, or None."""
    family = family_of_model(model)
    return None if family is None else family.layers


def part_of(owner: nn.Module | None, part: Part) -> nn.Module | None:
    """The module ``part`` names in ``owner`` (``LayerLayout``'s dotted path or function), or
    None where the owner has no such part."""
    if owner is None or part is None:
        return None
    if callable(part):
        found = part(owner)
    else:
        found = owner
        for step in part.split("."):
            found = getattr(found, step, None)
            if found is None:
                return None
    return found if isinstance(found, nn.Module) else None


def _layer_part(layer: nn.Module, field: str) -> nn.Module | None:
    layout = layout_of_layer(layer)
    return None if layout is None else part_of(layer, getattr(layout, field))


def attention_of(layer: nn.Module) -> nn.Module | None:
    """The (self-)attention block of ``layer`` (ours, while it stands in), or None."""
    return _layer_part(layer, "attention")


def attention_norm_of(layer: nn.Module) -> nn.Module | None:
    """The norm ``layer`` applies to the residual before its attention, or None where its
    attention reads the residual itself (OLMo 2 puts its norms after the blocks; post-norm
    encoders after the residual sums; ModernBERT's first layer an ``nn.Identity``, which has no
    weight)."""
    norm = _layer_part(layer, "attention_norm")
    return norm if norm is not None and getattr(norm, "weight", None) is not None else None


def mlp_norm_of(layer: nn.Module) -> nn.Module | None:
    """The norm ``layer``'s MLP reads its input through, or None: a parallel layer whose MLP
    reads the attention's norm (GPT-J, Phi, Falcon) has no norm of its own, nor has a layer
    whose MLP reads the residual itself (OLMo 2, post-norm layers)."""
    return _layer_part(layer, "mlp_norm")


def post_attention_norm_of(layer: nn.Module) -> nn.Module | None:
    """The norm ``layer`` applies to its attention's output before the residual sum (Gemma 2/3,
    OLMo 2), or None."""
    return _layer_part(layer, "post_attention_norm")


def post_mlp_norm_of(layer: nn.Module) -> nn.Module | None:
    """The same for ``layer``'s MLP output, or None."""
    return _layer_part(layer, "post_mlp_norm")


def attention_sum_norm_of(layer: nn.Module) -> nn.Module | None:
    """The norm of a post-norm layer's residual sum after its attention (BERT, BART), or None."""
    return _layer_part(layer, "attention_sum_norm")


def mlp_sum_norm_of(layer: nn.Module) -> nn.Module | None:
    """The norm of a post-norm layer's residual sum after its MLP, or None."""
    return _layer_part(layer, "mlp_sum_norm")


def post_norms_of(layer: nn.Module) -> tuple[nn.Module, ...]:
    """Every norm ``layer`` applies after its attention or MLP, to a block's output or to a
    residual sum: none in a pre-norm layer, whose output is its input plus the blocks'
    outputs."""
    norms = (
        post_attention_norm_of(layer),
        post_mlp_norm_of(layer),
        attention_sum_norm_of(layer),
        mlp_sum_norm_of(layer),
    )
    return tuple(n for n in norms if n is not None)


def mlp_of(layer: nn.Module) -> nn.Module | None:
    """The module whose output is the layer's MLP output: ``mlp``, or OPT's ``fc2`` (the
    family's ``LayerLayout.mlp``); None for a layer of no registered family."""
    return _layer_part(layer, "mlp")


def mlp_input_of(layer: nn.Module) -> nn.Module | None:
    """The module that reads ``layer``'s MLP input: OPT's ``fc1``, BERT's ``intermediate``, else
    the MLP itself."""
    layout = layout_of_layer(layer)
    if layout is None:
        return None
    return part_of(layer, layout.mlp_input) if layout.mlp_input is not None else mlp_of(layer)


def _model_part(lm: LoadedModel, field: str) -> nn.Module | None:
    layout = layout_of_model(lm.model)
    return None if layout is None else part_of(lm.model, getattr(layout, field))


def final_norm_of(lm: LoadedModel) -> nn.Module:
    """The base model's final norm (the family's ``LayerLayout.final_norm``: OPT keeps it in its
    ``decoder``, ModernBERT names it ``final_norm``, an encoder-decoder's is its decoder's).

    Raises:
        UnsupportedModelError: the model has none (post-norm models, models of no registered
            family).
    """
    norm = _model_part(lm, "final_norm")
    if norm is None:
        raise UnsupportedModelError(
            f"{lm.display_name}: no final norm found: the decomposition covers pre-norm decoders."
        )
    return norm


def encoder_final_norm_of(lm: LoadedModel) -> nn.Module | None:
    """An encoder-decoder's encoder's final norm (T5, mBART), or None."""
    return _model_part(lm, "encoder_final_norm")


def embeddings_of(lm: LoadedModel) -> nn.Module | None:
    """The base model's token embedding, or None for a model of no registered family."""
    return _model_part(lm, "embeddings")


def positions_of(lm: LoadedModel) -> nn.Module | None:
    """The base model's learned absolute position embeddings (GPT-2's ``wpe``, OPT's
    ``embed_positions``, an encoder's ``embeddings.position_embeddings``), or None."""
    return _model_part(lm, "positions")


def embedding_norm_of(lm: LoadedModel) -> nn.Module | None:
    """The norm between the embeddings and the first layer (an encoder's ``embeddings.
    LayerNorm``, ModernBERT's ``embeddings.norm``), or None."""
    return _model_part(lm, "embedding_norm")


def unembedding_of(lm: LoadedModel) -> nn.Module | None:
    """The head model's projection onto the vocabulary, or None (no head, no family)."""
    layout = layout_of_model(lm.model)
    if layout is None or lm.head_model is None:
        return None
    return part_of(lm.head_model, layout.unembedding)


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

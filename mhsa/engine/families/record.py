"""The ``Family`` record, its ``LayerLayout`` (where a layer keeps its attention, norms and MLP,
and a model its embeddings, final norm and unembedding), and what every family's loader shares:
biases, ``nn.Linear`` copies, the model's rotary embedding as ours.

``mhsa.engine.families.registry`` registers every family in ``FAMILIES``; a family module
imports from here (never from ``mhsa.engine.families.registry``: that would be an import cycle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention, RotaryEmbedding

__all__ = [
    "Family",
    "LayerLayout",
    "Part",
    "ValueOf",
    "bias_of",
    "causal_unless_told",
    "copy_linear",
    "load_linears",
    "our_rotary",
    "rotary_of",
    "store_linears",
    "v_proj_values",
    "whole",
]


#: takes V ``[B, S, G Dh]`` from the output of the module that computes it
ValueOf = Callable[[torch.Tensor], torch.Tensor]


def whole(output: torch.Tensor) -> torch.Tensor:
    """The module's whole output is V (a separate value projection)."""
    return output


#: where a part sits in its owner (a layer, the base model, the head model): a dotted attribute
#: path (``"attention.output.LayerNorm"``; a number steps into a ``ModuleList``), or a function
#: of the owner that gives the module or None, where the place depends on the config or the
#: model; None: the family has no such part
Part = str | Callable[[nn.Module], "nn.Module | None"] | None


@dataclass(frozen=True)
class LayerLayout:
    """Where a family's layers keep their parts, written once for every tool that reads them
    (the residual decomposition, circuits, the weight analyses, QK attribution): each field is
    a ``Part``. TransformerLens likewise keeps one weight-conversion file per family, naming
    each part of the family's layers once.

    A layer is the module that holds the attention block (``OurBlock.layer_place``), except
    T5, whose attention block sits in a ``T5LayerSelfAttention`` inside the ``T5Block``: T5's
    parts are given from the ``T5Block``.

    Attributes:
        attention: in a layer, the (self-)attention block ``Family.matches`` recognises.
        projections: in the attention block, W_Q, W_K, W_V, W_O by attribute, in that order;
            one name for Q, K and V where the family fuses them (``("c_attn", "c_proj")``).
        attention_norm: in a layer, the norm applied to the residual before the attention
            (pre-norm layers); None where the attention reads the residual itself (OLMo 2,
            post-norm encoders).
        mlp_norm: in a layer, the norm applied before the MLP; None where the MLP reads the
            attention's norm (GPT-J, Phi, Falcon's parallel layers) or the residual itself.
        post_attention_norm: in a layer, a norm applied to the attention's output before its
            residual sum (Gemma 2/3, OLMo 2).
        post_mlp_norm: the same for the MLP's output (``post_feedforward_layernorm``).
        attention_sum_norm: in a post-norm layer, the norm of the residual sum after the
            attention (BERT's ``attention.output.LayerNorm``, BART's ``self_attn_layer_norm``).
        mlp_sum_norm: the same after the MLP (BERT's ``output.LayerNorm``).
        mlp: in a layer, the module whose output is what the MLP adds (before a post norm):
            ``mlp``, or OPT's and BART's ``fc2``, BERT's ``output.dense``.
        mlp_input: in a layer, the module that reads the MLP's input, where it is another than
            ``mlp`` (OPT's ``fc1``, BERT's ``intermediate``); None: ``mlp`` itself.
        final_norm: in the base model, the norm after the last layer (OPT keeps it in its
            ``decoder``; an encoder-decoder's is the decoder's); None: post-norm models.
        encoder_final_norm: in the base model, an encoder-decoder's encoder's final norm.
        embeddings: in the base model, the token embedding.
        positions: in the base model, learned absolute position embeddings, if any.
        embedding_norm: in the base model, the norm between the embeddings and the first
            layer (encoders: BERT's ``embeddings.LayerNorm``), if any.
        unembedding: in the head model, the projection onto the vocabulary.
        parallel: whether a layer feeds its MLP the layer's input rather than the residual
            after attention (GPT-NeoX's ``use_parallel_residual``, GPT-J, Phi, Falcon), as
            ``parallel(block)`` of its attention block; None: never.
    """

    attention: Part
    projections: tuple[str, ...]
    attention_norm: Part = None
    mlp_norm: Part = None
    post_attention_norm: Part = None
    post_mlp_norm: Part = None
    attention_sum_norm: Part = None
    mlp_sum_norm: Part = None
    mlp: Part = "mlp"
    mlp_input: Part = None
    final_norm: Part = None
    encoder_final_norm: Part = None
    embeddings: Part = None
    positions: Part = None
    embedding_norm: Part = None
    unembedding: Part = "lm_head"
    parallel: Callable[[nn.Module], bool] | None = None


@dataclass(frozen=True)
class Family:
    """An attention-block layout our module can stand in for.

    Attributes:
        name: for people ("BERT family").
        layout: the block's parts and the models that use it, for people.
        matches: recognises a block of this layout (structural tests rather than class names:
            RoBERTa, ELECTRA, XLM-R... reuse BERT's layout under other names).
        load: our module with the block's weights; gets the block and the whole model (for
            model-level parts such as the rotary embedding). Raises ``ValueError`` saying why
            for a block of this layout that it cannot reproduce.
        causal: whether the block masks later positions.
        finish: what the block does after its output projection, as ``finish(block, out, x)``
            (BERT: dropout, residual and LayerNorm live inside the attention block).
        store: the inverse of ``load``: writes our module's weights into the block, as
            ``store(ours, block)``.
        values: where the block computes V: ``values(block)`` gives the submodule whose output
            holds ``X W_V + b_V`` ``[B, S, G Dh]`` and how to take V from that output (the
            value norms of the ``transformers`` engine read it with a forward hook).
        score_bias: a bias the block adds to its scores besides the mask (T5's relative
            position bias), as ``score_bias(block, given, T, S)``: ``given`` is the bias the
            model's layer passed down (None when the block computes its own); returns
            ``[1|B, H, T, S]`` or None.
        returns: what the block returns, as ``returns(out, weights, bias)`` (``bias``: what
            ``score_bias`` gave); ``(out, weights)`` when None.
        call_order: for models that call one block in several layers (ALBERT's shared
            layers): ``call_order(model, blocks)`` gives, for each layer in the order the
            model runs them, the block it calls (from ``blocks``, the model's distinct
            blocks of this family in module order). None: each block is one layer.
        kinds: the kinds of model the layout comes in (``"encoder"``, ``"decoder"``,
            ``"encoder-decoder"``): the README's family x tool table
            (``mhsa.engine.families.support``) reads
            which tools apply from them.
        layers: where the family's layers and model keep their parts (``LayerLayout``).
        parallel: ``layers.parallel``: whether the layer around the block feeds its MLP the
            layer's input, as ``parallel(block)``; None: never.
    """

    name: str
    layout: str
    matches: Callable[[nn.Module], bool]
    load: Callable[[nn.Module, nn.Module], MultiHeadSelfAttention]
    causal: Callable[[nn.Module], bool]
    finish: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    store: Callable[[MultiHeadSelfAttention, nn.Module], None] | None = None
    values: Callable[[nn.Module], tuple[nn.Module, ValueOf]] | None = None
    score_bias: Callable[[nn.Module, torch.Tensor | None, int, int], torch.Tensor | None] | None = (
        None
    )
    returns: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], tuple] | None = None
    call_order: Callable[[nn.Module, list[nn.Module]], list[nn.Module]] | None = None
    kinds: tuple[str, ...] = ()
    layers: LayerLayout = field(kw_only=True)

    @property
    def parallel(self) -> Callable[[nn.Module], bool] | None:
        """Whether the layer around a block of this family is parallel (``LayerLayout``)."""
        return self.layers.parallel

    def describe(self) -> str:
        """``name (layout)``, for messages that list what is supported."""
        return f"{self.name} ({self.layout})"


def causal_unless_told(block: nn.Module) -> bool:
    """The q_proj/k_proj/v_proj decoders' blocks: causal unless the block's ``is_causal`` says
    otherwise."""
    return bool(getattr(block, "is_causal", True))


def v_proj_values(block: nn.Module) -> tuple[nn.Module, ValueOf]:
    """The values are the whole output of the block's ``v_proj``."""
    return block.v_proj, whole


def bias_of(linear: nn.Module) -> torch.Tensor | None:
    """The projection's bias, detached, or None."""
    return None if getattr(linear, "bias", None) is None else linear.bias.detach()


def copy_linear(linear: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Write ``weight`` (and ``bias``) into an ``nn.Linear``-layout projection, in place.

    Raises:
        ValueError: one side has a bias and the other has none.
    """
    if (bias is None) != (linear.bias is None):
        has = "has no" if linear.bias is None else "has a"
        raise ValueError(f"the block's projection {has} bias and our module does not agree")
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)


def load_linears(
    linears: tuple[nn.Module, ...],
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    scale: float | None = None,
    rotary: RotaryEmbedding | None = None,
) -> MultiHeadSelfAttention:
    """Our module from four ``nn.Linear`` projections W_Q, W_K, W_V, W_O (and their biases)."""
    return MultiHeadSelfAttention.from_projections(
        *(lin.weight.detach() for lin in linears),
        *(bias_of(lin) for lin in linears),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        scale=scale,
        rotary=rotary,
    )


def store_linears(ours: MultiHeadSelfAttention, linears: tuple[nn.Module, ...]) -> None:
    """Our W_Q, W_K, W_V, W_O (and biases) into four ``nn.Linear`` projections, in that order."""
    weights, biases = ours.projections()
    with torch.no_grad():
        for linear, w, b in zip(linears, weights, biases, strict=True):
            copy_linear(linear, w, b)


def rotary_of(model: nn.Module) -> nn.Module:
    """The model's rotary embedding module (its ``inv_freq`` carries the rope scaling).

    Raises:
        ValueError: the model has none.
    """
    for module in model.modules():
        if hasattr(module, "inv_freq") and "rotary" in type(module).__name__.lower():
            return module
    raise ValueError("no rotary embedding with inv_freq found in the model")


def our_rotary(rotary: nn.Module, *, interleaved: bool = False) -> RotaryEmbedding:
    """A model's rotary embedding module as ours: its ``inv_freq`` (the rotated width is twice
    its length: partial rotary needs nothing more) and ``attention_scaling``.

    Raises:
        ValueError: a rope type whose frequencies change with the sequence length.
    """
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type in ("dynamic", "longrope"):
        raise ValueError(
            f"rope type {rope_type!r} changes its frequencies with the sequence length; "
            "our module loads static rope (default, linear, llama3, yarn)"
        )
    return RotaryEmbedding(
        rotary.inv_freq, getattr(rotary, "attention_scaling", 1.0), interleaved=interleaved
    )

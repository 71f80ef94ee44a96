"""The ``Family`` record and what every family's loader shares: biases, ``nn.Linear`` copies,
the model's rotary embedding as ours.

``mhsa.engine.families.registry`` re-exports ``Family`` and registers every family in ``FAMILIES``;
a family
module imports from here (never from ``mhsa.engine.families.registry``: that would be an import
cycle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from mhsa.engine.attention.module import MultiHeadSelfAttention, RotaryEmbedding

__all__ = [
    "Family",
    "ValueOf",
    "bias_of",
    "copy_linear",
    "load_linears",
    "our_rotary",
    "rotary_of",
    "store_linears",
    "whole",
]


#: takes V ``[B, S, G Dh]`` from the output of the module that computes it
ValueOf = Callable[[torch.Tensor], torch.Tensor]


def whole(output: torch.Tensor) -> torch.Tensor:
    """The module's whole output is V (a separate value projection)."""
    return output


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
        parallel: whether the layer around the block feeds its MLP the layer's input rather
            than the residual after attention (GPT-NeoX's ``use_parallel_residual``, GPT-J,
            Phi, Falcon), as ``parallel(block)``; None: never.
        kinds: the kinds of model the layout comes in (``"encoder"``, ``"decoder"``,
            ``"encoder-decoder"``): the README's family x tool table
            (``mhsa.engine.families.support``) reads
            which tools apply from them.
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
    parallel: Callable[[nn.Module], bool] | None = None
    kinds: tuple[str, ...] = ()

    def describe(self) -> str:
        """``name (layout)``, for messages that list what is supported."""
        return f"{self.name} ({self.layout})"


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

"""The model a run trains: a fresh transformers model of the run's family (seeded weights; an
attention-only model's feed-forward outputs zero and frozen), and the same model with its
attention running as our module for the run, our weights written back at the end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.runs.swap import (
    OurBlock,
    OurPass,
    store_our_weights,
    through_our_module,
    trainable_our_blocks,
)
from mhsa.training.families import ModelFamily, model_family
from mhsa.training.tasks import BOS_ID, PAD_ID, SEP_ID, VOCAB

__all__ = [
    "MAX_ENCODER_DECODER_POSITIONS",
    "MAX_POSITIONS",
    "ModelShape",
    "as_loaded_model",
    "build_model",
    "trained_through_ours",
]

#: positions every toy model accepts (the longest task sequence fits)
MAX_POSITIONS = 64
#: positions of an encoder-decoder toy model's encoder and decoder (each reads at most BOS and
#: the symbols; fewer learned positions keep the shipped folder small)
MAX_ENCODER_DECODER_POSITIONS = 32
#: standard deviation of the initial weights (both families' ``initializer_range``)
INIT_STD = 0.02


class ModelShape(Protocol):
    """What building a model reads of a run's settings (``mhsa.training.config.TrainConfig``
    has these and more): the family, its size, whether it has MLPs, and the seed."""

    family: str
    layers: int
    heads: int
    width: int
    mlp: bool
    seed: int


def build_model(
    config: ModelShape,
    *,
    device: str | torch.device = "cpu",
    vocab_size: int | None = None,
    positions: int | None = None,
) -> Any:
    """A fresh transformers model for ``config`` (weights from ``config.seed``; with
    ``mlp=False`` the feed-forward output weights are zero and frozen), in training mode.

    Args:
        config: the run's shape.
        device: where the model is built.
        vocab_size: the vocabulary's size (default: ``VOCAB``'s; a long task's is larger).
        positions: positions the model accepts (default: ``MAX_POSITIONS``, or an
            encoder-decoder's ``MAX_ENCODER_DECODER_POSITIONS``).
    """
    family = model_family(config.family)
    ids = {"bos_token_id": BOS_ID, "eos_token_id": SEP_ID, "pad_token_id": PAD_ID}
    if positions is None:
        positions = MAX_ENCODER_DECODER_POSITIONS if family.encoder_decoder else MAX_POSITIONS
    hf_config = family.config(
        vocab_size or len(VOCAB), positions, config.layers, config.heads, config.width, **ids
    )
    cls = family.model()
    with torch.device(device):
        model = cls(hf_config)
    _init_weights(model, config.seed)
    if not config.mlp:
        _zero_mlps(model, family)
    return model.train()


def _init_weights(model: Any, seed: int) -> None:
    """Every weight matrix and embedding drawn from N(0, 0.02^2), norms' scales one, biases
    zero (the families' own initialisation, GPT-2's scaled output projections aside), from a
    generator of its own: the same seed gives the same weights also while other threads draw
    from torch's global generator, and on every device (drawn on the CPU)."""
    if next(model.parameters()).device.type == "meta":
        return
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a fixed order; tied weights once
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=generator) * INIT_STD)
            elif name.endswith("weight"):  # the scale of a LayerNorm / RMSNorm
                p.fill_(1.0)
            else:
                p.zero_()


def _zero_mlps(model: Any, family: ModelFamily) -> None:
    """Feed-forward outputs fixed at zero: in every layer (a module holding the family's
    ``mlp_parts``) the output projection (``mlp_out``) zero, the feed-forward block frozen."""
    for layer in model.modules():
        if not all(isinstance(getattr(layer, p, None), torch.nn.Module) for p in family.mlp_parts):
            continue
        with torch.no_grad():
            for p in layer.get_submodule(family.mlp_out).parameters():
                if p.device.type != "meta":
                    p.zero_()
        for part in family.mlp_parts:
            layer.get_submodule(part).requires_grad_(False)


def as_loaded_model(model: Any, tokenizer: Any, name: str) -> LoadedModel:
    """A trained model as a ``LoadedModel`` (what ``mhsa.attend`` and the engines take), with
    its LM head: next-token (a causal LM) or the decoder's (an encoder-decoder)."""
    n = sum(p.numel() for p in model.parameters())
    device = next(model.parameters()).device
    seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    return LoadedModel(
        name=name,
        display_name=name,
        model=model.base_model,
        tokenizer=tokenizer,
        device=device,
        num_parameters=n,
        load_seconds=0.0,
        head_model=model,
        lm_head="seq2seq" if seq2seq else "causal",
    )


class _Zero(torch.nn.Module):
    """Stands in for a feed-forward block whose output weights are zero and frozen: it outputs
    exactly what the block would (zeros), without computing them."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hidden)


@contextlib.contextmanager
def _skipped_mlps(model: Any, skip: bool) -> Iterator[None]:
    """Within the block (``skip``) every ``.mlp`` of ``model`` is a ``_Zero``; always put back."""
    found = [
        (m, "mlp", m.mlp)
        for m in model.modules()
        if isinstance(getattr(m, "mlp", None), torch.nn.Module)
    ]
    try:
        for parent, name, _mlp in found if skip else []:
            setattr(parent, name, _Zero())
        yield
    finally:
        for parent, name, mlp in found if skip else []:
            setattr(parent, name, mlp)


@contextlib.contextmanager
def trained_through_ours(
    model: Any, config: ModelShape
) -> Iterator[tuple[list[OurBlock], OurPass]]:
    """Within the block the model's attention runs as our modules (with gradients) and frozen
    zero MLPs are skipped; on the way out (also on an error) our weights are written back and
    the model's own blocks put back."""
    lm = as_loaded_model(model, None, "training")
    blocks = trainable_our_blocks(lm)
    run = OurPass(need_weights=False)
    try:
        with through_our_module(lm, blocks, run), _skipped_mlps(model, not config.mlp):
            yield blocks, run
    finally:
        store_our_weights(blocks)

"""Finding a model's attention blocks for our module (``mhsa.engine.runs.swap``): every block of a
supported
layout (``mhsa.engine.families.registry``' families) in the order the model calls them, each block's
kind
(encoder, decoder self-, cross-attention), the layer counts the config promises, and the
model-level features no family of ours reproduces (refused with ``UnsupportedModelError``)."""

from __future__ import annotations

from torch import nn

from mhsa.engine.families.registry import SUPPORTED_FOR_MHSA, Family, family_of
from mhsa.engine.families.support import TOOLS, tools_needing_our_module
from mhsa.engine.models.loading import LoadedModel
from mhsa.errors import UnsupportedModelError

__all__ = [
    "block_kinds",
    "check_model",
    "find_blocks",
    "in_call_order",
    "layer_counts",
    "unsupported",
]


def find_blocks(model: nn.Module) -> list[tuple[Family, nn.Module, nn.Module, str]]:
    """``(family, block, parent, attribute)`` for every supported attention block, in order."""
    found = []
    for parent in model.modules():
        for attr, child in parent.named_children():
            family = family_of(child)
            if family is not None:
                found.append((family, child, parent, attr))
    return found


def in_call_order(
    model: nn.Module, found: list[tuple[Family, nn.Module, nn.Module, str]]
) -> list[tuple[Family, nn.Module, nn.Module, str]]:
    """``found`` with the blocks of a family that calls one block in several layers (ALBERT's
    shared layers: ``Family.call_order``) listed once per layer, in the order the model calls
    them. Raises ``ValueError`` (from ``call_order``) for sharing it cannot follow."""
    out: list[tuple[Family, nn.Module, nn.Module, str]] = []
    done: set[int] = set()
    for item in found:
        family = item[0]
        if family.call_order is None:
            out.append(item)
            continue
        if id(family) in done:
            continue
        done.add(id(family))
        mine = [f for f in found if f[0] is family]
        by_block = {id(f[1]): f for f in mine}
        out.extend(by_block[id(b)] for b in family.call_order(model, [f[1] for f in mine]))
    return out


def unsupported(lm: LoadedModel, why: str) -> UnsupportedModelError:
    """Our module's refusal of ``lm`` for ``why``, naming the supported families and the tools
    that do run without our module."""
    return UnsupportedModelError(
        f"Our module cannot run {lm.display_name!r} ({lm.config.model_type}): {why}. "
        f"Supported: {SUPPORTED_FOR_MHSA}. Use the transformers engine for this model. "
        f"The tools that need our module ({', '.join(tools_needing_our_module())}) do not "
        f"run on it; {' and '.join(t.label for t in TOOLS if not t.needs_our_module)} do."
    )


def check_model(lm: LoadedModel) -> None:
    """Refuse model-level features no family of ours reproduces."""
    config = lm.config
    position = getattr(config, "position_embedding_type", "absolute")
    if position not in (None, "absolute"):
        raise unsupported(lm, f"position_embedding_type {position!r} (relative position biases)")
    if getattr(config, "alibi", False) or getattr(config, "use_alibi", False):
        raise unsupported(lm, "ALiBi position biases")
    if getattr(config, "relative_attention", False) or config.model_type.startswith("deberta"):
        raise unsupported(lm, "DeBERTa's disentangled attention (content-to-position scores)")


def block_kinds(
    lm: LoadedModel, found: list[tuple[Family, nn.Module, nn.Module, str]]
) -> list[str]:
    """Each found block's kind: "self" for encoders and decoders; for encoder-decoders
    "encoder" (inside the encoder), "decoder" (the decoder's causal self-attention) or "cross"
    (the decoder's other blocks)."""
    if not lm.is_encoder_decoder:
        return ["self"] * len(found)
    encoder = {id(m) for m in lm.model.get_encoder().modules()}
    return [
        "encoder" if id(block) in encoder else "decoder" if family.causal(block) else "cross"
        for family, block, _parent, _attr in found
    ]


def layer_counts(lm: LoadedModel) -> dict[str, int | None]:
    """How many blocks of each kind the config says the model has (None: it does not say)."""
    c = lm.config
    if not lm.is_encoder_decoder:
        return {"self": getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", None)}
    encoder = getattr(c, "encoder_layers", None) or getattr(c, "num_layers", None)
    decoder = getattr(c, "decoder_layers", None) or getattr(c, "num_decoder_layers", None)
    return {"encoder": encoder, "decoder": decoder or encoder, "cross": decoder or encoder}

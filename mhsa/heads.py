"""Head labels: ``L{layer}H{head}``, the one way a head is named in tables, links and files.

Encoder-decoder models have three attentions per layer, so their labels say which one with the
letter: ``E{layer}H{head}`` (encoder self-attention), ``D{layer}H{head}`` (decoder causal
self-attention), ``C{layer}H{head}`` (cross-attention: decoder queries, encoder keys and values).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from mhsa.errors import InputError

__all__ = [
    "KIND_LETTERS",
    "check_heads",
    "head_label",
    "kind_head_label",
    "layer_name",
    "parse_head",
    "parse_head_label",
    "parse_layer_head_label",
]

# at most four digits each: a label from a link is hostile text, and no model has 10,000 layers
_HEAD_LABEL = re.compile(r"L(\d{1,4})H(\d{1,4})")
_LAYER_HEAD_LABEL = re.compile(r"([LEDC]\d{1,4})H(\d{1,4})")

#: the letter that names a layer's attention, by the kind of attention block
#: (``mhsa.engine.runs.swap.BLOCK_KINDS``): "L" for encoders' and decoders' one self-attention
KIND_LETTERS = {"self": "L", "encoder": "E", "decoder": "D", "cross": "C"}


def head_label(layer: int, head: int) -> str:
    """The label of a head, as ``"L2H5"``: table indexes, CSV rows, links and file names."""
    return f"L{layer}H{head}"


def layer_name(kind: str, index: int) -> str:
    """A layer's attention as a label names it: ``"L3"``, or ``"E0"``, ``"D1"``, ``"C1"`` for an
    encoder-decoder's encoder, decoder and cross-attention (``{layer_name}H{head}``)."""
    return f"{KIND_LETTERS[kind]}{index}"


def kind_head_label(kind: str, layer: int, head: int) -> str:
    """A head's label as ``layer_name`` names its attention: ``"L2H5"`` (``kind`` ``self``),
    ``"E0H1"``, ``"D0H1"``, ``"C0H1"`` (an encoder-decoder's encoder, decoder, cross)."""
    return f"{layer_name(kind, layer)}H{head}"


def parse_head_label(label: str) -> tuple[int, int]:
    """``(layer, head)`` of a label ``"L{layer}H{head}"`` (the inverse of ``head_label``).

    Raises:
        ValueError: the text is not such a label (surrounding spaces included).
    """
    match = _HEAD_LABEL.fullmatch(label)
    if match is None:
        raise ValueError(f"{label!r} is not a head label: write L<layer>H<head>, as L0H3.")
    return int(match[1]), int(match[2])


def parse_layer_head_label(label: str) -> tuple[str, int]:
    """``(layer name, head)`` of any head label: ``"L2H5"`` -> ``("L2", 5)``, ``"C0H1"`` ->
    ``("C0", 1)`` (the inverse of ``f"{layer_name(kind, index)}H{head}"``).

    Raises:
        ValueError: the text is no such label.
    """
    match = _LAYER_HEAD_LABEL.fullmatch(label)
    if match is None:
        raise ValueError(
            f"{label!r} is not a head label: write L<layer>H<head>, as L0H3 (encoder-decoders: "
            "E, D or C for the encoder, decoder or cross-attention, as C0H3)."
        )
    return match[1], int(match[2])


def parse_head(item: object) -> tuple[int, int]:
    """``(layer, head)`` from a pair or a label ``"L{layer}H{head}"``."""
    if isinstance(item, str):
        try:
            return parse_head_label(item.strip())
        except ValueError:
            raise InputError(f"{item!r} is not a head: write L<layer>H<head>, as L0H3.") from None
    try:
        layer, head = item  # type: ignore[misc]
        return int(layer), int(head)
    except (TypeError, ValueError) as e:
        raise InputError(f"{item!r} is not a head: give (layer, head) or 'L0H3'.") from e


def check_heads(
    items: Iterable[object], names: Sequence[str], heads: int
) -> tuple[tuple[int, int], ...]:
    """Heads as sorted, distinct ``(block, head)``: labels name a block's attention as ``names``
    do (``L3``; encoder-decoders ``E0``, ``D0``, ``C0``), pairs give the block's number directly.

    Raises:
        InputError: an item that is no head, or a head the model does not have (its size named).
    """
    parsed = sorted({_parse_any_head(i, names, heads) for i in items})
    for layer, head in parsed:
        if not (0 <= layer < len(names) and 0 <= head < heads):
            name = names[layer] if 0 <= layer < len(names) else f"L{layer}"
            raise _no_such_head(f"{name}H{head}", names, heads)
    return tuple(parsed)


def _no_such_head(label: str, names: Sequence[str], heads: int) -> InputError:
    if all(n.startswith("L") for n in names):
        size = f"{len(names)} layers"
    else:
        counts = [(kind, sum(n.startswith(kind[0].upper()) for n in names)) for kind in _KINDS]
        size = ", ".join(f"{n} {kind}" for kind, n in counts) + " attention layers"
    return InputError(
        f"There is no head {label}: the model has {size} of {heads} heads "
        f"({names[0]}H0 to {names[-1]}H{heads - 1})."
    )


_KINDS = ("encoder", "decoder", "cross")


def _parse_any_head(item: object, names: Sequence[str], heads: int) -> tuple[int, int]:
    """``(block, head)`` of a label naming one of ``names``, or of a pair."""
    if not isinstance(item, str):
        return parse_head(item)
    try:
        name, head = parse_layer_head_label(item.strip())
    except ValueError:
        raise InputError(
            f"{item!r} is not a head: write L<layer>H<head>, as L0H3 (encoder-decoders: "
            "E, D or C<layer>H<head> for the encoder, decoder or cross-attention, as C0H3)."
        ) from None
    if name not in names:
        raise _no_such_head(f"{name}H{head}", names, heads)
    return names.index(name), head

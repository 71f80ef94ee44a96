"""Head labels: ``L{layer}H{head}``, the one way a head is named in tables, links and files."""

from __future__ import annotations

import re

__all__ = ["head_label", "parse_head_label"]

# at most four digits each: a label from a link is hostile text, and no model has 10,000 layers
_HEAD_LABEL = re.compile(r"L(\d{1,4})H(\d{1,4})")


def head_label(layer: int, head: int) -> str:
    """The label of a head, as ``"L2H5"``: table indexes, CSV rows, links and file names."""
    return f"L{layer}H{head}"


def parse_head_label(label: str) -> tuple[int, int]:
    """``(layer, head)`` of a label ``"L{layer}H{head}"`` (the inverse of ``head_label``).

    Raises:
        ValueError: the text is not such a label (surrounding spaces included).
    """
    match = _HEAD_LABEL.fullmatch(label)
    if match is None:
        raise ValueError(f"{label!r} is not a head label: write L<layer>H<head>, as L0H3.")
    return int(match[1]), int(match[2])

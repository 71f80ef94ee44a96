"""What a long input materialises: the selected layers and heads, and the dtype they are stored in.

A 22-layer model at 4,096 tokens holds 47 GB of float32 attention; people who examine long
inputs at scale recompute only the patterns they look at (Neuronpedia recomputes them from q and
k outside the fused kernel). ``attend(..., layers=, heads=, attention_dtype=)`` reads a
``Selection``: every other block runs the fused kernel and nothing of it is kept.

Storage dtypes: ``float32`` (the default), ``float16``, ``bfloat16``. numpy has no bfloat16, so
bfloat16 weights are rounded to bfloat16 (the 8-bit mantissa a bfloat16 model holds) and kept in
a float16 array: every weight at or above 2**-14 (float16's smallest normal, 6.1e-5) is exactly
the bfloat16 value; smaller ones keep float16's subnormal precision (within 6e-8).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mhsa.errors import InputError

__all__ = [
    "ATTENTION_DTYPES",
    "Selection",
    "attention_megabytes",
    "check_attention_budget",
    "parse_indices",
    "select",
]

#: storage dtypes of ``attend(attention_dtype=...)``: name -> (numpy dtype held, bytes a weight)
ATTENTION_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.float16),  # rounded to bfloat16 first (module docstring)
}

# at most four digits a number: a range from a link is hostile text
_PART = re.compile(r"\s*(\d{1,4})\s*(?:-\s*(\d{1,4})\s*)?")


@dataclass(frozen=True)
class Selection:
    """Which layers and heads a pass materialises, and how their weights are stored.

    Attributes:
        layers: the real layers, ascending, no repeats.
        heads: the real heads of each selected layer, ascending, no repeats.
        dtype: a key of ``ATTENTION_DTYPES``.
        num_layers, num_heads: the model's sizes.
    """

    layers: tuple[int, ...]
    heads: tuple[int, ...]
    dtype: str
    num_layers: int
    num_heads: int

    @property
    def everything(self) -> bool:
        """All layers and heads (the result is a whole one)."""
        return len(self.layers) == self.num_layers and len(self.heads) == self.num_heads

    @property
    def all_heads(self) -> bool:
        return len(self.heads) == self.num_heads

    @property
    def layer_ids(self) -> list[int] | None:
        """``AttentionResult.layer_ids``: None when every layer is selected."""
        return None if len(self.layers) == self.num_layers else list(self.layers)

    @property
    def head_ids(self) -> list[int] | None:
        """``AttentionResult.head_ids``: None when every head is selected."""
        return None if self.all_heads else list(self.heads)


def parse_indices(spec: str | int | Iterable[int] | None, what: str = "layers") -> list[int] | None:
    """Indices from ``"2"``, ``"0-7"``, ``"0-3,8,10-11"``, an int or a sequence of ints; None
    stays None (everything).

    Raises:
        InputError: text that is no such list (the message shows the form), or a range that
            runs backwards.
    """
    if spec is None:
        return None
    if isinstance(spec, bool):
        raise InputError(f"{what} must be numbers, as 2 or 0-7, not {spec!r}.")
    if isinstance(spec, int | np.integer):
        return [int(spec)]
    if not isinstance(spec, str):
        try:
            return [_index(v, what) for v in spec]
        except TypeError as e:
            raise InputError(f"{what} must be numbers, as 2 or 0-7, not {spec!r}.") from e
    out: list[int] = []
    for part in spec.split(","):
        match = _PART.fullmatch(part)
        if match is None:
            raise InputError(
                f"{what} {spec[:40]!r} is not a list of numbers or ranges: write, say, 2 or 0-7 "
                "or 0-3,8."
            )
        first = int(match[1])
        last = first if match[2] is None else int(match[2])
        if last < first:
            raise InputError(
                f"{what}: the range {first}-{last} runs backwards; write {last}-{first}."
            )
        out.extend(range(first, last + 1))
    return out


def _index(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InputError(f"{what} must be whole numbers, not {value!r}.")
    return int(value)


def _checked(wanted: Sequence[int] | None, size: int, what: str, sizes: str) -> tuple[int, ...]:
    if wanted is None:
        return tuple(range(size))
    if not wanted:
        raise InputError(f"No {what} selected: choose some of the {sizes}.")
    bad = sorted({i for i in wanted if not 0 <= i < size})
    if bad:
        raise InputError(
            f"{what.capitalize()} {', '.join(map(str, bad[:5]))} out of range: the model has "
            f"{sizes} ({what} 0-{size - 1})."
        )
    return tuple(sorted(set(wanted)))


def select(
    num_layers: int,
    num_heads: int,
    layers: str | int | Iterable[int] | None = None,
    heads: str | int | Iterable[int] | None = None,
    attention_dtype: str = "float32",
) -> Selection:
    """The checked selection for a model of ``num_layers`` x ``num_heads``.

    Args:
        num_layers, num_heads: the model's sizes.
        layers, heads: None (all), an index, a sequence of indices, or text as ``"0-7,9"``.
        attention_dtype: ``float32``, ``float16`` or ``bfloat16``.

    Raises:
        InputError: an empty selection, an index out of range (naming the model's sizes), or an
            unknown dtype.
    """
    if attention_dtype not in ATTENTION_DTYPES:
        raise InputError(
            f"Unknown attention_dtype {str(attention_dtype)[:40]!r}: one of "
            f"{', '.join(ATTENTION_DTYPES)}."
        )
    sizes = f"{num_layers} layers of {num_heads} heads"
    return Selection(
        layers=_checked(parse_indices(layers, "layers"), num_layers, "layers", sizes),
        heads=_checked(parse_indices(heads, "heads"), num_heads, "heads", sizes),
        dtype=attention_dtype,
        num_layers=num_layers,
        num_heads=num_heads,
    )


def attention_megabytes(heads: int, queries: int, keys: int, dtype: str = "float32") -> float:
    """Megabytes (2**20 bytes) of one layer's weights for ``heads`` heads."""
    return heads * queries * keys * ATTENTION_DTYPES[dtype].itemsize / 2**20


def check_attention_budget(
    selection: Selection, queries: int, keys: int, max_attention_mb: float | None
) -> None:
    """Refuse, before any work, a selection that would keep more attention than the budget.

    What is kept is the selected heads of every selected layer in the chosen dtype
    (``MHSA_MAX_ATTENTION_MB`` bounds it on a server); the pass itself computes one selected
    layer's float32 weights at a time on top of the model's own activations.

    Raises:
        InputError: naming the numbers and the ways out (fewer layers or heads, float16).
    """
    if max_attention_mb is None:
        return
    layers, heads = len(selection.layers), len(selection.heads)
    per_layer = attention_megabytes(heads, queries, keys, selection.dtype)
    kept = layers * per_layer
    if kept <= max_attention_mb:
        return
    ways = []
    if layers > 1:
        fit = max(1, int(max_attention_mb // per_layer))
        ways.append(f"at most {fit} layer{'s' if fit > 1 else ''}")
    ways.append("fewer heads")
    if selection.dtype == "float32":
        ways.append(f"attention_dtype float16 ({_mb(kept / 2)} MB)")
    raise InputError(
        f"{layers} layers x {heads} heads over {queries:,} x {keys:,} tokens in "
        f"{selection.dtype} hold {_mb(kept)} MB ({_mb(per_layer)} MB a layer), over this "
        f"server's attention budget of {_mb(max_attention_mb)} MB (MHSA_MAX_ATTENTION_MB). "
        f"Choose {', or '.join(ways)}."
    )


def _mb(value: float) -> str:
    """Megabytes for people: whole ones from 10 up, two significant digits below."""
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"

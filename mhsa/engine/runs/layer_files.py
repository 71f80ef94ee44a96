"""A result file written layer by layer: the selected layers of a long input go to disk as the
pass computes them, so that no more than one layer's attention is ever held.

The file is the ordinary ``AttentionResult.save`` format (a compressed ``.npz``: the
``attention`` array and a JSON ``header``), read back by ``AttentionResult.load``: the array's
``.npy`` header is written first for the whole ``[layers, heads, n, n]`` shape, then each
layer's bytes in order as they arrive.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mhsa.engine.extract import attend_layers, model_selection
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.result import AttentionResult
from mhsa.errors import InputError

__all__ = ["save_layers"]


def save_layers(
    path: str | Path,
    text: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    engine: str = "transformers",
    device: str = "auto",
    max_tokens: int | None = None,
    layers: str | int | Sequence[int] | None = None,
    heads: str | int | Sequence[int] | None = None,
    attention_dtype: str = "float32",
    seed: int = 0,
) -> AttentionResult:
    """``attend`` of ``text`` written to ``path`` one layer at a time (``attend_layers``).

    Args:
        path: the ``.npz`` to write (replaced when it exists; removed if the pass fails).
        text, model, engine, device, max_tokens, layers, heads, attention_dtype, seed: as for
            ``attend``.

    Returns:
        The result's header (its ``attention`` empty: ``[0, heads, n, n]``); the file holds
        the attention, ``AttentionResult.load(path)`` reads it.

    Raises:
        InputError, ModelLoadError, UnsupportedModelError: as ``attend``; InputError: the file
            cannot be written.
    """
    lm = resolve_model(model, device)
    model_selection(lm, layers, heads, attention_dtype)  # bad selections fail before the file
    path = Path(path)
    written: list[int] = []
    try:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
            entry = None

            def write(layer: AttentionResult) -> None:
                nonlocal entry
                array = np.ascontiguousarray(layer.attention[0])  # (heads, n, n)
                if entry is None:
                    total = len(_selected_layers(lm, layers))
                    entry = archive.open("attention.npy", "w", force_zip64=True)
                    header = {
                        "descr": np.lib.format.dtype_to_descr(array.dtype),
                        "fortran_order": False,
                        "shape": (total, *array.shape),
                    }
                    np.lib.format.write_array_header_2_0(entry, header)
                entry.write(array.tobytes())
                written.append(layer.layers[0])

            head = attend_layers(
                text,
                write,
                model=lm,
                engine=engine,
                max_tokens=max_tokens,
                layers=layers,
                heads=heads,
                attention_dtype=attention_dtype,
                seed=seed,
            )
            if entry is not None:
                entry.close()
            every = written == list(range(lm.facts()["layers"] or 0))
            meta = {**head.header(), "layer_ids": None if every else written}
            archive.writestr("header.npy", _npy_bytes(json.dumps(meta).encode()))
    except OSError as e:
        path.unlink(missing_ok=True)
        raise InputError(f"Cannot write {path}: {e}") from e
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return head


def _selected_layers(lm: LoadedModel, layers: str | int | Sequence[int] | None) -> list[int]:
    selection = model_selection(lm, layers, None, "float16")
    assert selection is not None  # float16 always selects
    return list(selection.layers)


def _npy_bytes(data: bytes) -> bytes:
    """``data`` as the ``.npy`` of a uint8 array (the header entry ``save`` writes)."""
    buffer = io.BytesIO()
    np.save(buffer, np.frombuffer(data, dtype=np.uint8))
    return buffer.getvalue()

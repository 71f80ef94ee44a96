"""The Overview's attention from elsewhere: an uploaded ``.npz`` or ``.pt`` of attention and
tokens (``mhsa.engine.interop.read_attention_file``: no pickle, ``torch.load`` with
``weights_only=True``), its heads as the notebook view and their statistics."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

import mhsa
from mhsa.engine.interop import ATTENTION_FILE_TYPES, read_attention_file

__all__ = ["ATTENTION_FILE_TYPES", "HELP", "Imported", "imported"]

HELP = (
    "A .npz with the arrays 'attention' [layers, heads, n, n] and 'tokens' (n strings), or a "
    "result downloaded from this page; or a .pt written by torch.save({'attention': tensor or "
    "outputs.attentions, 'tokens': [...]}) (read with weights_only=True: tensors only). "
    "mhsa.from_attention reads the same in Python."
)


@dataclass(frozen=True)
class Imported:
    """An uploaded file's attention, ready for the page.

    Attributes:
        summary: layers, heads, tokens and whether it looks causal, for a caption.
        stats: ``mhsa.head_stats`` of it.
        view_html: the notebook view (self-contained HTML; tokens set as text).
        height: pixels the view needs.
    """

    summary: str
    stats: pd.DataFrame
    view_html: str
    height: int


@st.cache_data(max_entries=4, show_spinner=False)
def imported(name: str, data: bytes) -> Imported:
    """The view of an uploaded file (cached: a rerun does not read it again).

    Raises:
        mhsa.InputError: a file ``read_attention_file`` refuses, or too large for the view.
    """
    result = read_attention_file(data, name)
    layers, heads, n = result.num_layers, result.num_heads, result.num_tokens
    rows = max(layers * 46, 360 + 30 * (1 + n // 10))
    return Imported(
        summary=(
            f"{layers} layers x {heads} heads over {n} tokens, "
            f"{'causal' if result.causal else 'bidirectional'} (read from the weights)"
        ),
        stats=mhsa.head_stats(result),
        view_html=result.show().html,
        height=rows + 90,
    )

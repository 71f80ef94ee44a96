"""The Patching page's values: exact activation patching per head and per position, attribution
patching, and their correlation (``mhsa.causal.patch_heads``, ``mhsa.causal.patch_positions``,
``mhsa.causal.attribution_patching``), each kept in the shared cache."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import pandas as pd

import mhsa
from mhsa.engine.encoding import check_text, encode
from ui.core import LIMITS, Progress, Query, loaded_model, shared

__all__ = [
    "MAX_POSITION_TOKENS",
    "PATCH_MODES",
    "PatchSettings",
    "PatchingView",
    "patch_tokens",
    "patching",
]

#: how the Patching page measures: exact patching, its first-order estimate, or both
PATCH_MODES = {
    "exact": "activation patching: one run per head (exact)",
    "attribution": "attribution patching: one backward pass (first-order estimate)",
    "both": "both, side by side, with their correlation",
}
#: the per-position view (every head at every position of one layer) up to this many tokens
MAX_POSITION_TOKENS = 64
#: the patching tables' columns as the page names them
PLAIN_COLUMNS = {
    "patched": "metric with this head patched",
    "effect": "effect (exact: 1 restores the clean run)",
    "attribution": "metric change, estimated by attribution",
    "effect_attribution": "effect, estimated by attribution",
}


class PatchSettings(NamedTuple):
    """What the Patching page asks besides its clean text (a query's text) and the model.

    ``answer``/``wrong`` are read for models with a next-token head, ``target``/``pair`` for
    the others."""

    corrupted: str
    answer: str
    wrong: str
    target: str
    pair: str
    what: str


@dataclasses.dataclass(frozen=True)
class PatchingView:
    """The Patching page's tables: exact and attribution patching per head (None when the mode
    leaves one out), their correlation (NaN unless both), and the per-position table of one
    layer (None for longer texts or when no layer is asked for)."""

    exact: pd.DataFrame | None
    attribution: pd.DataFrame | None
    correlation: float
    positions: pd.DataFrame | None
    #: the layer of ``positions`` (the one asked for, or the strongest when none was)
    layer: int | None = None

    def strongest_layer(self) -> int:
        """The layer of the head with the largest effect (exact patching's where there is one,
        else attribution's): where the per-position view opens."""
        table = self.shown
        effect = table["effect"].abs().fillna(0.0)
        return int(table["layer"].loc[effect.idxmax()]) if len(effect) else 0

    def largest_disagreement(self) -> tuple[str, float, float] | None:
        """The head whose exact effect and attribution estimate differ most, with both (None
        unless both were computed): what a correlation can hide."""
        if self.exact is None or self.attribution is None:
            return None
        joined = self.exact[["effect"]].join(
            mhsa.causal.patching.attribution_effect(self.attribution)
        )
        gap = (joined["effect"] - joined["effect_attribution"]).abs().dropna()
        if gap.empty:
            return None
        head = gap.idxmax()
        return (
            str(head),
            float(joined.at[head, "effect"]),
            float(joined.at[head, "effect_attribution"]),
        )

    def agreement_line(self) -> str:
        """How well attribution ranks and sizes the heads that matter
        (``mhsa.causal.patching.patching_agreement``), then the largest disagreement and
        Pearson's r over every head, said for what it is. Both tables needed."""
        assert self.exact is not None and self.attribution is not None
        agreement = mhsa.causal.patching.patching_agreement(self.exact, self.attribution)
        gap = self.largest_disagreement()
        worst = (
            f" The largest disagreement: {gap[0]}, {gap[1]:.2f} exact against {gap[2]:.2f} "
            "estimated."
            if gap is not None
            else ""
        )
        return (
            f"{agreement.summary()}{worst} Pearson r over all {len(self.exact)} heads is "
            f"{self.correlation:.2f}; with most heads near 0 it says little about the few "
            "that matter. The dotted line is where the two agree."
        )

    def plain_table(self) -> pd.DataFrame:
        """``table`` with its columns named in plain words, for the page (``PLAIN_COLUMNS``)."""
        return self.table().rename(columns=PLAIN_COLUMNS)

    @property
    def shown(self) -> pd.DataFrame:
        """The first table there is (both carry the runs' metric and tokens in ``attrs``)."""
        table = self.exact if self.exact is not None else self.attribution
        assert table is not None  # a view always has one of them
        return table

    def table(self) -> pd.DataFrame:
        """One row per head, for download: exact patching's columns and attribution's (its
        effect as ``effect_attribution`` when both are there)."""
        if self.exact is None or self.attribution is None:
            return self.shown
        return self.exact.join(
            [
                self.attribution[["attribution"]],
                mhsa.causal.patching.attribution_effect(self.attribution),
            ]
        )


def patch_tokens(query: Query, text: str, what: str) -> tuple[str, ...]:
    """The tokens the model sees for ``text``, as patching encodes it (truncated to the
    server's limit): the page compares the two texts' before it patches.

    Raises:
        InputError: an empty text (named as ``what``).
    """
    key = ("patch-tokens", query.model, query.device, text)

    def compute() -> tuple[str, ...]:
        lm = loaded_model(query.model, query.device)
        with lm.lock:
            encoded = encode(lm, check_text(text, what), None, LIMITS.max_tokens)
        return encoded.tokens.strings

    return shared(key, compute)


def _patch_arguments(query: Query, settings: PatchSettings) -> dict[str, Any]:
    """``mhsa.causal.patch_heads``'s keyword arguments for the settings: the metric's by the model's
    kind (a next-token head: answer and wrong; else the target)."""
    lm = loaded_model(query.model, query.device)
    metric: dict[str, Any]
    if lm.lm_head == "causal":
        metric = {"answer": settings.answer or None, "wrong": settings.wrong or None}
    else:
        pair = settings.pair if settings.target == "similarity" else None
        metric = {"target": settings.target, "text_pair": pair}
    return {"model": lm, "what": settings.what, "max_tokens": LIMITS.max_tokens, **metric}


def patching(
    query: Query,
    settings: PatchSettings,
    mode: str,
    layer: int | None,
    progress: Progress | None = None,
) -> PatchingView:
    """Exact and/or attribution patching of ``query.text`` (the clean text) and
    ``settings.corrupted`` (always through our module, whatever the engine), and the
    per-position table of ``layer`` (None: of the layer with the largest effect, found once
    the heads are patched); each piece kept in the shared cache."""
    if mode not in PATCH_MODES:
        raise mhsa.InputError(f"Unknown mode {mode!r}: choose one of {', '.join(PATCH_MODES)}.")
    base = ("patching", query.text, query.model, query.device, settings)
    clean, corrupted = query.text, settings.corrupted

    def args() -> dict[str, Any]:
        return _patch_arguments(query, settings)

    exact = attribution = positions = None
    if mode in ("exact", "both"):
        exact = shared(
            (*base, "exact"),
            lambda: mhsa.causal.patch_heads(clean, corrupted, progress=progress, **args()),
        )
    if mode in ("attribution", "both"):
        attribution = shared(
            (*base, "attribution"),
            lambda: mhsa.causal.attribution_patching(clean, corrupted, **args()),
        )
    tokens = (exact if exact is not None else attribution).attrs["clean_tokens"]  # type: ignore[union-attr]
    if layer is None:
        layer = PatchingView(exact, attribution, float("nan"), None).strongest_layer()
    if len(tokens) <= MAX_POSITION_TOKENS:
        positions = shared(
            (*base, "positions", layer),
            lambda: mhsa.causal.patch_positions(clean, corrupted, layer, **args()),
        )
    r = float("nan")
    if exact is not None and attribution is not None:
        r = mhsa.causal.patching_correlation(exact, attribution)
    return PatchingView(exact, attribution, r, positions, layer)

"""The Head roles page's values (and the Head statistics' role columns): detection scores and
patterns of the sentence, the repeated-random-tokens induction test, custom rules, attention
sinks and head composition. The definitions live in ``mhsa.analysis.roles`` and
``mhsa.analysis.detection``."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pandas as pd

import mhsa
from mhsa.analysis import detection, roles
from mhsa.analysis.claims import count_claim, rank_claim, ranking_claim
from ui.core import (
    LIMITS,
    Query,
    attention,
    computed_attention,
    generation,
    loaded_model,
    result_cache,
    shared,
)

__all__ = [
    "COMPOSITION_NOTE",
    "CROSS_NOTE",
    "CUSTOM_ROLE",
    "CUSTOM_RULES",
    "ERROR_MEASURES",
    "EXPLANATION",
    "INTRO",
    "MAX_RULE_K",
    "RANDOM_NOTE",
    "REPEATED_NOTE",
    "ROLE_DETECTORS",
    "RULES_WITH_K",
    "SINK_NORMS_NOTE",
    "TYPED_RULE",
    "CompositionView",
    "RoleMeans",
    "RoleOptions",
    "RoleTable",
    "SinkView",
    "attention_sinks",
    "custom_role",
    "head_composition",
    "head_roles",
    "random_induction",
    "sink_value_norms",
    "sink_view",
    "strongest_inputs",
    "token_attention",
    "top_head_caption",
    "top_heads",
    "top_heads_line",
]

#: the named detectors (TransformerLens's head types), in the order the pages show them
ROLE_DETECTORS = roles.DETECTION_PATTERNS
ERROR_MEASURES = roles.ERROR_MEASURES
#: the Head roles page's own pattern, and the rules that build it from the sentence's tokens
CUSTOM_ROLE = "custom rule"
TYPED_RULE = detection.TYPED_RULE
RULES_WITH_K = detection.RULES_WITH_K
CUSTOM_RULES = detection.CUSTOM_RULES
MAX_RULE_K = detection.MAX_RULE_K

#: the page's explanations (what the scores mean, what each section shows)
INTRO = (
    "What each head does, in the field's terms: previous-token, duplicate-token and induction "
    "heads detected by TransformerLens's definitions, attention sinks, and which heads read "
    "what earlier heads write. Detection works on tokens, whatever the sidebar's whole-words "
    "switch."
)
REPEATED_NOTE = (
    "On the first of the test's repeated random sequences (the scores average ten): each "
    "head's stripe below the diagonal is the induction pattern."
)
RANDOM_NOTE = (
    "Induction on repeated random tokens: ten sequences of random token ids (seeded by the "
    "sidebar's seed), each repeated once, no BOS; the score is the mean attention from each "
    "repeated token to the token after its first occurrence. The error measure and the "
    "exclusions do not apply to this test."
)
SINK_NORMS_NOTE = (
    "What the sinks carry: one row per sink (head, position), with the mean attention the "
    "position receives and the norm ‖f_h(x_j)‖ of the value the head reads there (its value "
    "vector after its slice of the output projection; Kobayashi et al. 2020), beside the "
    "head's median over the sentence's positions and their ratio. A ratio well below 1: the "
    "head attends to the sink but takes little from it."
)
CROSS_NOTE = (
    "Head roles are defined on self-attention: each detector compares where a head looks in a "
    "sequence with a pattern of that same sequence's tokens (the token before, an earlier copy, "
    "the token after it), and a sink is a position of that sequence. Cross attention relates "
    "two sequences (decoder tokens to the sentence's), so none of them applies: choose the "
    "encoder's or the decoder's attention in the sidebar."
)
COMPOSITION_NOTE = (
    "Composition reads one residual stream, and an encoder-decoder has two (the encoder's and "
    "the decoder's, joined by cross attention): it is computed for encoder or decoder models."
)
EXPLANATION = """\
**Detection scores** (TransformerLens's `detect_head`): each text's token ids, special tokens
included, give a 0/1 **detection pattern** (which key each query should attend to):
**previous token** (the key just before the query), **duplicate token** (earlier keys with the
query's token), **induction** (the key just after an earlier occurrence of the query's token).
Error measure **mul**: the share of a head's attention that falls on the pattern; **abs**:
1 − mean |attention − pattern| × n (causal models only). **Exclude BOS** ignores attention to
the first token, **exclude the current token** attention to the query itself.

**Repeat random tokens** is the standard induction test: random token ids from the model's
vocabulary, repeated once; a head scores its mean attention from each token of the repeat to
the token after its first occurrence.

**Attention sinks** (Gu et al. 2025, who measure the first token): the mean attention a
position receives from the queries that can attend it; a head sinks on a position when that
exceeds the threshold. In an encoder every query attends every key, so the mean is over all of
them; in a causal model only the queries at or after a position can, so the mean is over those,
and a position is measured only where at least four queries can attend it (the last token's
"mean" would be one query's weight on itself).

**Composition** (weights only, no text): how much a later head's queries (Q), keys (K) or
values (V) read what an earlier head writes: ‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F) with the heads'
OV and QK matrices (Elhage et al. 2021; TransformerLens's definitions).
"""


class RoleOptions(NamedTuple):
    """How a detection pattern is compared with a head's attention (``mhsa.detect_heads``)."""

    error_measure: str = "mul"
    exclude_bos: bool = False
    exclude_current_token: bool = False


@dataclasses.dataclass(frozen=True)
class RoleTable:
    """Detection scores of every head, and the patterns they were measured against.

    Attributes:
        scores: one row per head (``L{l}H{h}``): ``layer``, ``head``, one column per detector.
        patterns: each detector's ``[n, n]`` pattern for the sentence's tokens (none for the
            repeated random tokens).
    """

    scores: pd.DataFrame
    patterns: dict[str, np.ndarray]


def token_attention(query: Query) -> mhsa.AttentionResult:
    """The attention over tokens (detection is defined on token ids: whole words never)."""
    return attention(query._replace(words=False))


def _checked_ids(query: Query, result: mhsa.AttentionResult) -> list[int]:
    """The sentence's token ids (``mhsa.analysis.detection.sequence_ids``: for an encoder-decoder's
    decoder attention, ``Query.kind``, the decoder's), which must be the tokens of ``result``."""
    text = generation(query) if query.generate else query.text  # generation takes the lock
    ids = detection.sequence_ids(
        loaded_model(query.model, query.device),
        text,
        text_pair=query.target or None,
        decoder=query.kind == "decoder",
        max_tokens=LIMITS.max_tokens,
    )
    if len(ids) != result.num_tokens:
        raise mhsa.InputError(
            "Head detection needs the sentence's own tokens; this sentence's attention covers "
            "other tokens (generated text, or a second segment): switch generation off."
        )
    return ids


def _scored(
    result: mhsa.AttentionResult, patterns: dict[str, np.ndarray], options: RoleOptions
) -> pd.DataFrame:
    """Every head's score against each of ``patterns``
    (``mhsa.analysis.detection.detection_table``)."""
    return detection.detection_table(result, patterns, **options._asdict())


def head_roles(query: Query, options: RoleOptions) -> RoleTable:
    """Every head's previous-token, duplicate-token and induction scores on the sentence
    (TransformerLens's ``detect_head``, as ``mhsa.detect_heads`` computes them), on its cached
    attention, with the detection patterns."""
    key = ("roles", query._replace(words=False), options)

    def compute() -> RoleTable:
        result = token_attention(query)
        patterns = detection.named_patterns(_checked_ids(query, result))
        return RoleTable(_scored(result, patterns, options), patterns)

    return shared(key, compute, "Detecting head roles…")


class RoleMeans:
    """The named detectors' scores (default options) averaged over sentences, for the Head
    statistics table; a sentence they cannot score (one token) is left out of the mean."""

    def __init__(self) -> None:
        self._frames: list[pd.DataFrame] = []

    def add(self, query: Query, result: mhsa.AttentionResult) -> None:
        """Score one sentence's ``result`` (a word-level one on its tokens instead)."""
        if result.kind == "cross":  # the detectors score a sequence's tokens on themselves
            return
        if result.word_level:  # detection is defined on tokens
            token_query = query._replace(words=False)
            hit = result_cache().get(token_query)
            result = hit if hit is not None else computed_attention(token_query)
        with contextlib.suppress(mhsa.InputError):
            patterns = detection.named_patterns(_checked_ids(query, result))
            self._frames.append(_scored(result, patterns, RoleOptions()))

    def joined(self, table: pd.DataFrame) -> pd.DataFrame:
        """``table`` (one row per head) with one column per detector (NaN: none scored)."""
        columns = list(ROLE_DETECTORS)
        if not self._frames:
            return table.assign(**dict.fromkeys(columns, np.nan))
        mean = sum(f[columns] for f in self._frames) / len(self._frames)
        return table.join(mean)


def random_induction(query: Query) -> RoleTable:
    """Every head's induction score on repeated random tokens (``mhsa.detect_heads`` with
    ``texts=None``: TransformerLens's demo), seeded by the sidebar's seed."""
    key = ("random-induction", query.model, query.device, query.engine, query.seed)

    def compute() -> RoleTable:
        scores = mhsa.detect_heads(
            None,
            "induction",
            model=loaded_model(query.model, query.device),
            engine=query.engine,
            seed=query.seed,
        )
        frame = scores.rename(columns={"score": "induction"})
        layers_heads = [mhsa.parse_head_label(label) for label in frame.index]
        frame.insert(0, "head", [h for _, h in layers_heads])
        frame.insert(0, "layer", [li for li, _ in layers_heads])
        frame.index.name = "name"
        return RoleTable(frame, {})

    return shared(key, compute, "Repeating random tokens…")


def custom_role(query: Query, rule: str, k: int, rows: str, options: RoleOptions) -> RoleTable:
    """Every head's score against the custom rule's pattern
    (``mhsa.analysis.detection.rule_pattern``)
    on the sentence, under the column ``CUSTOM_ROLE``."""
    key = ("custom-role", query._replace(words=False), rule, k, rows, options)

    def compute() -> RoleTable:
        result = token_attention(query)
        ids = _checked_ids(query, result)
        patterns = {CUSTOM_ROLE: detection.rule_pattern(rule, ids, k=k, rows=rows)}
        return RoleTable(_scored(result, patterns, options), patterns)

    return shared(key, compute, "Scoring the pattern…")


def top_head_caption(
    scores: pd.DataFrame, column: str, layer: int, head: int, note: str = ""
) -> str:
    """One top head's caption: its score and its rank among the heads scored
    (``mhsa.analysis.claims.rank_claim``: ``L1H3: score 0.912, ranks 1st of 8 heads by this
    score``), then ``note``."""
    values = scores[column].dropna()
    label = mhsa.head_label(layer, head)
    rank = int(1 + (values > values[label]).sum())
    claim = rank_claim(label, rank, len(values), "this score", unit="heads", minimum=1)
    return f"{label}: score {values[label]:.3f}, {claim.text.removeprefix(label + ' ')}{note}"


def top_heads(
    scores: pd.DataFrame, column: str, count: int, *, say: Callable[[str], object] | None = None
) -> list[tuple[int, int, float]]:
    """The ``count`` heads of highest ``column`` (``(layer, head, score)``, best first; ties in
    head order; NaN never); ``say`` (a page's caption) is given the ranking as a claim
    (``top_heads_line``) first."""
    if say is not None:
        say(top_heads_line(scores, column, column))
    best = scores[column].dropna().sort_values(ascending=False, kind="stable").head(count)
    return [(*mhsa.parse_head_label(label), float(score)) for label, score in best.items()]


def top_heads_line(scores: pd.DataFrame, column: str, test: str) -> str:
    """The ranking the Top heads figures show, as a claim with its support
    (``mhsa.analysis.claims.ranking_claim``): which head is the strongest of how many on
    ``column``'s score and by how much over the next, or why no head is named (a tie, too few
    heads)."""
    return ranking_claim(scores[column], f"the {test} score")[0].text


class SinkView(NamedTuple):
    """The attention sinks of a sentence, laid out for the page
    (``mhsa.analysis.attention_sinks``)."""

    received: np.ndarray  # [heads, n]: mean attention each key receives (NaN: not measured)
    heads: list[str]
    tokens: list[str]
    share: float  # of heads sinking on at least one position
    first_share: float  # of heads sinking on the first token
    threshold: float
    causal: bool  # each position measured over the queries at or after it

    @property
    def shown(self) -> str:
        """The share of sinking heads as the page's metric shows it."""
        return f"{self.share:.0%}"

    def note(self) -> str:
        """What the map's values are, and Gu et al.'s own measure (the first token's)."""
        over = (
            "the queries at or after it (only they can attend it in a causal model), where at "
            f"least {roles.SINK_MIN_QUERIES} can: the last positions are left blank"
            if self.causal
            else "every query (in an encoder every query attends every key)"
        )
        n = len(self.heads)
        anywhere = count_claim(
            round(self.share * n), n, "sink on at least one position", unit="heads"
        )
        return (
            f"Each position's mean attention from {over}; a head sinks on a position that "
            f"gets more than {self.threshold:g} on average: {anywhere.text}. On the first "
            f"token, as Gu et al. 2025 measure it: {self.first_share:.0%} of the heads sink "
            f"({round(self.first_share * n)} of {n})."
        )


def attention_sinks(query: Query) -> SinkView:
    """Where the heads sink their attention on the sentence (Gu et al. 2025's threshold)."""
    key = ("sinks", query)

    return shared(key, lambda: sink_view(attention(query)))


def sink_view(result: mhsa.AttentionResult) -> SinkView:
    """``mhsa.analysis.attention_sinks`` of a result, laid out for a page (the sentence's, or an
    uploaded file's)."""
    sinks = mhsa.analysis.attention_sinks(result)
    received = sinks.table["received"].to_numpy().reshape(-1, result.num_tokens)
    return SinkView(
        received,
        result.head_labels(),
        list(result.tokens),
        sinks.share,
        sinks.first_share,
        sinks.threshold,
        sinks.causal,
    )


def sink_value_norms(query: Query) -> pd.DataFrame:
    """Each attention sink of the sentence with the value norm its head reads there, beside
    the head's median (``mhsa.analysis.roles.sink_value_norms``), on the sentence's attention
    computed
    with value norms (``Query.norms``) whatever the sidebar's switch."""
    key = ("sink-norms", query)

    def compute() -> pd.DataFrame:
        return roles.sink_value_norms(attention(query._replace(norms=True)))

    return shared(key, compute, "Measuring value norms…")


class CompositionView(NamedTuple):
    """Q-, K- and V-composition between every head and the heads of later layers."""

    scores: dict[str, pd.DataFrame]  # by kind: rows the writing head, columns the reading one
    kinds: tuple[str, ...]
    later_heads: list[str]  # the heads that read from an earlier layer (not layer 0's)


def head_composition(query: Query) -> CompositionView:
    """``mhsa.analysis.head_composition`` of the sidebar's model, every kind (weights only: the
    sentence plays no part)."""
    key = ("composition", query.model, query.device)

    def compute() -> CompositionView:
        lm = loaded_model(query.model, query.device)
        scores = {
            kind: mhsa.analysis.head_composition(lm, kind) for kind in roles.COMPOSITION_KINDS
        }
        labels = list(scores[roles.COMPOSITION_KINDS[0]].columns)
        later = [label for label in labels if mhsa.parse_head_label(label)[0] > 0]
        return CompositionView(scores, roles.COMPOSITION_KINDS, later)

    return shared(key, compute, "Composing heads…")


def strongest_inputs(query: Query, head: str, top: int = 5) -> pd.DataFrame:
    """The heads whose output ``head`` reads most, one column per kind of composition (each
    kind's ``top`` strongest writers, their scores in every kind)."""
    composition = head_composition(query)
    writers: list[str] = []
    for kind in composition.kinds:
        best = mhsa.analysis.strongest_inputs(composition.scores[kind], head, top)
        writers += [w for w in best.index if w not in writers]
    frame = pd.DataFrame(
        {
            f"{kind}-composition": composition.scores[kind].loc[writers, head]
            for kind in composition.kinds
        }
    )
    frame.index.name = "writer"
    return frame

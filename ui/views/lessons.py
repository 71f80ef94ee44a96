"""The lessons' claims measured: each ``ui.lessons.Claim`` names a measure here, computed from
the values the step's page computes for the step's link (the same view functions and the same
shared cache), so a test (``tests/app/test_lessons.py``) can hold every sentence to its figure.

The definitions are the field's: a head's share of attention on the previous token, its entropy
(Clark et al. 2019, ``mhsa.analysis.stats``); the detection scores of TransformerLens's
``detect_head`` (``mhsa.analysis.roles``); the induction pattern's share on the repeat (Olsson et
al. 2022); the anti-diagonal score of cross attention (``mhsa.training.scores``); knock-out
importance and the pruning curve (Michel et al. 2019, ``mhsa.causal``); a head's program and its
accuracy against the best fixed program (Clark et al. 2019; Hayes, Li & Andreas 2026,
``mhsa.explain``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
import pandas as pd

import mhsa
import mhsa.explain
from mhsa.analysis import claims as said
from mhsa.heads import parse_head_label
from mhsa.training.scores import anti_diagonal_scores
from ui.core import Query, attention
from ui.lessons import Claim, Step
from ui.views import atlas as atlas_views
from ui.views import explain, importance, roles
from ui.views.classroom import classroom
from ui.views.statistics import head_stats

__all__ = [
    "MEASURES",
    "Measure",
    "check_claim",
    "claim_text",
    "measure_value",
    "step_query",
    "step_sentence",
    "step_text",
]

Settings = Mapping[str, str]


def _share(value: float | str) -> str:
    """A share as a percentage; one short of 1 that rounds to 100% says "over 99%" (a share of
    0.9999 is not all of the attention)."""
    value = float(value)
    return "over 99%" if 0.995 <= value < 1 else f"{value:.0%}"


def _number(value: float | str) -> str:
    return f"{float(value):.2f}"


def _rank(value: float | str) -> str:
    return said.ordinal(int(float(value)))


class Measure(NamedTuple):
    """A measure of a page's values: its name for people, how it is computed from a step's
    settings and the claim's subject (a head ``L0H2``, a layer ``L1``, or ""), and how a
    sentence shows its value (a share as a percentage, a rank as an ordinal)."""

    label: str
    value: Callable[[Settings, str], float | str]
    shown: Callable[[float | str], str] = _number


def step_query(settings: Settings, kind: str = "encoder") -> Query:
    """The ``ui.core.Query`` a page builds from a lesson link's settings (its text, model and
    an encoder-decoder's target; the sidebar's other defaults)."""
    return Query(
        settings.get("text", ""),
        settings.get("model", "default"),
        target=settings.get("target_text", ""),
        kind=kind,
    )


def _layer(subject: str) -> int:
    """The layer a subject ``L1`` names."""
    return int(subject.removeprefix("L"))


def _stat(column: str) -> Callable[[Settings, str], float]:
    def value(settings: Settings, subject: str) -> float:
        table = head_stats((step_query(settings),))
        return float(table.loc[subject, column])

    return value


def _entropy_share(settings: Settings, subject: str) -> float:
    """The head's mean row entropy over the uniform row's (log n): 1 spreads evenly."""
    result = attention(step_query(settings))
    return float(head_stats((step_query(settings),)).loc[subject, "entropy"]) / math.log(
        result.num_tokens
    )


def _stat_rank(settings: Settings, subject: str) -> float:
    """1 + how many heads of the model have a larger share on the previous token."""
    column = head_stats((step_query(settings),))["to_prev"]
    return float(1 + (column > column[subject]).sum())


def _role_scores(settings: Settings) -> roles.RoleTable:
    query = step_query(settings)
    if settings.get("random_tokens") == "1":
        return roles.random_induction(query)
    return roles.head_roles(query, roles.RoleOptions())


def _detector(settings: Settings) -> str:
    return settings.get("detector", "previous token")


def _role_score(settings: Settings, subject: str) -> float:
    """The head's detection score for the page's detector (TransformerLens, ``mul``)."""
    return float(_role_scores(settings).scores.loc[subject, _detector(settings)])


def _top_role_head(settings: Settings, subject: str) -> str:
    """The head the Head roles page ranks first for its detector."""
    column = _role_scores(settings).scores[_detector(settings)]
    return str(column.idxmax())


def _layer_rank_by_role(settings: Settings, subject: str) -> float:
    """1 + how many heads of the subject's layer score higher for the detector."""
    scores = _role_scores(settings).scores
    layer = scores[scores["layer"] == parse_head_label(subject)[0]][_detector(settings)]
    return float(1 + (layer > layer[subject]).sum())


def _repeat_induction(settings: Settings, subject: str) -> float:
    """The head's mean attention, over the queries that have an earlier copy of their token,
    on the key just after that copy (the induction pattern's rows; Olsson et al. 2022)."""
    query = step_query(settings)
    result = attention(query)
    pattern = roles.head_roles(query, roles.RoleOptions()).patterns["induction"]
    rows = pattern.sum(axis=1) > 0
    layer, head = parse_head_label(subject)
    weights = result.attention[layer, head].astype(np.float64)
    return float((weights * pattern).sum(axis=1)[rows].mean())


def _anti_diagonal(settings: Settings, subject: str) -> float:
    """The best anti-diagonal score of the layer's cross-attention heads (the decoder's k-th
    token on the source's (L-k)-th symbol: reading it backwards)."""
    result = attention(step_query(settings, kind="cross"))
    symbols = len(result.tokens) - 1  # [BOS] s_1 .. s_L
    return float(anti_diagonal_scores(result.attention, symbols)[_layer(subject)].max())


def _walk(settings: Settings) -> mhsa.engine.TraceStep:
    """The Inside MHSA step the link opens, as the page computes it (its defaults: 64 wide
    and 4 heads for fresh weights)."""
    fresh = settings.get("source") == "fresh"
    query = step_query(settings)
    layer = None if fresh else int(settings.get("pretrained_layer", "0"))
    walk = classroom(query, layer, 64, 4, False)
    return walk.steps[min(int(settings.get("step", "0")), len(walk.steps) - 1)]


def _step_name(settings: Settings, subject: str) -> str:
    return _walk(settings).name


def _largest_weight(settings: Settings, subject: str) -> float:
    """The largest of the heads' mean largest weight per query (Voita et al.'s confidence) at
    the step's attention probabilities."""
    weights = np.asarray(_walk(settings).value[0], dtype=np.float64)  # [heads, q, k]
    return float(weights.max(axis=-1).mean(axis=-1).max())


def _importance_run(settings: Settings) -> tuple:
    query = step_query(settings)
    target = settings.get("target")
    target = None if target in (None, "auto") else target
    return importance.importance_and_pruning((query,), "ablation", target, "", False, 0)


def _largest_importance(settings: Settings, subject: str) -> float:
    """The largest importance among the layer's heads (one knocked out at a time)."""
    table, _ = _importance_run(settings)
    return float(table[table["layer"] == _layer(subject)]["importance"].max())


def _pruning_jump(settings: Settings, subject: str) -> float:
    """How far the pruning curve (importance order) moves when the last of the layer's heads
    goes: the heads of the layer off together, beside one of them still on."""
    _, curve = _importance_run(settings)
    curve = curve[curve["order"] == "importance"].reset_index(drop=True)
    prefix = f"L{_layer(subject)}H"
    left = [
        sum(1 for h in str(pruned).split(",") if h.startswith(prefix)) for pruned in curve["pruned"]
    ]
    full = max(left)
    last = left.index(full)
    return float(curve["metric"][last] - curve["metric"][last - 1])


def _atlas_explanation(settings: Settings, subject: str) -> pd.Series:
    """The head's explanation as the Head atlas page shows it: the atlas's saved row, or, for
    an atlas without saved explanations, the search run for that head alone."""
    name = settings["atlas"]
    found = explain.saved_named(name)
    row = None if found is None else explain.head_row(found, subject)
    if row is None:
        atlas = atlas_views.open_named(name)
        found = mhsa.explain.explain_heads(
            atlas, heads=[subject], faithfulness=False, progress=False
        )
        row = explain.head_row(found, subject)
    return row


def _main_part(settings: Settings, subject: str) -> str:
    """The part of the head's program with the most weight: a mix's heavier part (``mix(a, b,
    w)`` is ``w a + (1 - w) b``), a fallback's first (``a | b``: b only where a has no key),
    else the program itself."""
    program = mhsa.explain.parse_program(str(_atlas_explanation(settings, subject)["program"]))
    return str(program.main)


def _explanation_accuracy(settings: Settings, subject: str) -> float:
    return float(_atlas_explanation(settings, subject)["accuracy"])


def _over_baseline(settings: Settings, subject: str) -> float:
    """The program's accuracy less the best fixed program's (Clark et al. 2019)."""
    row = _atlas_explanation(settings, subject)
    return float(row["accuracy"]) - float(row["baseline_accuracy"])


def _hypothesis_accuracy(settings: Settings, subject: str) -> float:
    """The typed program's accuracy on the atlas's held-out texts, as the hypothesis box
    scores it."""
    scores = explain.hypothesis(settings["atlas"], subject, settings["explain_program"])
    return float(scores["accuracy"])


#: every measure a claim can name
MEASURES: dict[str, Measure] = {
    "previous-token share": Measure(
        "share of attention on the previous token (Clark et al. 2019)", _stat("to_prev"), _share
    ),
    "previous-token rank": Measure(
        "rank among all heads by attention on the previous token (1: the most)",
        _stat_rank,
        _rank,
    ),
    "entropy share": Measure(
        "mean entropy of its rows over a uniform row's (log n; 1: spread evenly)",
        _entropy_share,
        _share,
    ),
    "detection score": Measure("detection score of the page's test", _role_score),
    "detection rank in layer": Measure(
        "rank in its layer by the page's detection score (1: the highest)",
        _layer_rank_by_role,
        _rank,
    ),
    "top detected head": Measure("the head the page's test ranks first", _top_role_head, str),
    "induction on the repeat": Measure(
        "mean attention from each repeated token to the token after its earlier copy",
        _repeat_induction,
        _share,
    ),
    "anti-diagonal": Measure(
        "best cross-attention head's anti-diagonal score (the source read backwards)",
        _anti_diagonal,
    ),
    "step": Measure("the step shown", _step_name, str),
    "largest weight": Measure(
        "largest mean over queries of a head's largest weight (Voita et al.'s confidence)",
        _largest_weight,
    ),
    "largest importance": Measure(
        "largest importance of one head of the layer knocked out alone",
        _largest_importance,
        lambda value: f"{float(value):.3f}",
    ),
    "pruning jump": Measure(
        "the pruning curve's step when the last of the layer's heads goes off", _pruning_jump
    ),
    "explanation's main part": Measure(
        "the part with the most weight of the program the atlas's search explains it by",
        _main_part,
        str,
    ),
    "explanation accuracy": Measure(
        "share of held-out queries whose strongest key the head's program names (Clark et al.)",
        _explanation_accuracy,
        _share,
    ),
    "accuracy over the baseline": Measure(
        "the head's program's accuracy less the best fixed program's",
        _over_baseline,
        lambda value: f"{100 * float(value):.0f} points",
    ),
    "hypothesis accuracy": Measure(
        "share of held-out queries whose strongest key the typed program names",
        _hypothesis_accuracy,
        _share,
    ),
}


def measure_value(step: Step, claim: Claim) -> float | str:
    """The claim's measure on the values the step's page computes for its link."""
    return MEASURES[claim.measure].value(step.settings, claim.subject)


def check_claim(step: Step, claim: Claim) -> tuple[bool, float | str]:
    """Whether the claim holds on the step's page, and the measured value."""
    value = measure_value(step, claim)
    if claim.equals is not None:
        return str(value) == claim.equals, value
    return claim.at_least <= float(value) <= claim.at_most, value


def claim_text(claim: Claim) -> str:
    """The claim in words: ``L0H2: share of attention on the previous token >= 0.5``."""
    what = MEASURES[claim.measure].label
    who = f"{claim.subject}: " if claim.subject else ""
    if claim.equals is not None:
        return f"{who}{what} is {claim.equals}"
    bounds = [f">= {claim.at_least:g}"] if claim.at_least > -math.inf else []
    bounds += [f"<= {claim.at_most:g}"] if claim.at_most < math.inf else []
    return f"{who}{what} {' and '.join(bounds)}"


def step_sentence(step: Step) -> said.Claim:
    """The step's sentence rendered from the numbers its claims are checked on: every claim
    measured on the values its page computes for the step's link (``measure_value``) and, when
    every one holds, ``step.says`` with each field ``{i}`` its claim's value as the measure
    shows it (``Measure.shown``). A claim that does not hold, or cannot be measured, is not
    made: the sentence is replaced by what was measured against what it would say.

    Returns:
        A ``mhsa.analysis.claims.Claim``: the text, and as support the claims that hold, of
        the step's claims (all of them needed).
    """
    shown, failed = [], []
    for claim in step.claims:
        try:
            holds, value = check_claim(step, claim)
        except mhsa.MHSAError as e:
            failed.append(f"{claim_text(claim)} could not be measured ({e})")
            continue
        shown.append(MEASURES[claim.measure].shown(value))
        if not holds:
            failed.append(f"{claim_text(claim)}, measured {shown[-1]}")
    n = len(step.claims)
    if failed:
        text = "This step's page does not show what it would say today: " + "; ".join(failed) + "."
        return said.Claim(text, n - len(failed), n, n, False, "claims")
    return said.Claim(step.says.format(*shown), n, n, n, True, "claims")


def step_text(step: Step) -> str:
    """``step_sentence``'s text (what the Lessons page writes)."""
    return step_sentence(step).text

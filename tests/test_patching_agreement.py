"""How well attribution patching ranks and sizes the heads that matter
(``mhsa.causal.patching.patching_agreement``), checked on hand-made tables where Pearson's r over
every head is near 1 and says nothing about the heads between."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mhsa.causal.patching import patching_agreement


def _table(effects: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame({"effect": list(effects.values())}, index=list(effects))


def test_the_heads_that_matter_are_ranked_and_sized_one_by_one() -> None:
    # one dominant head, three that matter in the opposite order by attribution, 60 near 0
    exact = {"L5H11": 0.8, "L4H2": 0.3, "L3H1": 0.2, "L2H7": 0.1}
    estimate = {"L5H11": 1.4, "L4H2": 0.01, "L3H1": 0.02, "L2H7": 0.25}
    for i in range(60):
        exact[f"L0H{i}"] = 0.001 * (i % 3)
        estimate[f"L0H{i}"] = 0.05 if i == 7 else 0.0
    a = patching_agreement(_table(exact), _table(estimate))
    x, y = np.array(list(exact.values())), np.array(list(estimate.values()))
    assert a.pearson == pytest.approx(float(np.corrcoef(x, y)[0, 1]))
    assert a.pearson > 0.9  # what the chart's title said on main: "r = 0.9x"
    # |exact| >= 0.1 x 0.8: the four, largest first
    assert a.heads == ("L5H11", "L4H2", "L3H1", "L2H7")
    assert a.exact == (0.8, 0.3, 0.2, 0.1) and a.estimated == (1.4, 0.01, 0.02, 0.25)
    # attribution's top 4 by |estimate|: L5H11, L2H7, L0H7, L3H1: L4H2 is missed
    assert a.found == 3
    text = a.summary()
    assert text.startswith("Of the 4 heads with the largest exact effect, attribution ranks 3 ")
    assert "among its own top 4 with the same sign" in text and "Opposite" not in text
    assert "L5H11 0.80 exact, 1.40 estimated; L4H2 0.30 exact, 0.01 estimated" in text


def test_no_head_that_matters_is_said_so() -> None:
    zeros = _table({"L0H0": 0.0, "L0H1": 0.0, "L0H2": 0.0})
    a = patching_agreement(zeros, _table({"L0H0": 0.1, "L0H1": 0.0, "L0H2": 0.2}))
    assert a.heads == () and a.found == 0
    assert a.summary() == "No head has an exact effect: there is nothing to rank."


def test_the_scatters_title_counts_the_heads_that_matter() -> None:
    from mhsa.plots.patching import agreement_title

    one = patching_agreement(
        _table({"L5H11": 0.8, "L0H0": 0.01}), _table({"L5H11": 1.4, "L0H0": 0})
    )
    assert agreement_title(one) == "the head that matters, L5H11, ranks first by both"
    missed = patching_agreement(
        _table({"L5H11": 0.8, "L0H0": 0.0}), _table({"L5H11": 0.1, "L0H0": 0.5})
    )
    assert agreement_title(missed) == "the head that matters, L5H11, is not attribution's first"


def test_a_head_estimated_with_the_opposite_sign_is_not_ranked_alike() -> None:
    """The toy example's L0H3: +0.32 exact, -0.27 by attribution. Among attribution's largest
    by size, but saying the head hurts where it helps: not counted, and named."""
    from mhsa.plots.patching import agreement_title

    exact = {"L1H0": 0.9, "L0H3": 0.32, "L1H2": 0.2, "L0H1": 0.01}
    estimate = {"L1H0": 0.8, "L0H3": -0.27, "L1H2": 0.15, "L0H1": 0.0}
    a = patching_agreement(_table(exact), _table(estimate))
    assert a.heads == ("L1H0", "L0H3", "L1H2")
    assert a.found == 2 and a.opposite == ("L0H3",)
    assert agreement_title(a) == (
        "2 of the top 3 heads ranked alike, with the same sign; opposite signs: L0H3"
    )
    assert a.summary().endswith("Opposite signs: L0H3.")

"""Every figure's text alternative (WCAG 1.1.1): one sentence naming what the figure shows and
its main finding, with numbers from its data; the attention patterns' findings checked on
hand-made patterns whose answer is known, the others against the figure's own data read
independently (its plain JSON)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import mhsa
from mhsa import plots
from mhsa.causal.flow import FlowEdge, FlowGraph, FlowNode
from tests.test_plots_training import snapshots
from tests.tiny import hand_result

WORDS = ["a", "b", "c", "d", "a", "b", "c", "d"]


def _previous_token(n: int, weight: float = 0.8) -> np.ndarray:
    """Each query puts ``weight`` on the token before it (the first on itself), the rest
    spread evenly over the other keys."""
    a = np.full((n, n), (1 - weight) / (n - 1))
    for i in range(n):
        a[i, max(i - 1, 0)] = weight
    return a


def _induction(tokens: list[str]) -> np.ndarray:
    """Queries of the repeat (second half) put 0.9 on the token after the earlier copy of
    their own token, the rest 0.1 spread; the first half attends to the first token (0.7)."""
    n = len(tokens)
    a = np.zeros((n, n))
    for i, t in enumerate(tokens):
        earlier = [j for j in range(i) if tokens[j] == t]
        if earlier:
            a[i] = 0.1 / (n - 1)
            a[i, earlier[-1] + 1] = 0.9
        else:
            a[i] = 0.3 / (n - 1)
            a[i, 0] = 0.7
    return a


def test_a_previous_token_pattern_is_named_with_its_mean_weight() -> None:
    a = _previous_token(8)
    a[3] = np.roll(a[3], 3)  # query 3 now looks elsewhere: 7 of 8 rows follow the pattern
    sentence = plots.describe_attention(a, WORDS, what="Head L0H1's weights")
    # 7 rows: queries 1, 2, 4..7 on the token before (0.8), query 0 on itself (not 'before')
    rows_before = [i for i in range(8) if i != 3 and i > 0]
    assert len(rows_before) == 6
    assert "Head L0H1's weights on 8 tokens" in sentence
    assert "for 6 of 8 queries the strongest key is the token before it (0.80 on average)" in (
        sentence
    )


def test_an_induction_pattern_is_named_as_the_token_after_the_earlier_copy() -> None:
    tokens = ["[BOS]", "x", "y", "z", "x", "y", "z", "x"]
    a = _induction(tokens)
    sentence = plots.describe_attention(a, tokens, what="Head L1H3's attention")
    # four queries (the second x, y, z and the third x) have an earlier copy, four do not:
    # neither is most, and the sentence says which key is most often strongest
    assert sentence.endswith(
        "no single pattern; key 0 ('[BOS]') is the strongest for 4 of 8 queries (0.70 on "
        "average), and the queries' strongest weights average 0.80."
    )
    tokens = ["x", "y", "z", "x", "y", "z", "x", "y", "z"]
    a = _induction(tokens)
    sentence = plots.describe_attention(a, tokens, what="Head L1H3's attention")
    assert sentence == (
        "Head L1H3's attention on 9 tokens: for 6 of 9 queries the strongest key is the token "
        "after an earlier copy of the query (0.90 on average)."
    )


def test_no_pattern_names_the_most_common_strongest_key() -> None:
    rng = np.random.default_rng(3)
    a = rng.random((5, 5))
    a[:, 2] = 0  # key 2 never strongest
    a[[0, 1], 3] = 5.0  # key 3 the strongest of rows 0 and 1 only
    a = a / a.sum(1, keepdims=True)
    best = a.argmax(1)
    counts = np.bincount(best, minlength=5)
    key = int(counts.argmax())
    sentence = plots.describe_attention(a, ["p", "q", "r", "s", "t"], what="W")
    if counts.max() * 2 > 5:
        pytest.skip("a key is most rows' strongest: a pattern, not this case")
    mean = a[best == key, key].mean()
    assert f"key {key} ({'pqrst'[key]!r}) is the strongest for {counts[key]} of 5" in sentence
    assert f"({mean:.2f} on average)" in sentence


def test_the_head_heatmap_alt_is_its_heads_finding() -> None:
    a = np.zeros((2, 2, 8, 8))
    a[1, 0] = _previous_token(8, 0.6)
    a[0, 0] = a[0, 1] = a[1, 1] = np.full((8, 8), 1 / 8)
    result = hand_result(a, WORDS)
    alt = plots.alt_text(plots.head_heatmap(result, 1, 0))
    assert alt.startswith("Head L1H0's weights on 8 tokens:")
    assert "7 of 8 queries the strongest key is the token before it (0.60 on average)" in alt


def test_the_grid_names_the_sharpest_and_the_most_spread_head() -> None:
    a = np.full((2, 3, 4, 4), 0.25)
    a[1, 2] = np.eye(4)  # L1H2: every row's strongest weight is 1
    a[0, 1] = [[0.7, 0.1, 0.1, 0.1]] * 4  # L0H1: 0.7
    result = hand_result(a, ["p", "q", "r", "s"])
    alt = plots.alt_text(plots.head_grid(result))
    assert "(2 layers of 3 heads) on 4 tokens" in alt
    assert "the sharpest is L1H2, whose queries put 1.00" in alt
    assert "the most spread out L0H0 (0.25)" in alt  # the first of the uniform heads


def test_token_focus_names_the_head_and_key_a_token_attends_most() -> None:
    a = np.full((2, 2, 4, 4), 0.25)
    a[1, 0, 2] = [0.05, 0.85, 0.05, 0.05]  # token 2 ('r') in L1H0: on 'q'
    result = hand_result(a, ["p", "q", "r", "s"])
    alt = plots.alt_text(plots.token_focus(result, 2))
    assert "'r' (token 2) attends in each of 4 heads: most in L1H0, on 'q' (0.85)" in alt
    mean_q = (0.85 + 0.25 * 3) / 4
    assert f"its strongest key is 'q' ({mean_q:.2f} on average)" in alt


def test_the_line_view_alt_describes_its_heads_or_its_token() -> None:
    a = np.zeros((1, 2, 8, 8))
    a[0, 0] = a[0, 1] = _previous_token(8, 0.9)
    result = hand_result(a, WORDS)
    assert "7 of 8 queries the strongest key is the token before it (0.90" in plots.alt_text(
        plots.line_view(result, 0)
    )
    one = plots.alt_text(plots.line_view(result, 0, token=5))
    assert "the lines of 'b' (token 5): its strongest is head 0's to 'a' (0.90)" in one


def _numbers(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", text)]


def _data_values(fig) -> np.ndarray:
    """Every number a figure's plain JSON holds in its traces (z, y, x), read without
    ``mhsa.plots``."""
    spec = fig.to_plotly_json()
    out: list[float] = []
    for trace in spec["data"]:
        for field in ("z", "y", "x"):
            values = trace.get(field)
            if values is None:
                continue
            flat = np.asarray(values, dtype=object).ravel()
            for v in flat:
                if isinstance(v, (int, float, np.number)) and v == v:
                    out.append(float(v))
    return np.asarray(out)


def _catalogue() -> dict[str, object]:
    """One figure of every figure function of ``mhsa.plots``, on small data."""
    from tests.test_plots_signed import SIGNED

    rng = np.random.default_rng(0)
    a = rng.random((2, 2, 6, 6))
    result = hand_result(a / a.sum(-1, keepdims=True), list("abcdef"))
    other = hand_result(np.roll(result.attention, 1, axis=-1), list("abcdef"))
    heads = [f"L{li}H{h}" for li in range(2) for h in range(2)]
    table = pd.DataFrame(
        {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "importance": [0.1, 0.7, 0.3, 0.2]},
        index=heads,
    )
    stats = pd.DataFrame({"entropy": [1.2, 0.3, 0.9, 1.5]}, index=heads)
    effects = pd.DataFrame({"effect": [0.5, -0.2, 0.1, 0.05]}, index=heads)
    estimate = pd.DataFrame({"effect": [0.4, -0.1, 0.2, 0.0]}, index=heads)
    similarity = pd.DataFrame(rng.random((4, 4)), index=heads, columns=heads)
    coords = pd.DataFrame(
        {"x": [0.0, 1.0, 3.0, 0.2], "y": [0.0, 0.5, 2.0, 0.1], "layer": [0, 0, 1, 1]},
        index=heads,
    )
    curve = pd.DataFrame(
        {
            "order": ["importance"] * 3 + ["random"] * 3,
            "fraction_pruned": [0, 0.5, 1] * 2,
            "metric": [1.0, 0.8, 0.1, 1.0, 0.5, 0.1],
            "heads_pruned": [0, 2, 4] * 2,
        }
    )
    edges = pd.DataFrame(
        {"source": ["input", "L0H1"], "target": ["L1H0", "logits"], "input": ["k", ""],
         "score": [-1.0, 0.5]}
    )  # fmt: skip
    points = pd.DataFrame(
        {
            "fraction": [*mhsa.circuits.MIB_PERCENTAGES, 0.25],
            "edges": [0, 0, 0, 1, 2, 5, 10, 20, 50, 100, 25],
            "mib": [True] * 10 + [False],
            "faithfulness": [0, 0, 0, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1, 0.85],
        }
    )
    x0, a1 = FlowNode("X", 0, 1), FlowNode("A", 0, 2)
    graph = FlowGraph(
        tokens=("p", "q", "r"), layers=1, outputs=(2,), threshold=0.05, renormalize=False,
        nodes=(x0, a1), edges=(FlowEdge(x0, a1, 0.62, "attention", (0.62,)),), promoted={},
    )  # fmt: skip
    snaps = snapshots()
    figures = {name: make() for name, make in SIGNED.items()}
    figures |= {
        "head_heatmap": plots.head_heatmap(result, 1, 0),
        "head_grid": plots.head_grid(result),
        "head_zoom": plots.head_zoom(result, 0, 1, 1, 5),
        "mean_heatmap": plots.mean_heatmap(result, layer=1),
        "token_focus": plots.token_focus(result, 3),
        "line_view": plots.line_view(result, 0),
        "layer_change_figure": plots.layer_change_figure(result, other),
        "rollout_figure": plots.rollout_figure(result.attention.mean(1), list("abcdef"), 1),
        "similarity_figure": plots.similarity_figure(similarity),
        "head_map_figure": plots.head_map_figure(coords),
        "stat_grid": plots.stat_grid(mhsa.head_stats(result), "entropy"),
        "importance_scatter": plots.importance_scatter(table, stats, "entropy"),
        "pruning_figure": plots.pruning_figure(curve, "loss"),
        "patching_scatter": plots.patching_scatter(effects, estimate, 0.9),
        "circuit_figure": plots.circuit_figure(edges, 2, 2),
        "faithfulness_figure": plots.faithfulness_figure(
            mhsa.circuits.FaithfulnessCurve(points, 0.7, 0.3, 2.0, -1.0, 100), 25
        ),
        "k_composition_figure": plots.k_composition_figure(
            "L0H3", "L1H3", [0, 25, 50], [0.0, 0.4, 0.9], phase_change_step=25
        ),
        "k_support_figure": plots.k_support_figure(
            [0, 50, 100], ["L0H3 → L1H0"] * 2 + ["L0H3 → L1H3"], [0.2, 1.0, 4.0]
        ),
        "flow_figure": plots.flow_figure(graph),
        "sink_map": plots.sink_map(
            np.array([[0.8, 0.1, 0.1], [0.2, 0.5, 0.3]]),
            ["L0H0", "L0H1"],
            ["<s>", "a", "b"],
            threshold=0.3,
        ),
        "composition_figure": plots.composition_figure(similarity, "K"),
        "atlas_histogram": plots.atlas_histogram(
            pd.Series([3, 9, 1], index=["-1", "0", "1"]),
            title="Offsets",
            x_title="k",
            y_title="pairs",
        ),
        "example_heatmap": plots.example_heatmap(
            a[0, 0, :3, :4], list("abc"), list("abcd"), title="L0H0 around text 3"
        ),
        "positional_figure": plots.positional_figure(a[1, 1], "L1H1"),
        "pattern_pair": plots.pattern_pair(
            a[1, 1],
            np.eye(6, k=-1) + np.eye(6, 1, 0) * (np.arange(6) == 0)[:, None],
            list("abcdef"),
            head_title="L1H1",
            program_title="offset(-1)",
        )[0],
        "explanation_map": plots.explanation_map(
            pd.DataFrame(
                {
                    "head": ["L0H0", "L0H1", "L1H0", "L1H1"],
                    "program": ["offset(-1)", "mix(first, self, 0.6)", "induction", "first"],
                    "kind": ["positional", "combination", "token", "positional"],
                    "mostly": ["positional", "positional", "token", "positional"],
                    "iou": [0.81, 0.47, 0.62, 0.35],
                }
            ),
            title="Heads by their program",
        ),
        "tag_histogram_figure": plots.tag_histogram_figure(
            pd.DataFrame({"query": [12, 3, 0], "key": [2, 9, 4]}, index=["NOUN", "DET", "ADP"]),
            title="Tags of the top pairs",
        ),
        "qk_terms_figure": plots.qk_terms_figure(
            pd.DataFrame({"pair": ["q1 · k1", "q2 · k2"], "key": ["a", "b"], "score": [1.5, -0.4]}),
            title="Why here",
        ),
        "training_curves": plots.training_curves(plots.snapshot_history(snaps), steps=100),
        "head_scores_figure": plots.head_scores_figure(plots.snapshot_scores(snaps)),
        "probe_mosaic": plots.probe_mosaic(
            snaps[0].probe_tokens, snaps[0].probe_attention, step=snaps[0].step
        ),
    }
    return figures


#: the names of ``mhsa.plots.__all__`` that are not figure functions (helpers, constants)
NOT_FIGURES = {
    "COLORSCALE", "COLORWAY", "GRID_THUMB", "HEAD_COLORS", "LAYER_COLORSCALE", "LINE_BINS",
    "LINE_BUDGET", "LINE_DENSE", "LINE_MIN_WEIGHT", "LINE_TOP_K", "MAX_TICKS",
    "PRESENTATION_FONT", "PROGRAM_KINDS", "SIGNED_COLORSCALE", "TEMPLATE", "WEIGHTED_BY_NORM",
    "WEIGHTS",
    "alt_text", "circuit_node_xy", "clickable_cells", "decorate", "describe_attention",
    "downsample", "enlarge_fonts", "figure_data", "fit_margins", "head_style", "label",
    "line_pairs", "mark_window", "set_alt", "snapshot_history", "snapshot_scores",
}  # fmt: skip
CATALOGUE = _catalogue()


def test_the_catalogue_holds_every_figure_function() -> None:
    assert set(plots.__all__) - NOT_FIGURES == set(CATALOGUE)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_figure_has_an_alt_naming_its_content_with_its_numbers(name: str) -> None:
    fig = CATALOGUE[name]
    alt = plots.alt_text(fig)
    title = re.sub(r"<[^>]+>", " ", str(fig.layout.title.text or ""))
    title = " ".join(title.split())
    assert alt.endswith(".") and len(alt) > len(title) + 15, alt  # more than the title
    assert alt not in {"A figure.", f"{title}."}, alt
    data = _data_values(fig)
    said = _numbers(alt)
    assert said, alt
    # a number of the data said (to the sentence's 2-3 significant digits), or a count of it
    close = [
        v
        for v in said
        if np.isclose(data, v, rtol=6e-3, atol=6e-3).any() or v in {len(fig.data), data.size}
    ]
    assert close, (alt, said)


def test_a_figure_of_no_stored_sentence_says_its_largest_cell() -> None:
    z = np.array([[0.1, 0.2, 0.05], [0.4, 0.93, 0.3]])
    fig = plots.matrix_heatmap(z, ["q1", "q2"], ["k1", "k2", "k3"], title="Scores <b>x</b>")
    # the title's user text literally, as the figure shows it; rows and columns by position
    assert plots.alt_text(fig) == (
        "Scores <b>x</b>: a map of 2 rows by 3 columns; the largest value, 0.93, is at row "
        "'q2' (#1), column 'k2' (#1) (the smallest 0.05)."
    )


def test_a_stored_sentence_keeps_the_figures_other_meta() -> None:
    fig = plots.head_heatmap(hand_result(np.full((1, 1, 3, 3), 1 / 3), ["p", "q", "r"]), 0, 0)
    assert fig.layout.meta["token_axes"] == "yx"  # decorate still finds the token axes
    assert fig.layout.meta["alt"] == plots.alt_text(fig)

"""Head analysis on hand-made attention with known answers, and on the real embedded model."""

from __future__ import annotations

import numpy as np
import pytest

import mhsa
from mhsa import AttentionResult
from mhsa.analysis.stats import HeadStatsAccumulator


def _result(
    attention: np.ndarray, *, special: list[bool] | None = None, punct: list[bool] | None = None
) -> AttentionResult:
    n = attention.shape[-1]
    return AttentionResult(
        text="x",
        tokens=[f"t{i}" for i in range(n)],
        attention=attention.astype(np.float32),
        offsets=[(0, 0)] * n,
        special=special or [False] * n,
        punctuation=punct or [False] * n,
        word_ids=list(range(n)),
        model="hand-made",
        engine="test",
        device="cpu",
    )


def _prev_head(n: int) -> np.ndarray:
    a = np.zeros((n, n))
    a[0, 0] = 1
    a[np.arange(1, n), np.arange(n - 1)] = 1
    return a


def _next_head(n: int) -> np.ndarray:
    a = np.zeros((n, n))
    a[np.arange(n - 1), np.arange(1, n)] = 1
    a[n - 1, n - 1] = 1
    return a


def test_previous_next_uniform_and_first_token_heads() -> None:
    n = 8
    first = np.zeros((n, n))
    first[:, 0] = 1
    heads = np.stack([_prev_head(n), _next_head(n), np.full((n, n), 1 / n), first])[None]
    stats = mhsa.head_stats(_result(heads, special=[True] + [False] * 6 + [True]))
    assert list(stats.index) == ["L0H0", "L0H1", "L0H2", "L0H3"]
    prev, nxt, uniform, cls = (stats.iloc[i] for i in range(4))
    assert prev["to_prev"] == pytest.approx(1.0) and prev["role"] == "previous token"
    assert prev["mean_distance"] == pytest.approx((n - 1) / n)
    assert nxt["to_next"] == pytest.approx(1.0) and nxt["role"] == "next token"
    assert uniform["entropy"] == pytest.approx(np.log(n), rel=1e-6)  # smoothing keeps 1/n
    assert uniform["role"] == "broad"
    assert uniform["confidence"] == pytest.approx(1 / n)
    assert uniform["to_sep"] == pytest.approx(1 / n)
    assert cls["to_first"] == pytest.approx(1.0) and cls["role"] == "first token"
    # a one-hot head has the smoothed entropy, close to but above 0
    assert 0 < prev["entropy"] < 0.01


def test_punctuation_and_self_and_mixed_roles() -> None:
    n = 6
    punct = [False, False, True, False, False, True]
    p = np.zeros((n, n))
    p[:, 2] = p[:, 5] = 0.5
    mixed = np.zeros((n, n))
    mixed[:, 0] = 0.45
    mixed[:, 3] = 0.55
    heads = np.stack([p, np.eye(n), mixed])[None]
    stats = mhsa.head_stats(_result(heads, punct=punct))
    assert stats.loc["L0H0", "to_punct"] == pytest.approx(1.0)
    assert stats.loc["L0H0", "role"] == "punctuation"
    assert stats.loc["L0H1", "role"] == "self"
    assert stats.loc["L0H2", "role"] == "mixed"


def test_corpus_statistics_are_the_mean_over_sentences() -> None:
    a = _result(np.stack([_prev_head(5), np.eye(5)])[None])
    b = _result(np.stack([np.full((7, 7), 1 / 7), np.eye(7)])[None])
    both = mhsa.head_stats([a, b])
    one, two = mhsa.head_stats(a), mhsa.head_stats(b)
    cols = ["entropy", "to_prev", "to_self", "mean_distance"]
    np.testing.assert_allclose(both[cols], (one[cols] + two[cols]) / 2)
    acc = HeadStatsAccumulator()  # a twice, b once: weights 2/3 and 1/3
    for r in (a, b, a):
        acc.add(r)
    np.testing.assert_allclose(acc.frame()[cols], (2 * one[cols] + two[cols]) / 3)


def test_identical_heads_have_js_zero_cosine_one_and_share_a_cluster() -> None:
    rng = np.random.default_rng(0)
    n = 6
    raw = rng.random((3, n, n)) ** 4
    heads = raw / raw.sum(-1, keepdims=True)
    heads[1] = heads[0]  # heads 0 and 1 identical
    r = _result(heads[None])
    js = mhsa.head_similarity(r, metric="js")
    cos = mhsa.head_similarity(r, metric="cosine")
    assert js.shape == (3, 3) and list(js.index) == ["L0H0", "L0H1", "L0H2"]
    assert js.loc["L0H0", "L0H1"] == pytest.approx(0.0, abs=1e-6)
    assert js.loc["L0H0", "L0H2"] > 0.05
    assert np.allclose(js.to_numpy(), js.to_numpy().T)
    assert cos.loc["L0H0", "L0H1"] == pytest.approx(1.0)
    assert cos.loc["L0H0", "L0H2"] < 1.0
    clusters = mhsa.analysis.head_clusters(js, 2)
    assert clusters.labels["L0H0"] == clusters.labels["L0H1"] != clusters.labels["L0H2"]
    assert sorted(clusters.order) == ["L0H0", "L0H1", "L0H2"]
    assert abs(clusters.order.index("L0H0") - clusters.order.index("L0H1")) == 1


def test_js_matches_scipy_jensenshannon_definition() -> None:
    from scipy.spatial.distance import jensenshannon

    rng = np.random.default_rng(1)
    raw = rng.random((2, 5, 5))
    heads = raw / raw.sum(-1, keepdims=True)
    js = mhsa.head_similarity(_result(heads[None])).iloc[0, 1]
    smooth = 0.999 * heads + 0.001 / 5
    want = sum(jensenshannon(smooth[0, i], smooth[1, i]) ** 2 for i in range(5))
    assert js == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("threads", [1, 3])
def test_js_of_every_pair_matches_scipy_over_many_blocks_and_threads(
    monkeypatch, threads: int
) -> None:
    """Blocks of 5 query rows (the last one of 2) shared by ``threads`` threads: every pair of
    five unrelated heads against scipy, computed one row at a time in float64."""
    from scipy.spatial.distance import jensenshannon

    from mhsa.analysis import blocks as analysis
    from mhsa.analysis import similarity

    monkeypatch.setattr(analysis, "BLOCK_ELEMS", 5 * 5 * 37)  # 5 heads x 5 rows x 37 keys
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(5, 37, 37)) * rng.uniform(0.5, 4, size=(5, 1, 1))
    heads = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    got = similarity.js_divergences(heads.astype(np.float32), smoothing=1e-3, threads=threads)
    smooth = 0.999 * heads.astype(np.float32).astype(np.float64) + 0.001 / 37
    for i in range(5):
        for j in range(5):
            want = (jensenshannon(smooth[i], smooth[j], axis=1) ** 2).sum()
            assert got[i, j] == pytest.approx(want, rel=1e-5, abs=1e-9), (i, j)


def test_head_map_separates_three_groups_and_is_deterministic() -> None:
    n = 6
    rng = np.random.default_rng(0)
    groups = [_prev_head(n), _next_head(n), np.full((n, n), 1 / n)]
    heads = []
    for g in groups:
        for _ in range(4):
            noisy = g + rng.random((n, n)) * 0.02
            heads.append(noisy / noisy.sum(-1, keepdims=True))
    r = _result(np.stack(heads).reshape(3, 4, n, n))
    sim = mhsa.head_similarity(r)
    xy = mhsa.analysis.head_map(sim, seed=0)
    assert list(xy.columns[:2]) == ["x", "y"] and len(xy) == 12
    pts = xy[["x", "y"]].to_numpy().reshape(3, 4, 2)
    centres = pts.mean(1)
    spread = max(np.linalg.norm(pts[g] - centres[g], axis=1).max() for g in range(3))
    gaps = min(np.linalg.norm(centres[i] - centres[j]) for i in range(3) for j in range(i + 1, 3))
    assert gaps > 5 * spread
    np.testing.assert_allclose(mhsa.analysis.head_map(sim, seed=0)[["x", "y"]], xy[["x", "y"]])
    labels = mhsa.analysis.head_clusters(sim, 3).labels.to_numpy().reshape(3, 4)
    assert all(len(set(row)) == 1 for row in labels) and len(set(labels[:, 0])) == 3


def test_rollout_multiplies_later_layers_on_the_left() -> None:
    """Two layers that do not commute: R_1 = A'_1 A'_0, not A'_0 A'_1 (A' = (A + I) / 2 for
    one head with rows summing to one)."""
    first = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # rows 0, 1 -> token 0
    second = np.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])  # all -> token 1
    roll = mhsa.analysis.attention_rollout(_result(np.stack([first, second])[:, None]))
    a0, a1 = (first + np.eye(3)) / 2, (second + np.eye(3)) / 2
    np.testing.assert_allclose(roll[0], a0, atol=1e-6)
    np.testing.assert_allclose(roll[1], a1 @ a0, atol=1e-6)
    assert np.abs(a1 @ a0 - a0 @ a1).max() > 0.1  # the reversed product would be caught
    np.testing.assert_allclose(roll[1].sum(-1), 1.0, atol=1e-6)


def test_rollout_of_identity_is_identity_and_rows_sum_to_one() -> None:
    n = 5
    eye = np.broadcast_to(np.eye(n), (3, 2, n, n)).copy()
    np.testing.assert_allclose(
        mhsa.analysis.attention_rollout(_result(eye)), np.broadcast_to(np.eye(n), (3, n, n))
    )
    uniform = np.full((2, 2, n, n), 1 / n)
    roll = mhsa.analysis.attention_rollout(_result(uniform))
    np.testing.assert_allclose(roll.sum(-1), 1.0, atol=1e-6)
    # one layer: (U + I) / 2
    np.testing.assert_allclose(roll[0], (np.full((n, n), 1 / n) + np.eye(n)) / 2, atol=1e-6)


@pytest.mark.slow
def test_real_model_statistics_are_finite_in_range_and_reproducible(minilm) -> None:
    results = [
        mhsa.attend(t, model=minilm)
        for t in ["The cat sat on the mat.", "A second, longer sentence about attention heads."]
    ]
    stats = mhsa.head_stats(results)
    assert len(stats) == 72
    numeric = stats.drop(columns=["role", "layer", "head", "positional"]).astype(float)
    assert np.isfinite(numeric.to_numpy()).all()
    shares = ["to_first", "to_sep", "to_punct", "to_self", "to_prev", "to_next", "confidence"]
    assert ((stats[shares] >= -1e-6) & (stats[shares] <= 1 + 1e-6)).all().all()
    assert (stats["entropy"] <= np.log(13) + 1e-6).all()
    assert set(stats["role"]) <= {
        "previous token",
        "next token",
        "self",
        "first token",
        "separator",
        "punctuation",
        "broad",
        "mixed",
    }
    # like BERT (Clark et al.), MiniLM has heads that look at the previous token
    assert (stats["role"] == "previous token").any()
    again = mhsa.head_stats([mhsa.attend(r.text, model=minilm) for r in results])
    np.testing.assert_allclose(
        again.drop(columns="role").to_numpy(dtype=float),
        stats.drop(columns="role").to_numpy(dtype=float),
    )
    sim = mhsa.head_similarity(results)
    assert sim.shape == (72, 72) and np.allclose(np.diag(sim), 0, atol=1e-6)
    words = mhsa.head_stats(results, word_level=True)
    assert len(words) == 72 and np.isfinite(words["entropy"]).all()
    roll = mhsa.analysis.attention_rollout(results[0])
    assert roll.shape == (6, 9, 9)
    np.testing.assert_allclose(roll.sum(-1), 1.0, atol=1e-5)


def test_mixed_models_are_refused() -> None:
    a = _result(np.full((1, 2, 3, 3), 1 / 3))
    b = _result(np.full((2, 2, 3, 3), 1 / 3))
    with pytest.raises(ValueError, match="different layers x heads"):
        mhsa.head_stats([a, b])
    with pytest.raises(ValueError, match="Unknown metric"):
        mhsa.head_similarity(a, metric="euclid")


@pytest.mark.parametrize("n", [256, 512])
def test_js_holds_at_long_inputs_for_near_identical_and_different_heads(n: int) -> None:
    """float32 cancellation made near-identical heads at 512 tokens about 10x too far apart."""
    from scipy.spatial.distance import jensenshannon

    rng = np.random.default_rng(n)
    logits = rng.normal(size=(n, n)) * 2
    base = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    heads = [base]
    for scale in (1e-4, 1e-2):  # near-identical, close
        h = base * np.clip(1 + scale * rng.normal(size=(n, n)), 0.1, None)
        heads.append(h / h.sum(-1, keepdims=True))
    other = rng.random((n, n))
    heads.append(other / other.sum(-1, keepdims=True))  # unrelated
    a = np.stack(heads)[None].astype(np.float32)  # (1, 4, n, n)
    js = mhsa.head_similarity(_result(a)).to_numpy()
    smooth = 0.999 * a[0].astype(np.float64) + 0.001 / n
    for j in (1, 2, 3):
        want = (jensenshannon(smooth[0], smooth[j], axis=1) ** 2).sum()
        assert js[0, j] == pytest.approx(want, rel=1e-3), (j, js[0, j], want)
    assert js[0, 1] < 1e-5 < js[0, 2] < js[0, 3]


def test_single_token_sentences_leave_undefined_statistics_out_in_any_order() -> None:
    """A one-token sentence has no previous or next token: its to_prev/to_next are left out
    of the mean, whatever the order of the sentences."""
    one = _result(np.ones((1, 1, 1, 1)))
    prev_head = np.eye(4, k=-1)
    prev_head[0, 0] = 1.0
    four = _result(prev_head[None, None])
    for order in ([one, four], [four, one]):
        stats = mhsa.head_stats(order)
        assert stats["to_prev"].iloc[0] == pytest.approx(1.0)  # from the 4-token sentence only
        assert stats["to_next"].iloc[0] == pytest.approx(0.0)
        assert stats["to_self"].iloc[0] == pytest.approx((1.0 + 0.25) / 2)  # both sentences
    assert np.isnan(mhsa.head_stats(one)["to_prev"].iloc[0])


def test_voita_confidence_and_positional_heads() -> None:
    """Voita et al. 2019: confidence is the mean over tokens of the largest weight; a head is
    positional when its largest weight sits at one relative offset for at least 90% of tokens."""
    n = 20
    prev = _prev_head(n)  # row 0 has no previous token: every row that has one attends to it
    two_back = np.zeros((n, n))
    two_back[np.arange(2, n), np.arange(n - 2)] = 0.7
    two_back[np.arange(2, n), np.arange(2, n)] = 0.3
    two_back[:2, 0] = 1.0
    # offset +1 for 16 of its 19 rows (84%): below the 0.9 threshold
    mostly_next = _next_head(n)
    mostly_next[[3, 7, 11]] = 0
    mostly_next[[3, 7, 11], [3, 7, 11]] = 1
    rng = np.random.default_rng(0)
    soft = rng.dirichlet(np.ones(n), size=n)
    heads = np.stack([prev, two_back, mostly_next, soft])[None]
    stats = mhsa.head_stats(_result(heads))
    p, two, mostly, s = (stats.iloc[i] for i in range(4))
    assert (p["positional_offset"], p["positional_share"], p["positional"]) == (-1, 1.0, True)
    assert (p["positional_hits"], p["positional_queries"]) == (n - 1, n - 1)
    assert (two["positional_offset"], two["positional"]) == (-2, True)
    assert (two["positional_hits"], two["positional_queries"]) == (n - 2, n - 2)
    assert two["confidence"] == pytest.approx((2 * 1.0 + (n - 2) * 0.7) / n)
    assert mostly["positional_offset"] == 1
    assert mostly["positional_share"] == pytest.approx(16 / 19)
    assert not mostly["positional"]
    assert s["confidence"] == pytest.approx(soft.max(-1).mean(), rel=1e-6)
    assert not s["positional"]


def test_no_offset_is_called_on_fewer_than_90_percent_of_the_tokens() -> None:
    """In a 9-token sentence offset -8 is one query's (the last, to the first token) and -1
    eight queries' (89%): neither may be called; every query's own position (offset 0) may.
    At 12 tokens -2 is ten queries' (83%): not called even where all ten take it."""
    n = 9
    last_to_first = np.full((n, n), 1 / n)
    last_to_first[n - 1] = 0
    last_to_first[n - 1, 0] = 1  # offset -8: one query, share 1
    heads = np.stack([_prev_head(n), last_to_first])[None]
    stats = mhsa.head_stats(_result(heads))
    assert not stats["positional"].any()
    assert set(stats["positional_offset"]) == {0}  # the only offset 90% of 9 tokens can take
    assert (stats["positional_queries"] == n).all()
    n = 12
    two_back = np.zeros((n, n))
    two_back[np.arange(2, n), np.arange(n - 2)] = 1
    two_back[:2, 0] = 1
    row = mhsa.head_stats(_result(two_back[None, None])).iloc[0]
    assert row["positional_offset"] != -2 and not row["positional"]


def test_default_model_calls_no_head_positional_on_a_9_token_sentence() -> None:
    """The sentence where 54 of 72 heads were called positional at -8, -7 or +8: no offset but
    0 can be taken by 90% of its tokens, so every head's offset is 0 and its share is the share
    of queries whose largest weight is on themselves, counted here by hand."""
    r = mhsa.attend("The cat sat on the mat.")
    n = len(r.tokens)
    stats = mhsa.head_stats(r)
    by_hand = (r.attention.argmax(-1) == np.arange(n)).sum(-1).reshape(-1)  # (L * H,)
    assert (stats["positional_offset"] == 0).all()
    assert list(stats["positional_hits"]) == list(by_hand)
    assert (stats["positional_queries"] == n).all()
    assert list(stats["positional"]) == list(by_hand >= 0.9 * n)


def test_a_role_rests_on_at_least_three_queries() -> None:
    """A previous-token head over 3 tokens has 2 queries with a previous token: too few to
    call; over 4 tokens, 3: called, with its support."""
    three = mhsa.head_stats(_result(_prev_head(3)[None, None])).iloc[0]
    assert (three["role"], three["role_queries"]) == ("too few tokens", 2)
    four = mhsa.head_stats(_result(_prev_head(4)[None, None])).iloc[0]
    assert (four["role"], four["role_queries"]) == ("previous token", 3)
    first = np.zeros((4, 4))
    first[:, 0] = 1
    cls = mhsa.head_stats(_result(first[None, None])).iloc[0]
    assert (cls["role"], cls["role_queries"]) == ("first token", 4)


def test_positional_hits_and_rows_are_pooled_over_sentences() -> None:
    """Over a corpus an offset's share is its hits over its rows, summed over the sentences
    where it counts: a previous-token head on 10 tokens (9 of 9) and a first-token head on 20
    (offset -1 only for query 1: 1 of 19) make 10 of 28."""
    first = np.zeros((20, 20))
    first[:, 0] = 1
    acc = HeadStatsAccumulator()
    acc.add(_result(_prev_head(10)[None, None]))
    acc.add(_result(first[None, None]))
    row = acc.frame().iloc[0]
    assert row["positional_offset"] == -1
    assert (row["positional_hits"], row["positional_queries"]) == (10, 28)
    assert row["positional_share"] == pytest.approx(10 / 28)


def test_stats_difference_is_second_minus_first_with_labels_side_by_side() -> None:
    from mhsa.analysis.stats import stats_difference

    n = 12
    first = np.zeros((n, n))
    first[:, 0] = 1
    a = mhsa.head_stats(_result(_prev_head(n)[None, None]))
    b = mhsa.head_stats(_result(first[None, None]))
    diff = stats_difference(a, b).iloc[0]
    assert diff["Δ to_prev"] == pytest.approx(b["to_prev"].iloc[0] - 1.0)
    assert diff["Δ to_first"] == pytest.approx(1.0 - a["to_first"].iloc[0])
    # each role with the rows its share is a mean over (11 with a previous token, of 12)
    assert (diff["role 1"], diff["role 2"]) == (
        "previous token: 11 of 12 queries",
        "first token: 12 of 12 queries",
    )
    # 12 tokens: only offsets -1, 0, +1 reach 90% of them; the first-token head's best is -1,
    # taken by query 1 alone of the 11 that have a previous token (10 needed)
    assert (diff["positional 1"], diff["positional 2"]) == (
        "positional -1: 11 of 11 queries",
        "not positional (-1: 1 of 11 queries, 10 needed)",
    )


@pytest.mark.parametrize("n", [7, 512])
@pytest.mark.slow
def test_statistics_equal_a_row_by_row_float64_reference(n: int) -> None:
    """The statistics work in the attention's float32 and sum in float64: at 512 tokens they
    still equal a plain float64 computation, row by row, with scipy's entropy (the attention is
    random and lopsided, so a transposed or mis-scaled formula cannot pass)."""
    from scipy.stats import entropy as scipy_entropy

    rng = np.random.default_rng(n)
    heads = rng.dirichlet(np.full(n, 0.3), size=(2, 3, n)).astype(np.float32)  # (L, H, n, n)
    special = [i in (0, n - 1) for i in range(n)]
    punct = [i % 5 == 2 for i in range(n)]
    stats = mhsa.head_stats(_result(heads, special=special, punct=punct))
    a = heads.astype(np.float64)
    smoothed = 0.9999 * a + 0.0001 / n
    i = np.arange(n)
    for layer in range(2):
        for head in range(3):
            row = stats.loc[f"L{layer}H{head}"]
            h = a[layer, head]
            want = {
                "entropy": scipy_entropy(smoothed[layer, head], axis=1).mean(),
                "mean_distance": (h * np.abs(i[:, None] - i[None, :])).sum(1).mean(),
                "confidence": h.max(1).mean(),
                "to_first": h[:, 0].mean(),
                "to_sep": h[:, n - 1].mean(),
                "to_punct": h[:, i % 5 == 2].sum(1).mean(),
                "to_self": np.diag(h).mean(),
                "to_prev": np.diag(h, -1).mean(),
                "to_next": np.diag(h, 1).mean(),
            }
            for column, value in want.items():
                assert row[column] == pytest.approx(value, rel=1e-6, abs=1e-7), (column, layer)

"""``mhsa.explain.scores`` on hand-made 4-token examples worked out by hand, and the AUC against
a Mann-Whitney count and scikit-learn's on independent inputs."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from mhsa.errors import InputError
from mhsa.explain import accuracy, auc, soft_iou

#: a causal head over 4 tokens (row 0 is never scored)
A = np.array(
    [
        [1.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [0.2, 0.6, 0.2, 0.0],
        [0.1, 0.2, 0.3, 0.4],
    ]
)
#: offset(-1) over 4 tokens
PREVIOUS = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]], float)
#: a program that gives query 2 no key
GAP = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0]], float)


def test_soft_iou_by_hand() -> None:
    # rows 1-3: sum min = 0.5 + 0.6 + 0.3 = 1.4; sum max = 1.5 + 1.4 + 1.7 = 4.6
    assert soft_iou(A, PREVIOUS) == pytest.approx(1.4 / 4.6)
    # a query with no key: its row adds A's (1.0) to the max and nothing to the min
    assert soft_iou(A, GAP) == pytest.approx((0.5 + 0.3) / (1.5 + 1.0 + 1.7))
    assert soft_iou(A, A) == pytest.approx(1.0)
    # the mean over texts, not over the pooled sums
    assert soft_iou([A, A], [PREVIOUS, A]) == pytest.approx((1.4 / 4.6 + 1) / 2)


def test_the_first_query_is_not_scored() -> None:
    other = A.copy()
    other[0] = [0.0, 0.0, 0.0, 1.0]  # not a causal row, but row 0 is never read
    assert soft_iou(other, PREVIOUS) == soft_iou(A, PREVIOUS)
    assert accuracy(other, PREVIOUS) == accuracy(A, PREVIOUS)


def test_accuracy_by_hand() -> None:
    # argmax keys of rows 1-3: 0 (a tie with 1: the first), 1, 3; offset(-1) weights 0, 1, 2
    assert accuracy(A, PREVIOUS) == pytest.approx(2 / 3)
    # GAP: row 1 -> key 0 hit; row 2 no key: a miss; row 3 -> key 3 not 2: a miss
    assert accuracy(A, GAP) == pytest.approx(1 / 3)
    # pooled over queries: 2 of 3 and 3 of 3
    assert accuracy([A, A], [PREVIOUS, (A > 0.25).astype(float)]) == pytest.approx(5 / 6)


def test_auc_by_hand() -> None:
    """Write norms = weights (unit norms). Rows 1-3 of an encoder's head; positives: the 5
    strongest pairs (ties by position), negatives: the 5 pairs under 0.09 (all of them)."""
    head = np.array(
        [
            [0.25, 0.25, 0.25, 0.25],
            [0.70, 0.10, 0.10, 0.10],
            [0.05, 0.80, 0.10, 0.05],
            [0.02, 0.02, 0.06, 0.90],
        ]
    )
    # positives (3,3) (2,1) (1,0) (1,1) (1,2): P = 0 1 1 0 0
    # negatives (2,0) (2,3) (3,0) (3,1) (3,2): P = 0 0 0 0 1
    # P(pos > neg) + ties / 2 = (8 + 1 + 12 / 2) / 25
    assert auc(head, PREVIOUS, np.ones(4), pairs=5) == pytest.approx(15 / 25)
    # a key of small value norm: (3,3)'s write norm 0.9 * 0.05 falls under a tenth of the
    # largest (now 0.8): it becomes a negative
    norms = np.array([1.0, 1.0, 1.0, 0.05])
    # positives, the 7 strongest: (2,1) (1,0) (1,1) (1,2) (2,2) (3,2) (2,0): P = 1 1 0 0 0 1 0
    # negatives, the rest under 0.08: (1,3) (2,3) (3,0) (3,1) (3,3): P = 0 0 0 0 0
    # (3 x 5 wins + 4 x 5 ties / 2) / 35
    assert auc(head, PREVIOUS, norms, pairs=7) == pytest.approx(25 / 35)


def _by_hand(heads, patterns, norms, causal, pairs, threshold=0.1):
    """TDB's AUC written out with loops: every visible pair of every query but the first."""
    rows = []
    for a, p, v in zip(heads, patterns, norms, strict=True):
        n = len(a)
        for q in range(1, n):
            for k in range(n):
                if causal and k > q:
                    continue
                rows.append((a[q, k] * v[k], len(rows), p[q, k]))
    largest = max(r[0] for r in rows)
    ranked = sorted(rows, key=lambda r: (-r[0], r[1]))
    top = ranked[:pairs]
    chosen = {r[1] for r in top}
    low = [r for r in rows if r[0] < threshold * largest and r[1] not in chosen]
    assert len(low) <= pairs  # every negative taken: no draw to repeat here
    wins = 0.0
    for pos in top:
        for neg in low:
            wins += 1.0 if pos[2] > neg[2] else 0.5 if pos[2] == neg[2] else 0.0
    labels = [1] * len(top) + [0] * len(low)
    scores = [r[2] for r in top] + [r[2] for r in low]
    return wins / (len(top) * len(low)), roc_auc_score(labels, scores)


@pytest.mark.parametrize("causal", [False, True])
def test_auc_equals_mann_whitney_and_sklearn_on_random_heads(causal: bool) -> None:
    rng = np.random.default_rng(7)
    heads, patterns, norms = [], [], []
    for n in (5, 7, 6):
        logits = rng.normal(size=(n, n)) * 0.8
        if causal:
            logits = np.where(np.tril(np.ones((n, n))) > 0, logits, -np.inf)
        a = np.exp(logits - logits.max(1, keepdims=True))
        heads.append(a / a.sum(1, keepdims=True))
        patterns.append(rng.random((n, n)) * (rng.random((n, n)) > 0.5))
        norms.append(rng.random(n) + 0.5)
    writes = np.concatenate(
        [
            (a[1:] * v[None, :])[np.tril(np.ones((len(a), len(a))), 0)[1:] > 0]
            if causal
            else (a[1:] * v[None, :]).ravel()
            for a, v in zip(heads, norms, strict=True)
        ]
    )
    low = int((writes < 0.1 * writes.max()).sum())
    pairs = max(low, 8)  # every negative taken (no random draw to repeat in the test)
    assert 0 < low <= pairs < len(writes) - low
    mann_whitney, sklearn = _by_hand(heads, patterns, norms, causal, pairs)
    assert mann_whitney == pytest.approx(sklearn)
    assert auc(heads, patterns, norms, causal=causal, pairs=pairs) == pytest.approx(sklearn)


def test_auc_draws_the_same_negatives_for_the_same_seed() -> None:
    rng = np.random.default_rng(3)
    a = rng.dirichlet(np.full(12, 0.2), size=12)
    p = (rng.random((12, 12)) > 0.7).astype(float)
    v = rng.random(12) + 0.1
    assert auc(a, p, v, pairs=5, seed=1) == auc(a, p, v, pairs=5, seed=1)


def test_no_negative_or_no_query_is_nan() -> None:
    flat = np.full((3, 3), 1 / 3)  # every pair as strong as the strongest: no negative
    assert np.isnan(auc(flat, flat, np.ones(3)))
    one = np.ones((1, 1))
    assert np.isnan(soft_iou(one, one)) and np.isnan(accuracy(one, one))


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(InputError, match="square"):
        soft_iou(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(InputError, match="against a pattern"):
        accuracy(np.ones((3, 3)), np.ones((4, 4)))
    with pytest.raises(InputError, match="one norm per key"):
        auc(A, PREVIOUS, np.ones(3))

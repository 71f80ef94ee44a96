"""``Atlas.similar`` ranks by the heads' true outputs: on a small atlas it equals a brute-force
cosine search over every token's z read with plain forward hooks on the transformers model
(``tests.test_atlas._hooked_z``: BERT's self-attention context layer, not the module the atlas
runs), per head, for a few heads and for every head at once."""

from __future__ import annotations

import numpy as np
import pytest

from mhsa.atlas import build_atlas
from mhsa.atlas import exact as atlas_exact
from tests.test_atlas import TEXTS, _hooked_z


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("exact") / "minilm"
    atlas = build_atlas(TEXTS, out, model="default", top_k=2, progress=False, shard_texts=5)
    return atlas, _hooked_z(TEXTS, "default")  # [N, 6 * 384]: heads in label order


def _brute(z: np.ndarray, columns: np.ndarray, token: int, k: int) -> tuple[np.ndarray, float]:
    """Cosine of every token to ``token`` over ``columns`` (itself -inf), and the k-th best."""
    v = z[:, columns] / np.linalg.norm(z[:, columns], axis=1, keepdims=True)
    sims = v @ v[token]
    sims[token] = -np.inf
    return sims, float(np.sort(sims)[::-1][k - 1])


QUERIES = [
    (3, 2, "L2H7"),
    (0, 1, "L0H0"),
    (7, 4, "L5H11"),
    (12, 0, "L3H2"),  # a [CLS]
    (5, 3, None),
    (10, 1, None),
    (2, 5, ["L1H3", "L4H8"]),
]


@pytest.mark.parametrize(("text_id", "position", "head"), QUERIES)
def test_similar_equals_brute_force_over_the_true_outputs(small, text_id, position, head):
    atlas, z = small
    labels = atlas.labels if head is None else [head] if isinstance(head, str) else head
    columns = np.concatenate([np.arange(32) + 32 * atlas.labels.index(h) for h in labels])
    token = int(atlas.offsets[text_id]) + position
    sims, kth = _brute(z, columns, token, 8)
    got = atlas.similar(text_id, position, head=head, k=8)
    found = atlas.offsets[got["text_id"].to_numpy()] + got["position"].to_numpy()
    assert len(found) == 8 and token not in set(found)
    # every token found is among the 8 nearest (a tie at the edge may be either)
    assert (sims[found] >= kth - 1e-5).all(), (sims[found], kth)
    np.testing.assert_allclose(got["similarity"], np.sort(sims)[::-1][:8], atol=1e-4)
    assert got["similarity"].is_monotonic_decreasing


def test_the_codes_alone_are_not_the_truth_but_the_rerank_is(small, monkeypatch) -> None:
    """Where the codes order differs from the true order, ``exact=False`` keeps the codes'
    order and the default the true one: the re-ranking is what makes it exact. With the texts
    a query may recompute cut to none but its own, it ranks only its own text's tokens."""
    atlas, z = small
    differ = 0
    for text_id in range(len(TEXTS)):
        token = int(atlas.offsets[text_id]) + 1
        columns = np.arange(32) + 32 * atlas.labels.index("L1H1")
        sims, kth = _brute(z, columns, token, 5)
        coded = atlas.similar(text_id, 1, head="L1H1", k=5, exact=False)
        found = atlas.offsets[coded["text_id"].to_numpy()] + coded["position"].to_numpy()
        differ += int((sims[found] < kth - 1e-5).any())
    assert differ > 0  # the codes alone miss some true neighbours on this atlas
    monkeypatch.setattr(atlas_exact, "MAX_TEXTS", 0)
    got = atlas.similar(4, 2, head="L1H1", k=5)
    assert set(got["text_id"]) == {4}


def test_over_every_head_through_the_projection_index_it_is_exact_too(tmp_path) -> None:
    """Above ``EXACT_UP_TO`` tokens the candidates over every head come from the projection
    index (lowered here so that 160 sentences pass it): the ten found are still the true ten
    nearest by the hooked outputs."""
    from mhsa.atlas import index as atlas_index
    from tests.test_atlas import ROOT

    lines = (ROOT / "data" / "sentences.txt").read_text().splitlines()
    texts = [t for t in lines if len(t.split()) >= 6][:160]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(atlas_index, "EXACT_UP_TO", 500)
        atlas = build_atlas(texts, tmp_path / "a", model="default", top_k=2, progress=False)
    assert atlas.manifest["index"]["kind"] == "projection"
    z = _hooked_z(texts, "default")
    every = np.arange(z.shape[1])
    for token in np.random.default_rng(3).choice(atlas.tokens, 5, replace=False):
        text_id = int(np.searchsorted(atlas.offsets, token, side="right") - 1)
        position = int(token - atlas.offsets[text_id])
        sims, kth = _brute(z, every, int(token), 10)
        got = atlas.similar(text_id, position, k=10)
        found = atlas.offsets[got["text_id"].to_numpy()] + got["position"].to_numpy()
        assert (sims[found] >= kth - 1e-5).all(), (token, sims[found], kth)

"""The head atlas (``mhsa.atlas``) against brute force: every (text, query, key) of a small
corpus enumerated from ``mhsa.attend(..., engine="transformers", norms=True)`` (the model's own
eager attention and its own V through hooks, not the module the atlas runs), and head outputs z
read with plain forward hooks on the transformers model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import mhsa
from mhsa.analysis.roles import detection_pattern, detection_scores
from mhsa.atlas import build_atlas, open_atlas
from mhsa.atlas.collect import pair_hash
from mhsa.atlas.corpora import clean_brown_line, task_corpus
from mhsa.heads import parse_layer_head_label

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    line
    for line in (ROOT / "data" / "sentences.txt").read_text().splitlines()
    if 4 <= len(line.split()) <= 14
][:14]


def _brute(texts: list[str], model: str | mhsa.engine.LoadedModel) -> list[dict]:
    """Per text: attention ``[L, H, n, n]``, norms, token strings and ids, causal flag."""
    lm = model if isinstance(model, mhsa.engine.LoadedModel) else mhsa.engine.get_model(model)
    out = []
    for text in texts:
        r = mhsa.attend(text, model=lm, engine="transformers", norms=True, max_tokens=512)
        ids = lm.tokenizer(text, return_tensors="pt")["input_ids"][0].tolist()[: len(r.tokens)]
        out.append(
            {"a": r.attention, "n": r.norms, "tokens": r.tokens, "ids": ids, "causal": r.causal}
        )
    return out


def _pairs(brute: list[dict], layer: int, head: int) -> list[tuple]:
    """Every (weight, norm, text, query, key) a query may attend to, queries with one choice
    left out."""
    rows = []
    for t, b in enumerate(brute):
        a, nrm = b["a"][layer, head], b["n"][layer, head]
        n = a.shape[0]
        for q in range(n):
            keys = range(q + 1) if b["causal"] else range(n)
            if len(keys) < 2:
                continue
            rows.extend((float(a[q, k]), float(nrm[q, k]), t, q, k) for k in keys)
    return rows


def _check_histograms(atlas, brute, label: str) -> None:
    """A head's weight histogram (its ranked pairs in bins of 0.05, 1 in the last), mass by
    offset (clipped to +-64, as shares) and mean distance equal the brute-force ones (a bin may
    differ by one pair whose weight sits on an edge within the engines' rounding)."""
    layer, head = mhsa.parse_head_label(label)
    weights = [p[0] for p in _pairs(brute, layer, head)]
    want_bins = np.histogram(weights, bins=np.linspace(0, 1, 21))[0]
    mass, distance, queries = np.zeros(129), 0.0, 0
    for b in brute:
        a = b["a"][layer, head]
        offset = np.arange(a.shape[0])[None, :] - np.arange(a.shape[0])[:, None]
        np.add.at(mass, np.clip(offset, -64, 64) + 64, a)
        distance += float((a * np.abs(offset)).sum())
        queries += a.shape[0]
    summary = atlas.summary(label)
    got_bins = summary["weight_histogram"].to_numpy()
    assert got_bins.sum() == want_bins.sum() and np.abs(got_bins - want_bins).max() <= 1
    assert np.abs(got_bins - want_bins).sum() <= 2
    np.testing.assert_allclose(summary["offset_histogram"], mass / mass.sum(), atol=1e-5)
    assert atlas.heads().loc[label, "distance"] == pytest.approx(distance / queries, rel=1e-4)


def _check_top(atlas, brute, label: str, by: str, k: int) -> None:
    layer, head = mhsa.parse_head_label(label)
    pairs = _pairs(brute, layer, head)
    col = 0 if by == "weight" else 1
    best = sorted(pairs, key=lambda p: (-p[col], p[2], p[3], p[4]))[:k]
    got = atlas.top(label, k=k, by=by)
    assert len(got) == k
    np.testing.assert_allclose(got[by], [p[col] for p in best], rtol=1e-4, atol=1e-6)
    for row in got.itertuples():  # each listed pair is real, with its weight and norm
        b = brute[row.text_id]
        assert b["tokens"][row.query] == row.query_token and b["tokens"][row.key] == row.key_token
        assert row.weight == pytest.approx(b["a"][layer, head, row.query, row.key], abs=1e-5)
        assert row.norm == pytest.approx(
            b["n"][layer, head, row.query, row.key], rel=1e-4, abs=1e-6
        )
    assert list(got[by]) == sorted(got[by], reverse=True)


@pytest.fixture(scope="module")
def minilm_atlas(tmp_path_factory, minilm):
    out = tmp_path_factory.mktemp("atlas") / "minilm"
    atlas = build_atlas(
        TEXTS, out, model="default", top_k=6, progress=False, sample_size=40, shard_texts=5
    )
    return atlas, _brute(TEXTS, minilm)


def test_minilm_top_pairs_by_weight_and_norm_equal_brute_force(minilm_atlas) -> None:
    atlas, brute = minilm_atlas
    assert atlas.tokens == sum(len(b["tokens"]) for b in brute)
    for label in ("L0H0", "L3H7", "L5H11"):
        _check_top(atlas, brute, label, "weight", 6)
        _check_top(atlas, brute, label, "norm", 6)


def test_minilm_sample_is_the_pairs_of_smallest_hash(minilm_atlas) -> None:
    atlas, brute = minilm_atlas
    pairs = _pairs(brute, 2, 5)
    text, q, k = (np.array([p[i] for p in pairs]) for i in (2, 3, 4))
    order = np.argsort(pair_hash(text, q, k), kind="stable")[:40]
    got = atlas.sample("L2H5", k=40)
    assert list(zip(got["text_id"], got["query"], got["key"], strict=True)) == [
        (text[i], q[i], k[i]) for i in order
    ]
    np.testing.assert_allclose(got["weight"], [pairs[i][0] for i in order], atol=1e-5)
    top = atlas.sample("L2H5", k=40, decile=9)
    assert len(top) >= 1 and top["weight"].min() >= np.quantile(got["weight"], 0.9) - 1e-6


def test_minilm_search_equals_the_argmax_of_every_row(minilm_atlas) -> None:
    atlas, brute = minilm_atlas
    layer, head = 4, 2
    want = []
    for t, b in enumerate(brute):
        a = b["a"][layer, head]
        for q, token in enumerate(b["tokens"]):
            if token == "the":
                want.append((float(a[q].max()), t, q, int(a[q].argmax())))
    want.sort(key=lambda w: (-w[0], w[1], w[2]))
    got = atlas.search("L4H2", query_token="the", k=None)
    assert len(got) == len(want) > 3
    assert list(zip(got["text_id"], got["query"], got["key"], strict=True)) == [w[1:] for w in want]
    np.testing.assert_allclose(got["weight"], [w[0] for w in want], atol=2e-3)  # stored float16
    # offset and key-token filters
    prev = atlas.search("L4H2", query_token="the", offset=-1, k=None)
    assert list(zip(prev["text_id"], prev["query"], strict=True)) == [
        (t, q) for _, t, q, key in want if key == q - 1
    ]
    cls = atlas.search("L4H2", key_token="[CLS]", k=5)
    assert (cls["key"] == 0).all() and (cls["key_token"] == "[CLS]").all()


def test_minilm_corpus_scores_equal_transformerlens_definitions(minilm_atlas) -> None:
    atlas, brute = minilm_atlas
    table = atlas.heads()
    for name in ("previous token", "duplicate token", "induction"):
        per_text = [
            detection_scores(b["a"], detection_pattern(name, b["ids"])).reshape(-1) for b in brute
        ]
        np.testing.assert_allclose(table[f"{name} score"], np.mean(per_text, axis=0), atol=1e-5)
    entropy = np.concatenate(
        [
            -(b["a"] * np.log(np.where(b["a"] > 0, b["a"], 1))).sum(-1).reshape(72, -1)
            for b in brute
        ],
        axis=1,
    )
    np.testing.assert_allclose(table["entropy"], entropy.mean(1), rtol=1e-4)
    first = np.concatenate([b["a"][..., 0].reshape(72, -1) for b in brute], axis=1)
    np.testing.assert_allclose(table["first"], first.mean(1), atol=1e-5)
    summary = atlas.summary("L1H1")
    assert summary["offset_histogram"].sum() == pytest.approx(1.0)
    assert int(summary["weight_histogram"].sum()) == len(_pairs(brute, 1, 1))
    for label in ("L1H1", "L4H2"):
        _check_histograms(atlas, brute, label)


def _hooked_z(texts: list[str], model) -> np.ndarray:
    """Every token's z (all heads) from a forward hook on BERT's self-attention (its context
    layer, before the output dense): ``[tokens, layers * D]``."""
    lm = mhsa.engine.get_model(model)
    rows = []
    for text in texts:
        got = []
        hooks = [
            layer.attention.self.register_forward_hook(
                lambda _m, _i, out, got=got: got.append(out[0][0].detach().float())
            )
            for layer in lm.model.encoder.layer
        ]
        try:
            with torch.no_grad():
                lm.model(**lm.tokenizer(text, return_tensors="pt"))
        finally:
            for h in hooks:
                h.remove()
        rows.append(torch.cat(got, dim=-1).numpy())
    return np.concatenate(rows)


def test_minilm_similar_searches_the_stored_outputs_of_the_hooked_z(minilm_atlas) -> None:
    """Format 6: each head's output from plain hooks is stored as its direction ``z / ||z||``
    and its norm, each within half its cell's width, each decoded as the midpoint of its
    cell's two edges (each shard's own, in the ordinary tokens' book or the special tokens'
    own; the direction's 32 cells a dimension, the norm's 16); the stored output is their
    product. ``similar(exact=False)`` ranks exactly as a search over those stored values
    decoded here by hand (``similar`` itself ranks by the true outputs:
    ``tests/test_atlas_exact.py``)."""
    atlas, _ = minilm_atlas
    z = _hooked_z(TEXTS, "default")  # [N, L * 384]: heads in label order
    assert z.shape == (atlas.tokens, 6 * 384)
    assert atlas.manifest["format"] == 6 and (atlas.folder / "z5.npy").is_file()
    heads_z = z.reshape(atlas.tokens, 72, 32).transpose(1, 0, 2)  # [72, N, 32]
    length = np.linalg.norm(heads_z, axis=2)  # [72, N]
    unit = heads_z / length[..., None]
    codes = np.asarray(atlas.z.codes).astype(np.int64)  # [72, N, 20]: 8 numbers in 5 bytes
    groups = codes.reshape(72, atlas.tokens, 4, 5)
    word = sum(groups[..., b] << (8 * b) for b in range(5))  # [72, N, 4] 40-bit integers
    cell = np.stack([(word >> (5 * i)) & 31 for i in range(8)], -1).reshape(72, -1, 32)
    packed = np.load(atlas.folder / "znorm4.npy").astype(np.int64)  # [36, N]: two heads a byte
    assert packed.shape == (36, atlas.tokens)
    norm_cell = np.stack([packed[h // 2] >> (4 * (h % 2)) & 15 for h in range(72)])  # [72, N]
    # each token's shard (its text's, by the plan's texts a shard) coded it in its own cells
    text_of = np.searchsorted(atlas.offsets, np.arange(atlas.tokens), side="right") - 1
    shard = text_of // atlas.manifest["plan"]["shard_texts"]
    assert len(set(shard)) > 1  # the cells of several shards are used
    with np.load(atlas.folder / "z_ranges.npz") as f:
        edges = f["edges"]  # [S, 2, 72, 32, 33]: the ordinary tokens' book, the special's
        norm_edges = f["norm_edges"]  # [S, 2, 72, 17]
    book = np.asarray(atlas.special).astype(np.int64)
    assert 0 < book.sum() < len(book)
    h, d = np.arange(72)[:, None, None], np.arange(32)[None, None]
    where = (shard[None, :, None], book[None, :, None], h, d)
    below, above = edges[(*where, cell)], edges[(*where, cell + 1)]  # [72, N, 32]
    direction, half = (below + above) / 2, (above - below) / 2
    assert (np.abs(direction - unit) <= half + 2e-3 * np.abs(unit) + 1e-4).all()
    at = (shard[None], book[None], np.arange(72)[:, None])
    low, high = norm_edges[(*at, norm_cell)], norm_edges[(*at, norm_cell + 1)]  # [72, N]
    norm = (low + high) / 2
    assert (np.abs(norm - length) <= (high - low) / 2 + 2e-3 * length + 1e-4).all()
    assert min(len(np.unique(norm_cell[i])) for i in range(72)) >= 8  # 16 cells, not one
    stored = (direction * norm[..., None]).transpose(1, 0, 2).reshape(atlas.tokens, -1)
    # each shard's cells run from its least to its greatest number (where the cells lie
    # between: ``test_the_default_cells_follow_...``, by hand)
    for kind in (0, 1):  # each book from its own tokens' least to greatest number
        first = (shard == 0) & (book == kind)
        for head, dim in [(0, 0), (31, 7), (71, 31)]:
            values = unit[head, first, dim]
            np.testing.assert_allclose(
                edges[0, kind, head, dim, [0, 32]], [values.min(), values.max()], atol=2e-3
            )
            lengths = length[head, first]
            np.testing.assert_allclose(
                norm_edges[0, kind, head, [0, 16]], [lengths.min(), lengths.max()], rtol=2e-3
            )
    text_id, position = 3, 2
    token = int(atlas.offsets[text_id]) + position

    def nearest(values: np.ndarray, columns: np.ndarray, k: int = 8) -> list[int]:
        v = values[:, columns] / np.linalg.norm(values[:, columns], axis=1, keepdims=True)
        sims = v @ v[token]
        sims[token] = -np.inf
        return list(np.argsort(-sims, kind="stable")[:k])

    def found(frame) -> list[int]:
        return list(atlas.offsets[frame["text_id"].to_numpy()] + frame["position"].to_numpy())

    every = np.arange(z.shape[1])
    head = 2 * 12 + 7  # L2H7
    cols = np.arange(head * 32, head * 32 + 32)
    assert atlas.manifest["index"]["kind"] == "exact"
    assert found(atlas.similar(text_id, position, k=8, exact=False)) == nearest(stored, every)
    got = atlas.similar(text_id, position, head="L2H7", k=8, exact=False)
    assert found(got) == nearest(stored, cols)
    assert got["similarity"].is_monotonic_decreasing


def test_toy_induction_head_finds_the_repeat(tmp_path) -> None:
    """On the toy task's own sequences, the induction head's strongest key for a repeated token
    is the token after its first occurrence (offset: minus the period), and its corpus score is
    high; the top pairs equal brute force on a decoder."""
    texts = task_corpus("induction", count=6, seed=3)
    atlas = build_atlas(texts, tmp_path / "toy", model="toy:induction", top_k=5, progress=False)
    brute = _brute(texts, "toy:induction")
    scores = atlas.heads()["induction score"]
    best = scores.idxmax()
    assert best.startswith("L1") and scores[best] > 0.3
    _check_top(atlas, brute, best, "weight", 5)
    _check_top(atlas, brute, best, "norm", 5)
    _check_histograms(atlas, brute, best)  # a causal model: its first queries left out
    assert all(p[3] > 0 for p in _pairs(brute, 1, 0))  # the first query is never ranked


def _coded_by_hand(atlas, text_id: int, position: int, head: str | None, k: int) -> list:
    """The ``k`` tokens nearest by cosine over ``head``'s decoded values (None: every head's,
    concatenated), brute force in numpy: ``[(text_id, position, similarity)]``, ties by
    corpus order, the token itself left out."""
    heads = None if head is None else [atlas.head(head)]
    values = atlas.z.decode(slice(None), heads)  # [Hs, N, Dh]
    rows = values.transpose(1, 0, 2).reshape(values.shape[1], -1).astype(np.float64)
    token = int(atlas.offsets[text_id]) + position
    norms = np.linalg.norm(rows, axis=1)
    cos = rows @ rows[token] / np.maximum(norms * norms[token], 1e-30)
    cos[token] = -np.inf
    order = np.lexsort((np.arange(len(cos)), -cos))[:k]
    texts = np.searchsorted(atlas.offsets, order, side="right") - 1
    return [(int(t), int(i - atlas.offsets[t]), cos[i]) for t, i in zip(texts, order, strict=True)]


def _check_coded(atlas, text_id: int, position: int, head: str | None, k: int) -> None:
    """``similar(exact=False)`` ranks as ``_coded_by_hand`` (near-ties may swap)."""
    got = atlas.similar(text_id, position, head=head, k=k, exact=False)
    want = _coded_by_hand(atlas, text_id, position, head, k)
    np.testing.assert_allclose(got["similarity"], [w[2] for w in want], atol=1e-5)
    same = [
        (t, p) == (w[0], w[1]) or abs(s - w[2]) < 1e-5
        for t, p, s, w in zip(got["text_id"], got["position"], got["similarity"], want, strict=True)
    ]
    assert all(same)


def test_gpt2_top_and_truncation(tmp_path, tiny_gpt2_path) -> None:
    """Another decoder family; a text over its 64 positions is cut and counted; search by the
    codes ranks as brute force over the decoded values."""
    long = " ".join(["the cat sat on the mat"] * 20)
    texts = [*TEXTS[:5], long, ""]
    atlas = build_atlas(texts, tmp_path / "gpt2", model=tiny_gpt2_path, top_k=4, progress=False)
    assert atlas.manifest["truncated_texts"] == 1 and atlas.manifest["truncated_tokens"] > 50
    assert atlas.manifest["blank_texts"] == 1
    brute = _brute(texts[:6], tiny_gpt2_path)
    assert len(brute[5]["tokens"]) == 64
    _check_top(atlas, brute, "L1H2", "weight", 4)
    assert atlas.text_tokens(5) == brute[5]["tokens"]
    _check_coded(atlas, 2, 3, "L1H2", 5)
    _check_coded(atlas, 5, 10, None, 5)


def _seq2seq_brute(texts: list[str], model: str) -> dict[str, list[dict]]:
    """Per part ("encoder", "decoder") and text: the model's own eager attention from
    ``mhsa.attend(engine="transformers")`` and the value norms ``||v_j^h W_O^h||`` of its own
    ``v_proj`` outputs (forward hooks on BART's modules) and ``out_proj`` weights."""
    lm = mhsa.engine.get_model(model)
    stacks = {"encoder": lm.model.encoder.layers, "decoder": lm.model.decoder.layers}
    out: dict[str, list[dict]] = {"encoder": [], "decoder": []}
    for text in texts:
        got: dict[str, list[torch.Tensor]] = {"encoder": [], "decoder": []}
        hooks = [
            layer.self_attn.v_proj.register_forward_hook(
                lambda _m, _i, v, kept=got[part]: kept.append(v[0].detach().float())
            )
            for part, layers in stacks.items()
            for layer in layers
        ]
        try:
            r = mhsa.attend(text, model=lm, engine="transformers", max_tokens=512)
        finally:
            for h in hooks:
                h.remove()
        for part, attention, tokens in (
            ("encoder", r.attention, r.tokens),
            ("decoder", r.decoder_attention, r.decoder_tokens),
        ):
            norms = []
            for layer, v in zip(stacks[part], got[part], strict=True):
                heads, w_o = layer.self_attn.num_heads, layer.self_attn.out_proj.weight.float()
                dh = v.shape[-1] // heads
                per = [
                    (v[:, h * dh : (h + 1) * dh] @ w_o[:, h * dh : (h + 1) * dh].T).norm(dim=-1)
                    for h in range(heads)
                ]
                norms.append(torch.stack(per).detach().numpy())  # [H, n]: per key
            norm = np.stack(norms)[:, :, None, :] * attention  # [L, H, n, n]
            out[part].append(
                {"a": attention, "n": norm, "tokens": list(tokens), "causal": part == "decoder"}
            )
    return out


def test_an_encoder_decoder_atlas_covers_its_encoder_and_decoder(tmp_path, tiny_bart_path) -> None:
    """BART: the encoder's heads (E..) and the decoder's causal self-attention (D.., over the
    teacher-forced target) equal brute force on the model's own attention and hooked values;
    each part keeps its own tokens; a head list across parts is refused."""
    texts = TEXTS[:8]
    atlas = build_atlas(
        texts, tmp_path / "bart", model=tiny_bart_path, top_k=5, progress=False, shard_texts=3
    )
    assert isinstance(atlas, mhsa.atlas.AtlasParts)
    assert atlas.labels[:1] == ["E0H0"] and "D1H3" in atlas.labels and len(atlas.labels) == 16
    brute = _seq2seq_brute(texts, tiny_bart_path)
    for part, label in (("encoder", "E1H2"), ("decoder", "D0H1"), ("decoder", "D1H3")):
        kind_layer, head = parse_layer_head_label(label)
        layer = int(kind_layer[1:])
        pairs = _pairs(brute[part], layer, head)
        best = sorted(pairs, key=lambda p: (-p[1], p[2], p[3], p[4]))[:5]
        got = atlas.top(label, k=5, by="norm")
        np.testing.assert_allclose(got["norm"], [p[1] for p in best], rtol=1e-4, atol=1e-6)
        assert list(zip(got.text_id, got["query"], got["key"], strict=True)) == [
            (p[2], p[3], p[4]) for p in best
        ]
        by_weight = atlas.top(label, k=5, by="weight")
        best_w = sorted(pairs, key=lambda p: (-p[0], p[2], p[3], p[4]))[:5]
        np.testing.assert_allclose(by_weight["weight"], [p[0] for p in best_w], atol=1e-5)
        for row in got.itertuples():
            tokens = brute[part][row.text_id]["tokens"]
            assert (row.query_token, row.key_token) == (tokens[row.query], tokens[row.key])
        if part == "decoder":
            assert (got["key"] <= got["query"]).all()  # causal: no later key
        found = atlas.search(label, k=None)
        a = [b["a"][layer, head] for b in brute[part]]
        assert len(found) == sum(len(x) for x in a)
        for row in found.head(20).itertuples():
            assert row.key == int(np.argmax(a[row.text_id][row.query]))
    for t, (enc, dec) in enumerate(zip(brute["encoder"], brute["decoder"], strict=True)):
        assert atlas.text_tokens(t) == enc["tokens"]
        assert atlas.text_tokens(t, head="D0H0") == dec["tokens"]
    assert atlas.heads().index.tolist() == atlas.labels
    near = atlas.similar(1, 2, head="D1H0", k=4)
    assert len(near) == 4 and near["similarity"].is_monotonic_decreasing
    with pytest.raises(mhsa.InputError, match="one part"):
        atlas.similar(1, 2, head=["E0H0", "D0H0"])
    with pytest.raises(mhsa.InputError, match="no head 'L0H0'"):
        atlas.top("L0H0")
    reopened = open_atlas(tmp_path / "bart")
    assert reopened.labels == atlas.labels and reopened.model == tiny_bart_path
    again = build_atlas(  # built already: reused, not built again
        texts, tmp_path / "bart", model=tiny_bart_path, top_k=5, progress=False, shard_texts=3
    )
    assert again.manifest["built"] == atlas.manifest["built"]
    with pytest.raises(mhsa.InputError, match="part"):
        build_atlas(texts, tmp_path / "x", model="toy:induction", part="encoder", progress=False)


def _arrays(folder: Path) -> dict[str, np.ndarray]:
    out = {p.name: np.load(p) for p in folder.glob("*.npy")}
    with np.load(folder / "heads.npz") as f:
        out.update({f"heads/{k}": f[k] for k in f.files})
    return out


def _same(a: Path, b: Path, *, exact: bool = True) -> None:
    left, right = _arrays(a), _arrays(b)
    assert left.keys() == right.keys()
    for name in left:
        if exact:
            np.testing.assert_array_equal(left[name], right[name], err_msg=name)
        else:
            np.testing.assert_allclose(
                left[name].astype(float),
                right[name].astype(float),
                rtol=1e-3,
                atol=2e-3,
                err_msg=name,
            )


BUILD = """
import sys
from mhsa.atlas import build_atlas
texts = [l for l in open(sys.argv[1]).read().splitlines()]
build_atlas(texts, sys.argv[2], model="toy:induction", top_k=4, progress=False, shard_texts=2)
"""


def test_a_build_killed_halfway_resumes_to_the_same_atlas(tmp_path) -> None:
    texts = task_corpus("induction", count=40, seed=5)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n")
    whole = tmp_path / "whole"
    build_atlas(texts, whole, model="toy:induction", top_k=4, progress=False, shard_texts=2)
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", BUILD, str(corpus), str(out)], env=env)
    deadline = time.monotonic() + 120
    while len(list((out / ".shards").glob("shard-*"))) < 6:
        assert proc.poll() is None and time.monotonic() < deadline, "the build ended too soon"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with pytest.raises(mhsa.InputError, match=r"not an atlas.*resume"):
        open_atlas(out)
    written = len(list((out / ".shards").glob("shard-*")))
    assert 6 <= written < 20
    resumed = build_atlas(
        corpus, out, model="toy:induction", top_k=4, progress=False, shard_texts=2
    )
    assert resumed.tokens == open_atlas(whole).tokens
    _same(whole, out)
    assert not (out / ".shards").exists()


def test_a_merge_that_fails_keeps_every_shard_for_the_resumed_build(tmp_path, monkeypatch) -> None:
    """The last shard goes to the merge in memory; when the merge fails it is written too, so
    the resumed build builds no shard again and ends as a build that never stopped."""
    from mhsa.atlas import run as atlas_run

    texts = task_corpus("induction", count=6, seed=8)
    whole = tmp_path / "whole"
    build_atlas(texts, whole, model="toy:induction", top_k=4, progress=False, shard_texts=2)
    real = atlas_run.merge_shards

    def failing(*args, **kwargs):
        raise OSError("disk full")

    out = tmp_path / "failed"
    monkeypatch.setattr(atlas_run, "merge_shards", failing)
    with pytest.raises(OSError, match="disk full"):
        build_atlas(texts, out, model="toy:induction", top_k=4, progress=False, shard_texts=2)
    assert len(list((out / ".shards").glob("shard-*"))) == 3
    built = []
    monkeypatch.setattr(atlas_run, "merge_shards", real)
    monkeypatch.setattr(
        atlas_run, "build_shard", lambda *a, **k: built.append(a) or pytest.fail("rebuilt")
    )
    build_atlas(texts, out, model="toy:induction", top_k=4, progress=False, shard_texts=2)
    assert built == []
    _same(whole, out)


def test_bad_input_gets_one_clear_message_and_writes_nothing(tmp_path, minilm_atlas) -> None:
    atlas, _ = minilm_atlas
    with pytest.raises(mhsa.InputError, match="holds no text"):
        build_atlas(["", "  "], tmp_path / "a", progress=False)
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x00\x01\x02abc")
    with pytest.raises(mhsa.InputError, match="binary file"):
        build_atlas(binary, tmp_path / "b", progress=False)
    with pytest.raises(mhsa.InputError, match="layers"):
        build_atlas(TEXTS, tmp_path / "c", layers=[9], progress=False)
    assert not any((tmp_path / d).exists() for d in ("a", "b"))
    assert not list((tmp_path / "c").glob("*.npy")) if (tmp_path / "c").exists() else True
    (tmp_path / "plain").mkdir()
    with pytest.raises(mhsa.InputError, match="not an atlas"):
        open_atlas(tmp_path / "plain")
    with pytest.raises(mhsa.InputError, match="no head 'L9H0'"):
        atlas.top("L9H0")
    with pytest.raises(mhsa.InputError, match="No query token 'zebraqq'"):
        atlas.search("L0H0", query_token="zebraqq")
    with pytest.raises(mhsa.InputError, match="position must be"):
        atlas.similar(0, 999)
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "manifest.json").write_text(json.dumps({"kind": "mhsa-atlas", "format": 99}))
    with pytest.raises(mhsa.InputError, match="newer"):
        open_atlas(newer)


def test_brown_lines_are_cleaned_of_tags() -> None:
    tagged = (
        "The/at jury/nn said/vbd ``/`` it/pps did/dod n't/* find/vb it/ppo ''/'' ,/, "
        "and/cc Atlanta's/np$ mayor/nn (/( Ivan/np )/) agreed/vbd ./."
    )
    assert clean_brown_line(tagged) == (
        "The jury said \"it didn't find it\", and Atlanta's mayor (Ivan) agreed."
    )


@pytest.fixture(scope="module")
def indexed_atlas(tmp_path_factory):
    """A MiniLM atlas over 160 sentences with the approximate index (``EXACT_UP_TO`` lowered),
    re-ranking 5 candidates a result (``RERANK`` lowered: 55 of its 2,088 tokens, a smaller
    share than the 5,000 of a 1M-token atlas would be, so the projection has to find them)."""
    from mhsa.atlas import index as atlas_index

    lines = (ROOT / "data" / "sentences.txt").read_text().splitlines()
    texts = [t for t in lines if len(t.split()) >= 6][:160]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(atlas_index, "EXACT_UP_TO", 500)
        patch.setattr(atlas_index, "RERANK", 5)
        out = tmp_path_factory.mktemp("indexed") / "a"
        atlas = build_atlas(texts, out, model="default", top_k=2, progress=False)
        yield atlas


def _recall_at_10(atlas, tokens) -> list[float]:
    """recall@10 of ``similar`` over every head against exhaustive search over the stored
    values, per token."""
    from mhsa.atlas.index import exact_neighbours

    recalls = []
    for token in tokens:
        text_id = int(np.searchsorted(atlas.offsets, token, side="right") - 1)
        position = int(token - atlas.offsets[text_id])
        query = atlas.z.rows(np.array([token]))[0]
        exact, _ = exact_neighbours(atlas.z, None, query, 10, int(token))
        got = atlas.similar(text_id, position, k=10, exact=False)
        found = atlas.offsets[got["text_id"].to_numpy()] + got["position"].to_numpy()
        assert int(token) not in set(found) and len(found) == 10
        recalls.append(len(set(found) & set(exact)) / 10)
    return recalls


def test_similar_over_every_head_through_the_approximate_index_keeps_the_true_neighbours(
    indexed_atlas,
) -> None:
    """Above ``EXACT_UP_TO`` tokens, ``similar`` over every head finds at least 95% of the ten
    nearest tokens that an exhaustive search over the same stored values finds (recall@10 over
    40 tokens), from 5 candidates a result."""
    atlas = indexed_atlas
    assert atlas.manifest["index"]["kind"] == "projection" and atlas.tokens > 2000
    recalls = _recall_at_10(atlas, np.random.default_rng(7).choice(atlas.tokens, 40, replace=False))
    assert np.mean(recalls) >= 0.95, recalls


def test_an_atlas_of_format_1_is_still_read(indexed_atlas, tmp_path) -> None:
    """An atlas written before this format (one range for the head outputs, a faiss IVF-PQ
    index over the values themselves), made here from the new one by hand, opens and searches
    as it did."""
    import shutil

    import faiss

    from mhsa.atlas import open_atlas

    old = tmp_path / "old"
    shutil.copytree(indexed_atlas.folder, old)
    values = indexed_atlas.z.decode(slice(None))  # [Hs, N, Dh]
    lo, hi = values.min(1), values.max(1)
    step = (hi - lo) / 15
    q = np.clip(np.rint((values - lo[:, None]) / step[:, None]), 0, 15).astype(np.uint8)
    np.save(old / "z4.npy", q[..., 0::2] | (q[..., 1::2] << 4))
    np.savez(old / "z_ranges.npz", lo=lo, step=step)
    rows = values.transpose(1, 0, 2).reshape(values.shape[1], -1)
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    ivf = faiss.IndexIVFPQ(faiss.IndexFlatIP(2304), 2304, 16, 384, 4, faiss.METRIC_INNER_PRODUCT)
    ivf.train(rows)
    ivf.add(rows)
    faiss.write_index(ivf, str(old / "index.faiss"))
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["format"], manifest["index"] = 1, {"kind": "ivfpq", "lists": 16, "dims": 2304}
    (old / "manifest.json").write_text(json.dumps(manifest))
    atlas = open_atlas(old)
    token = 1234
    decoded = atlas.z.rows(np.array([token]))[0]
    assert np.allclose(decoded, rows[token] / np.linalg.norm(rows[token]), atol=0.05)
    assert np.mean(_recall_at_10(atlas, [token, 77, 2000])) >= 0.9
    assert (
        atlas.top("L1H2", k=3)["text_id"].tolist()
        == indexed_atlas.top("L1H2", k=3)["text_id"].tolist()
    )


def test_shards_are_sized_by_the_head_outputs_they_hold() -> None:
    """Without ``shard_texts``, a shard holds about ``SHARD_BYTES`` of float16 head outputs,
    its tokens guessed at 4 characters each: short sentences make large shards (less padding),
    long documents or a large model small ones (memory stays bounded), 16 to 4,096 texts."""
    from mhsa.atlas.build import SHARD_BYTES, shard_texts_for

    sentence, document = "word " * 24, "word " * 600  # 120 and 3,000 characters
    minilm = 6 * 12 * 32
    short = shard_texts_for([sentence] * 50, minilm)
    assert short * 120 / 4 * minilm * 2 == pytest.approx(SHARD_BYTES, rel=0.01)
    assert shard_texts_for([document] * 50, minilm) == pytest.approx(short / 25, rel=0.01)
    assert shard_texts_for([document] * 50, 16 * 2048) == 16  # a 1B model's long texts
    assert shard_texts_for(["a"] * 50, minilm) == 4096


def test_five_bit_codes_are_eight_numbers_in_five_bytes_within_half_a_step() -> None:
    """Numbers coded by hand (codes 0..31 on 32 steps from each dimension's minimum), packed
    as 40-bit little-endian integers, decode back exactly; every decoded value is within half
    a step (the range over 31) of the original; 12 dimensions take 10 bytes (padded to 16)."""
    import torch

    from mhsa.atlas.index import ZCodes

    rng = np.random.default_rng(5)
    z = rng.normal(size=(2, 40, 12)).astype(np.float32)
    codes, lo, step = ZCodes.quantise(torch.from_numpy(z.copy()), 5)
    assert codes.shape == (2, 40, 10)
    np.testing.assert_allclose(step, (z.max(1) - z.min(1)) / 31, rtol=1e-6)
    decoded = ZCodes(codes, lo, step, bits=5).decode(slice(None))
    assert (np.abs(decoded - z) <= step[:, None] / 2 + 1e-6).all()
    # the first token's first head by hand: eight 5-bit numbers in the low bits first
    by_hand = np.rint((z[0, 0] - lo[0]) / step[0]).astype(np.int64)
    padded = np.concatenate([by_hand, np.zeros(4, np.int64)])
    expected = []
    for group in padded.reshape(2, 8):
        word = sum(int(v) << (5 * i) for i, v in enumerate(group))
        expected += [(word >> (8 * b)) & 255 for b in range(5)]
    assert codes[0, 0].tolist() == expected
    # a 4-bit atlas's codes read as they were: 0x21 is 1 then 2
    four = ZCodes(np.array([[[0x21]]], np.uint8), np.zeros((1, 2)), np.ones((1, 2)), bits=4)
    np.testing.assert_allclose(four.decode(slice(None))[0], [[1, 2]])


def _five_bit_by_hand(codes: np.ndarray, dims: int) -> np.ndarray:
    """5-bit codes ``[Hs, n, bytes]`` (8 numbers in 5 bytes, little-endian, the first in the
    lowest bits) as integers ``[Hs, n, dims]``."""
    hs, n, size = codes.shape
    groups = codes.astype(np.int64).reshape(hs, n, size // 5, 5)
    word = sum(groups[..., b] << (8 * b) for b in range(5))
    return np.stack([(word >> (5 * i)) & 31 for i in range(8)], -1).reshape(hs, n, -1)[..., :dims]


@pytest.mark.parametrize("bits", [4, 5])
def test_the_compiled_scans_read_each_code_from_its_bits_and_its_own_spans_cells(bits) -> None:
    """``ZCodes.decode``, ``widths`` and ``cosines`` (``mhsa.atlas.kernels``) against the codes
    read by hand: each row of bytes as one little-endian Python integer, code i its bits
    ``i * bits`` on; a dimension count that is not a multiple of 8 (padding), two spans with
    cell tables of their own, a random subset of heads and tokens in an unsorted order."""
    from mhsa.atlas.exact import CURVATURE, MARGIN, cosine_bound
    from mhsa.atlas.index import FLOAT16_ERROR, ZCodes, code_bytes, exact_neighbours

    assert (MARGIN, CURVATURE) == (2.0, 0.25)  # the values the bounds below are given

    rng = np.random.default_rng(7)
    hs, n, dh, cells = 3, 41, 13, 2**bits
    codes = rng.integers(0, 256, (hs, n, code_bytes(dh, bits)), dtype=np.uint8)
    edges = np.sort(rng.normal(size=(2, hs, dh, cells + 1)), axis=-1).astype(np.float32)
    coded = ZCodes(codes, bounds=np.array([0, 17]), bits=bits, edges=edges)

    def by_hand(h: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        word = int.from_bytes(codes[h, t].tobytes(), "little")
        c = [(word >> (i * bits)) & (cells - 1) for i in range(dh)]
        e = edges[int(t >= 17), h, np.arange(dh)]
        lo, hi = e[np.arange(dh), c], e[np.arange(dh), np.array(c) + 1]
        ends = np.maximum(np.abs(lo), np.abs(hi))
        return (lo + hi) / 2, hi - lo + 2 * FLOAT16_ERROR * ends

    heads, tokens = [2, 0], np.array([40, 3, 17, 16, 29])
    values, widths = coded.decode_with_widths(tokens, heads)
    for j, h in enumerate(heads):
        for i, t in enumerate(tokens):
            mid, width = by_hand(h, int(t))
            np.testing.assert_allclose(values[j, i], mid, rtol=1e-6)
            np.testing.assert_allclose(widths[j, i], width, rtol=1e-6)
    every = np.stack([np.concatenate([by_hand(h, t)[0] for h in heads]) for t in range(n)])
    query = rng.normal(size=len(heads) * dh).astype(np.float32)
    query /= np.linalg.norm(query)
    truth = every @ query / np.linalg.norm(every, axis=1)
    np.testing.assert_allclose(coded.cosines(query, heads=heads), truth, atol=1e-5)
    np.testing.assert_allclose(coded.cosines(query, tokens, heads), truth[tokens], atol=1e-5)
    found, _ = exact_neighbours(coded, heads, query, 5, exclude=int(np.argmax(truth)))
    assert found.tolist() == np.argsort(-truth)[1:6].tolist()
    # each candidate's bound in one pass, against exact.cosine_bound over the decoded values
    flat = [v.transpose(1, 0, 2).reshape(len(tokens), -1) for v in (values, widths)]
    cos, bound = coded.cosine_bounds(query, tokens, heads, 2.0, 0.25)
    np.testing.assert_allclose(cos, truth[tokens], atol=1e-5)
    expected = cosine_bound(query, flat[1], flat[0], truth[tokens])
    assert expected.min() > 0
    np.testing.assert_allclose(bound, expected, rtol=1e-4)


def test_format_6_decodes_direction_times_norm_and_bounds_each_error_by_hand() -> None:
    """Format 6's codes (``ZCodes(norm_codes=..., norm_edges=...)``): each head's direction
    in 5-bit cells and its norm in 4-bit cells two heads a byte, read here by hand; a decoded
    output is the product of the two midpoints, its width ``|u| v + s w + v w / 2``;
    cosines over several heads weigh each head by its norm (full scan and listed tokens
    alike), over one head the norm cancels; each candidate's bound equals
    ``exact.cosine_bound`` given the norms' errors apart (and without them over one head)."""
    from mhsa.atlas.exact import cosine_bound
    from mhsa.atlas.index import FLOAT16_ERROR, ZCodes, code_bytes, pack_norms

    rng = np.random.default_rng(11)
    hs, n, dh = 3, 37, 10
    codes = rng.integers(0, 256, (hs, n, code_bytes(dh, 5)), dtype=np.uint8)
    edges = np.sort(rng.uniform(-1, 1, (2, hs, dh, 33)), axis=-1).astype(np.float32)
    norm_cells = rng.integers(0, 16, (hs, n), dtype=np.uint8)
    norm_edges = np.sort(rng.uniform(0.1, 5, (2, hs, 17)), axis=-1).astype(np.float32)
    bounds = np.array([0, 20])
    packed = pack_norms(norm_cells)  # 3 heads: two bytes rows, the last high nibble empty
    assert packed.shape == (2, n) and (packed[1] >> 4 == 0).all()
    coded = ZCodes(
        codes, bounds=bounds, bits=5, edges=edges, norm_codes=packed, norm_edges=norm_edges
    )

    def by_hand(h: int, t: int) -> tuple:
        word = int.from_bytes(codes[h, t].tobytes(), "little")
        c = np.array([(word >> (i * 5)) & 31 for i in range(dh)])
        e = edges[int(t >= 20), h, np.arange(dh)]
        lo, hi = e[np.arange(dh), c], e[np.arange(dh), c + 1]
        u, w = (lo + hi) / 2, hi - lo + 4 * FLOAT16_ERROR * np.maximum(np.abs(lo), np.abs(hi))
        ne = norm_edges[int(t >= 20), h]
        a, b = ne[norm_cells[h, t]], ne[norm_cells[h, t] + 1]
        return u, w, (a + b) / 2, b - a + 2 * FLOAT16_ERROR * b

    heads, tokens = [2, 0], np.array([36, 4, 20, 19, 8])
    values, widths = coded.decode_with_widths(tokens, heads)
    np.testing.assert_allclose(coded.decode(tokens, heads), values, rtol=1e-6)
    parts = {}
    for j, h in enumerate(heads):
        for i, t in enumerate(tokens):
            u, w, s, v = by_hand(h, int(t))
            parts[h, int(t)] = (u, w, s, v)
            np.testing.assert_allclose(values[j, i], u * s, rtol=1e-5)
            np.testing.assert_allclose(widths[j, i], np.abs(u) * v + s * w + v * w / 2, 1e-6)
    every = np.stack(
        [np.concatenate([by_hand(h, t)[0] * by_hand(h, t)[2] for h in heads]) for t in range(n)]
    )
    query = rng.normal(size=len(heads) * dh).astype(np.float32)
    query /= np.linalg.norm(query)
    truth = every @ query / np.linalg.norm(every, axis=1)
    np.testing.assert_allclose(coded.cosines(query, heads=heads), truth, atol=1e-5)
    np.testing.assert_allclose(coded.cosines(query, tokens, heads), truth[tokens], atol=1e-5)
    # the norms weigh the heads: without them the cosines differ
    plain = np.stack([np.concatenate([by_hand(h, t)[0] for h in heads]) for t in range(n)])
    assert np.abs(plain @ query / np.linalg.norm(plain, axis=1) - truth).max() > 0.05
    cos, bound = coded.cosine_bounds(query, tokens, heads, 2.0, 0.25)
    np.testing.assert_allclose(cos, truth[tokens], atol=1e-5)
    rows = [[parts[h, int(t)] for h in heads] for t in tokens]
    c = np.stack([np.concatenate([p[0] * p[2] for p in r]) for r in rows])
    w = np.stack([np.concatenate([(p[2] + p[3] / 2) * p[1] for p in r]) for r in rows])
    u = np.stack([np.stack([p[0] for p in r]) for r in rows])
    v = np.array([[p[3] for p in r] for r in rows])
    expected = cosine_bound(query, w, c, truth[tokens], norms=(u, v))
    np.testing.assert_allclose(bound, expected, rtol=1e-4)
    assert (expected > cosine_bound(query, w, c, truth[tokens])).all()  # the norms' share
    # one head: its direction alone
    one = query[:dh] / np.linalg.norm(query[:dh])
    dirs = np.stack([by_hand(2, t)[0] for t in range(n)])
    alone = dirs @ one / np.linalg.norm(dirs, axis=1)
    np.testing.assert_allclose(coded.cosines(one, heads=[2]), alone, atol=1e-5)
    cos, bound = coded.cosine_bounds(one, tokens, [2], 2.0, 0.25)
    np.testing.assert_allclose(cos, alone[tokens], atol=1e-5)
    w1 = np.stack([by_hand(2, int(t))[1] for t in tokens])
    np.testing.assert_allclose(bound, cosine_bound(one, w1, dirs[tokens], alone[tokens]), 1e-4)


def test_the_compiled_scans_called_from_many_threads_at_once_give_each_its_own_answer() -> None:
    """Streamlit serves each session on a thread: eight threads scanning at once (numba's
    thread pool behind one lock, whatever its layer) each get the cosines of their own query,
    as computed alone."""
    from concurrent.futures import ThreadPoolExecutor

    from mhsa.atlas.index import ZCodes, code_bytes

    rng = np.random.default_rng(3)
    codes = rng.integers(0, 256, (4, 5000, code_bytes(32, 5)), dtype=np.uint8)
    edges = np.sort(rng.normal(size=(1, 4, 32, 33)), axis=-1).astype(np.float32)
    coded = ZCodes(codes, bits=5, edges=edges)
    queries = rng.normal(size=(8, 128)).astype(np.float32)
    alone = [coded.cosines(q) for q in queries]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(coded.cosines, [q for q in queries for _ in range(4)]))
    for i, got in enumerate(together):
        np.testing.assert_array_equal(got, alone[i // 4])
    # and a process's first scan leaves the calling thread's torch threads as they were (the
    # service runs a page's work on one core fewer; a launch on OpenMP's pool resets them)
    import subprocess
    import sys

    script = (
        "import torch\nfrom mhsa.atlas import kernels\nkernels.warm()\n"
        "print(torch.get_num_threads())"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    env["OMP_NUM_THREADS"] = "1"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1"]


@pytest.mark.parametrize("causal", [False, True])
def test_the_compiled_layer_summaries_equal_each_definition_counted_pair_by_pair(causal) -> None:
    """``kernels.summarise_layer`` against loops over every (row, head, query, key) here: a
    padded batch (rows of 1, 5 and 9 tokens in 9 positions, the padding filled with large
    weights that must never count), repeated tokens for the duplicate and induction patterns,
    special and punctuation keys; the weight bins of the ranked pairs only, mass by offset
    folded at +-3, per text the detection scores divided by the text's length, the strongest
    key the first of the largest (a tie planted), and the top lists' candidates at or above
    each head's limit (one head's limit above every pair: none; a cap that one row and head
    overflows: counted, the first kept)."""
    from mhsa.atlas.kernels import summarise_layer

    rng = np.random.default_rng(5)
    b, hs, t = 3, 2, 9
    lengths = np.array([5, 9, 1])
    ids = rng.integers(0, 3, (b, t))
    flags = rng.random((b, t, 2)) < 0.3
    w = rng.random((b, hs, t, t)).astype(np.float32)
    w[0, 1, 2, [1, 3]] = 0.97  # a tie for the strongest key: the first wins
    w[0, 1, 2, 0] = 0.0  # a zero weight: no entropy
    pad = np.ones((b, t, t), bool)
    for r, n in enumerate(lengths):
        keys = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
        pad[r, :n, :n] = ~keys
    w[np.broadcast_to(pad[:, None], w.shape)] = 50.0  # never read
    vn = (rng.random((b, hs, t)) * 2).astype(np.float32)
    limits = np.array([[0.9, 2.0], [0.5, 1.0]], np.float32)  # [list, head]
    cap = 3
    got = summarise_layer(w, vn, lengths, ids, flags, causal, limits, cap, 20, 3)
    assert (w[np.broadcast_to(pad[:, None], w.shape)] == 50.0).all()  # the input as it was
    for r in range(b):
        n = lengths[r]
        for h in range(hs):
            hist, folded = np.zeros(20, int), np.zeros(7)
            dist = first = spec = punct = prev = own = ent = 0.0
            det = np.zeros(3)
            hits = [[], []]
            for q in range(n):
                keys = list(range(q + 1)) if causal else list(range(n))
                row = [float(w[r, h, q, k]) for k in keys]
                best = max(row)
                assert got["best_key"][r, h, q] == row.index(best)
                assert got["best_weight"][r, h, q] == np.float32(best)
                for k, x in zip(keys, row, strict=True):
                    if len(keys) > 1:
                        hist[min(int(np.float32(x) * np.float32(20)), 19)] += 1
                        norm = np.float32(x) * vn[r, h, k]
                        for j, value in enumerate((np.float32(x), norm)):
                            if value >= limits[j, h]:
                                hits[j].append(q * t + k)
                    folded[np.clip(k - q, -3, 3) + 3] += x
                    dist += x * abs(k - q)
                    first += x * (k == 0)
                    spec += x * flags[r, k, 0]
                    punct += x * flags[r, k, 1]
                    prev += x * (k == q - 1)
                    own += x * (k == q)
                    ent -= x * np.log(x) if x > 0 else 0.0
                    det[0] += x * (k == q - 1)
                    det[1] += x * (k < q and ids[r, k] == ids[r, q])
                    det[2] += x * (1 <= k <= q and ids[r, k - 1] == ids[r, q])
            np.testing.assert_array_equal(got["hist"][r, h], hist)
            np.testing.assert_allclose(got["folded"][r, h], folded, rtol=1e-6)
            assert got["distance"][r, h] == pytest.approx(dist, rel=1e-6)
            want = [first, spec, punct, prev, own]
            np.testing.assert_allclose(got["kinds"][r, h], want, rtol=1e-6, atol=1e-9)
            assert got["entropy"][r, h] == pytest.approx(ent, rel=1e-6)
            np.testing.assert_allclose(got["detection"][r, h], det / n, rtol=1e-6, atol=1e-9)
            for j in range(2):
                assert got["hits"][j, r, h] == len(hits[j])
                kept = min(len(hits[j]), cap)
                assert got["at"][j, r, h, :kept].tolist() == hits[j][:kept]
    assert got["hits"][0, :, 1].sum() == 0  # no weight reaches 2.0
    assert got["hits"][1].max() > cap  # a row and head over the cap
    assert got["best_key"][0, 1, 2] == 1
    # a row of NaN (no largest weight): its strongest key stays inside the row
    nan = w.copy()
    nan[1, 0, 4, :] = np.nan
    odd = summarise_layer(nan, vn, lengths, ids, flags, causal, limits, cap, 20, 3)
    assert 0 <= odd["best_key"][1, 0, 4] < (5 if causal else 9)
    with pytest.raises(ValueError, match="limits must be"):
        summarise_layer(w, vn, lengths, ids, flags, causal, limits[:, :1], cap, 20, 3)


def test_the_compiled_token_store_rounds_to_float16_as_torch_and_puts_each_token_in_place() -> None:
    """``kernels.store_tokens``: each valid position's head outputs land at its shard token
    (heads ``first`` on) rounded to float16 bit for bit as torch's ``.half()`` rounds (ties to
    even, subnormals, overflow to infinity, signed zero), its squares added to what the token
    held, its strongest key and weight put beside them; the gathered rows come back in the
    positions' order; other tokens and heads are left alone."""
    from mhsa.atlas.kernels import store_tokens

    rng = np.random.default_rng(9)
    b, hs, t, dh, heads, n = 3, 2, 4, 5, 4, 12
    ctx = rng.normal(size=(b, hs, t, dh)).astype(np.float32)
    edge = [1 + 2**-11, 1 + 3 * 2**-11, 65520.0, -70000.0, 2**-20, -(2**-25), 6e-8, -0.0]
    ctx[1, 0, 2, :5] = edge[:5]
    ctx[2, 1, 0, :3] = edge[5:]
    rows, cols = np.array([2, 0, 1, 1]), np.array([0, 3, 2, 0])
    tokens = np.array([7, 0, 11, 3])
    keys_in = rng.integers(0, t, (b, hs, t))
    weights_in = rng.random((b, hs, t)).astype(np.float32)
    z = np.full((heads, n, dh), 9, np.float16)
    squares = np.arange(n, dtype=np.float32)
    keys = np.zeros((heads, n), np.uint16)
    weights = np.zeros((heads, n), np.float16)
    flat = store_tokens(
        ctx, rows, cols, tokens, 1, (keys_in, weights_in), (z, squares, keys, weights)
    )
    for i, (r, c, token) in enumerate(zip(rows, cols, tokens, strict=True)):
        want = torch.from_numpy(ctx[r, :, c].copy()).half().numpy()
        assert z[1:3, token].view(np.uint16).tolist() == want.view(np.uint16).tolist()
        np.testing.assert_array_equal(flat[i], ctx[r, :, c].reshape(-1))
        assert squares[token] == pytest.approx(token + float((ctx[r, :, c] ** 2).sum()), rel=1e-6)
        assert keys[1:3, token].tolist() == keys_in[r, :, c].tolist()
        assert weights[1:3, token].tolist() == weights_in[r, :, c].astype(np.float16).tolist()
    assert np.isinf(z[1, 11, 3]) and z[1, 11, 4] == np.float16(2**-20)
    assert np.signbit(z[2, 7, 2]) and z[2, 7, 2] == 0  # -0.0 stays signed
    others = np.setdiff1d(np.arange(n), tokens)
    assert (z[[0, 3]] == 9).all() and (z[:, others] == 9).all()
    assert squares[others].tolist() == others.astype(np.float32).tolist()
    best, out = (keys_in, weights_in), (z, squares, keys, weights)
    with pytest.raises(ValueError, match="do not fit"):  # heads 3 and 4 of 4
        store_tokens(ctx, rows, cols, tokens, 3, best, out)
    with pytest.raises(ValueError, match="below the shard"):
        store_tokens(ctx, rows, cols, tokens + 5, 0, best, out)


def test_cells_of_equal_count_are_the_quantiles_and_each_number_lies_in_its_own() -> None:
    """``quantise_cells``: each head's and dimension's inner edge c is the first point of its
    grid (``GRID`` even steps from the minimum to the maximum, the ends) with at least c/32 of
    the numbers below it, counted here by hand; every number lies between its cell's edges
    (decoded: the midpoint, within half the width); the 32 cells of 321 numbers hold 9 to 12
    each; a skewed dimension (most numbers near 0, a few far out) gets narrow cells where its
    numbers crowd, far narrower than 32 even steps."""
    import torch

    from mhsa.atlas.index import FLOAT16_ERROR, GRID, ZCodes

    rng = np.random.default_rng(7)
    z = rng.normal(size=(2, 321, 12)).astype(np.float32)
    crowd = rng.random(321) < 0.95
    z[1, :, 3] = np.where(crowd, 0.1 * z[1, :, 3], 10 * z[1, :, 3])
    codes, edges = ZCodes.quantise_cells(torch.from_numpy(z.copy()), 5, power=1.0)
    assert codes.shape == (2, 321, 10) and edges.shape == (2, 12, 33)
    from mhsa.atlas.kernels import cells_of, pack

    with pytest.raises(ValueError, match="cannot hold 12 codes"):  # 60 bits in 7 bytes
        cells_of(z, GRID, 1.0, 5, 7)
    with pytest.raises(ValueError, match="cannot hold 12 codes"):
        pack(np.zeros((2, 3, 12), np.uint8), 4, 5)
    for h in range(2):
        for d in range(12):
            x = z[h, :, d]
            np.testing.assert_allclose(edges[h, d, [0, 32]], [x.min(), x.max()])
            grid = (x.max() - x.min()) / GRID
            for c in range(1, 32):
                assert (x < edges[h, d, c] + 1e-6).sum() >= c * 321 / 32
                assert (x < edges[h, d, c] - grid - 1e-6).sum() < c * 321 / 32
    coded = ZCodes(codes, bounds=np.zeros(1, np.int64), bits=5, edges=edges[None])
    decoded, widths = coded.decode(slice(None)), coded.widths(slice(None))
    assert (np.abs(decoded - z) <= widths / 2 + 1e-6).all()
    # the widths are the cells' own, widened by the float16 error of their ends
    cell = _five_bit_by_hand(codes, 12)  # [2, 321, 12]
    lo, hi = edges[0, 0, cell[0, 5, 0]], edges[0, 0, cell[0, 5, 0] + 1]
    assert lo <= z[0, 5, 0] <= hi
    assert widths[0, 5, 0] == pytest.approx(hi - lo + 2 * FLOAT16_ERROR * max(abs(lo), abs(hi)))
    held = np.stack([np.bincount(c, minlength=32) for c in cell[0].T])  # the normal head's
    assert held.min() >= 9 and held.max() <= 12
    even = (z[1, :, 3].max() - z[1, :, 3].min()) / 31
    assert np.median(widths[1, crowd, 3]) < even / 20


def test_the_default_cells_follow_the_cube_root_of_the_density() -> None:
    """The build's cells (``POINT_DENSITY`` 1/3, the least squared error): each inner edge c is
    the first grid point where the cube roots of the grid steps' counts below it (a histogram
    counted here by numpy) reach c/32 of their sum; against cells of equal count, a skewed
    dimension's tail cells are narrower and its mean squared error smaller, and every number
    still lies within half its cell's width."""
    import torch

    from mhsa.atlas.index import GRID, POINT_DENSITY, ZCodes

    assert pytest.approx(1 / 3) == POINT_DENSITY
    rng = np.random.default_rng(11)
    x = rng.standard_t(2, size=5000).astype(np.float32)  # heavy tails, a crowded middle
    z = torch.from_numpy(x[None, :, None].copy())
    lo, hi = float(x.min()), float(x.max())
    counts, _ = np.histogram(x, bins=GRID, range=(lo, hi))
    weight = np.cumsum(counts ** (1 / 3))
    step = (hi - lo) / GRID

    def coded(power: float) -> ZCodes:
        codes, edges = ZCodes.quantise_cells(z, 5, power)
        return ZCodes(codes, bounds=np.zeros(1, np.int64), bits=5, edges=edges[None])

    cube, equal = coded(POINT_DENSITY), coded(1.0)
    for c in range(1, 32):
        steps_below = round((cube.edges[0, 0, 0, c] - lo) / step)
        assert weight[steps_below - 1] >= c / 32 * weight[-1] - 1e-6
        assert steps_below == 1 or weight[steps_below - 2] < c / 32 * weight[-1]
    decoded, widths = cube.decode(slice(None))[0, :, 0], cube.widths(slice(None))[0, :, 0]
    assert (np.abs(decoded - x) <= widths / 2 + 1e-6).all()
    tails = [np.diff(c.edges[0, 0, 0])[[0, -1]] for c in (cube, equal)]
    assert (tails[0] < tails[1]).all()

    def error(codes: ZCodes) -> float:
        return float(((codes.decode(slice(None))[0, :, 0] - x) ** 2).mean())

    assert error(cube) < error(equal)


def _rewritten(indexed_atlas, tmp_path, fmt: int, codes: np.ndarray, edges: np.ndarray):
    """The indexed atlas copied and rewritten by hand as one of format ``fmt`` (4 or 5): the
    codes and the cells' edges given, one span, no norms; opened."""
    import shutil

    old = tmp_path / f"old{fmt}"
    shutil.copytree(indexed_atlas.folder, old)
    np.save(old / "z5.npy", codes)
    (old / "znorm4.npy").unlink()
    np.savez(old / "z_ranges.npz", edges=edges[None], bounds=np.zeros(1, np.int64))
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["format"] = fmt
    (old / "manifest.json").write_text(json.dumps(manifest))
    return open_atlas(old)


def test_an_atlas_of_format_5_is_still_read(indexed_atlas, tmp_path) -> None:
    """An atlas of format 5 (the outputs themselves in cells, a book for the special tokens
    apart, no norms), made here from the new one by hand, opens, decodes each number within
    half its cell, ranks by its codes as brute force over them, and by its true outputs as
    the new one does."""
    import torch

    from mhsa.atlas.index import ZCodes

    values = indexed_atlas.z.decode(slice(None))  # [Hs, N, Dh]
    groups = np.asarray(indexed_atlas.special).view(np.uint8)
    codes, edges = ZCodes.quantise_cells(torch.from_numpy(values.copy()), 5, groups=groups, books=2)
    atlas = _rewritten(indexed_atlas, tmp_path, 5, codes, edges)
    assert atlas.z.norm_codes is None and atlas.z.books == 2
    tokens = np.array([0, 5, 400, 2000])
    decoded, widths = atlas.z.decode(tokens), atlas.z.widths(tokens)
    assert (np.abs(decoded - values[:, tokens]) <= widths / 2 + 1e-6).all()
    new = indexed_atlas.similar(3, 2, head="L1H2", k=5)
    got = atlas.similar(3, 2, head="L1H2", k=5)
    assert got[["text_id", "position"]].equals(new[["text_id", "position"]])
    _check_coded(atlas, 3, 2, "L1H2", 5)
    _check_coded(atlas, 3, 2, None, 5)


def test_an_atlas_of_format_4_is_still_read(indexed_atlas, tmp_path) -> None:
    """An atlas of format 4 (one book of cells a shard for every token), made here from the
    new one by hand, opens, decodes each number within half its cell of that one book, and
    ranks by its true outputs as the new one does."""
    import torch

    from mhsa.atlas.index import ZCodes

    values = indexed_atlas.z.decode(slice(None))  # [Hs, N, Dh]
    codes, edges = ZCodes.quantise_cells(torch.from_numpy(values.copy()), 5)
    assert edges.shape == (values.shape[0], values.shape[2], 33)
    atlas = _rewritten(indexed_atlas, tmp_path, 4, codes, edges)
    assert atlas.z.books == 1 and atlas.z.edges.shape == (1, *edges.shape)
    special = int(np.flatnonzero(np.asarray(atlas.special))[3])  # one book for these too
    decoded, widths = atlas.z.decode(np.array([special])), atlas.z.widths(np.array([special]))
    assert (np.abs(decoded[:, 0] - values[:, special]) <= widths[:, 0] / 2 + 1e-6).all()
    new = indexed_atlas.similar(3, 2, head="L1H2", k=5)
    got = atlas.similar(3, 2, head="L1H2", k=5)
    assert got[["text_id", "position"]].equals(new[["text_id", "position"]])
    _check_coded(atlas, 3, 2, "L1H2", 5)  # its own codes, through its one book
    _check_coded(atlas, 3, 2, None, 5)


def test_each_group_of_tokens_gets_a_book_of_cells_placed_by_its_own_numbers() -> None:
    """``quantise_cells(groups=...)`` (format 5's special tokens apart): a crowd of tokens
    whose numbers all lie within 0.01 of each other (every text's ``[CLS]``) gets cells
    spanning its own least to greatest number, each inner edge where its own counts say (by
    hand, equal counts), so its cells are narrower than a hundredth of one book's for all;
    each token decodes in its group's book, in any order of tokens and spans."""
    import torch

    from mhsa.atlas.index import GRID, ZCodes

    rng = np.random.default_rng(4)
    n, dh = 400, 9
    crowd = np.zeros(n, np.uint8)
    crowd[::10] = 1
    z = rng.normal(size=(2, n, dh)).astype(np.float32)
    z[:, crowd == 1] = 3.0 + 0.01 * rng.random((2, int(crowd.sum()), dh))
    codes, edges = ZCodes.quantise_cells(torch.from_numpy(z), 5, 1.0, groups=crowd, books=2)
    assert edges.shape == (2, 2, dh, 33)
    for g in (0, 1):
        mine = z[:, crowd == g]
        for h in range(2):
            for d in range(dh):
                x = mine[h, :, d]
                np.testing.assert_allclose(edges[g, h, d, [0, 32]], [x.min(), x.max()])
                grid = (x.max() - x.min()) / GRID
                for c in (1, 16, 31):
                    assert (x < edges[g, h, d, c] + 1e-6).sum() >= c * len(x) / 32
                    assert (x < edges[g, h, d, c] - grid - 1e-6).sum() < c * len(x) / 32
    _, one = ZCodes.quantise_cells(torch.from_numpy(z), 5, 1.0)
    crowd_widths = np.diff(edges[1], axis=-1).max()
    assert crowd_widths < np.diff(one, axis=-1).mean() / 100
    # two spans of tokens, each with both books: decoded by the token's own
    bounds = np.array([0, 150])
    twice = torch.from_numpy(z * 2)
    second, second_edges = ZCodes.quantise_cells(twice, 5, 1.0, groups=crowd, books=2)
    mixed = np.concatenate([codes[:, :150], second[:, 150:]], axis=1)
    coded = ZCodes(
        mixed, bounds=bounds, bits=5, edges=np.stack([edges, second_edges]), groups=crowd
    )
    tokens = np.array([391, 1, 10, 151, 160, 77])  # 10 and 160 in the crowd
    truth = np.concatenate([z[:, :150], 2 * z[:, 150:]], axis=1)[:, tokens]
    decoded, widths = coded.decode(tokens), coded.widths(tokens)
    assert (np.abs(decoded - truth) <= widths / 2 + 1e-6).all()
    assert widths[:, [2, 4]].max() < widths[:, [0, 1, 3, 5]].min()
    with pytest.raises(ValueError, match="needs groups"):
        ZCodes(mixed, bounds=bounds, bits=5, edges=np.stack([edges, second_edges]))
    # a shard with no special token (a tokenizer that adds none, as GPT-2's): that book empty,
    # every edge 0, and the words' book alone decodes and scores every token
    none = np.zeros(n, np.uint8)
    plain, plain_edges = ZCodes.quantise_cells(torch.from_numpy(z), 5, 1.0, groups=none, books=2)
    assert not plain_edges[1].any() and np.array_equal(plain_edges[0], one)
    alone = ZCodes(plain, bits=5, edges=plain_edges[None], groups=none)
    decoded = alone.decode(slice(None))
    assert (np.abs(decoded - z) <= alone.widths(slice(None)) / 2 + 1e-6).all()
    query = rng.normal(size=2 * dh).astype(np.float32)
    query /= np.linalg.norm(query)
    rows = decoded.transpose(1, 0, 2).reshape(n, -1)
    want = rows @ query / np.linalg.norm(rows, axis=1)
    np.testing.assert_allclose(alone.cosines(query), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(alone.cosines(query, tokens=np.array([7, 3])), want[[7, 3]], 1e-5)


def test_an_atlas_of_format_3_is_still_read(indexed_atlas, tmp_path) -> None:
    """An atlas of format 3 (5-bit codes on 32 even steps per shard), made here from the new
    one by hand, opens, decodes each number as ``lo + code * step`` and ranks by its true
    outputs as exactly as the new one (the bound from its steps)."""
    import shutil

    import torch

    from mhsa.atlas import open_atlas
    from mhsa.atlas.index import ZCodes

    old = tmp_path / "old3"
    shutil.copytree(indexed_atlas.folder, old)
    values = indexed_atlas.z.decode(slice(None))  # [Hs, N, Dh]
    codes, lo, step = ZCodes.quantise(torch.from_numpy(values.copy()), 5)
    np.save(old / "z5.npy", codes)
    np.savez(old / "z_ranges.npz", lo=lo[None], step=step[None], bounds=np.zeros(1, np.int64))
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["format"] = 3
    (old / "manifest.json").write_text(json.dumps(manifest))
    atlas = open_atlas(old)
    assert atlas.z.edges is None and atlas.z.bits == 5
    token = 1234
    by_hand = lo + np.rint((values[:, token] - lo) / step) * step
    np.testing.assert_allclose(atlas.z.decode(np.array([token]))[:, 0], by_hand, atol=1e-5)
    new = indexed_atlas.similar(3, 2, head="L1H2", k=5)
    got = atlas.similar(3, 2, head="L1H2", k=5)
    assert got[["text_id", "position"]].equals(new[["text_id", "position"]])
    _check_coded(atlas, 3, 2, "L1H2", 5)  # its own codes, through its one book
    _check_coded(atlas, 3, 2, None, 5)


def test_an_atlas_of_format_2_is_still_read(indexed_atlas, tmp_path) -> None:
    """An atlas of format 2 (4-bit codes in ``z4.npy``, per shard), made here from the new one
    by hand, opens, decodes each number as ``lo + nibble * step`` and searches by its codes."""
    import shutil

    from mhsa.atlas import open_atlas

    old = tmp_path / "old2"
    shutil.copytree(indexed_atlas.folder, old)
    (old / "z5.npy").unlink()
    values = indexed_atlas.z.decode(slice(None))  # [Hs, N, Dh]
    lo, hi = values.min(1), values.max(1)
    step = (hi - lo) / 15
    q = np.clip(np.rint((values - lo[:, None]) / step[:, None]), 0, 15).astype(np.uint8)
    np.save(old / "z4.npy", q[..., 0::2] | (q[..., 1::2] << 4))
    np.savez(old / "z_ranges.npz", lo=lo[None], step=step[None], bounds=np.zeros(1, np.int64))
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["format"] = 2
    (old / "manifest.json").write_text(json.dumps(manifest))
    atlas = open_atlas(old)
    assert atlas.z.bits == 4
    token = 1234
    np.testing.assert_allclose(
        atlas.z.decode(np.array([token]))[:, 0], lo + q[:, token] * step, rtol=1e-5, atol=1e-6
    )
    got = atlas.similar(3, 2, head="L1H2", k=5, exact=False)
    assert len(got) == 5 and got["similarity"].is_monotonic_decreasing


def test_stored_outputs_decode_through_each_tokens_own_range_in_any_order() -> None:
    """Tokens of two spans asked in any order (first and last of one span, one of the other
    between) decode through their own span's range, as by hand."""
    from mhsa.atlas.index import ZCodes

    codes = np.array([[[0x21], [0x43], [0x65], [0x87]]], np.uint8)  # 1 head, 4 tokens, Dh 2
    lo = np.array([[[0.0, 0.0]], [[100.0, 100.0]]], np.float32)  # 2 spans
    step = np.array([[[1.0, 1.0]], [[10.0, 10.0]]], np.float32)
    z = ZCodes(codes, lo, step, np.array([0, 2]))
    got = z.decode(np.array([0, 3, 1]))[0]
    np.testing.assert_allclose(got, [[1, 2], [100 + 70, 100 + 80], [3, 4]])

"""Encoder, decoder and cross attention of encoder-decoder models (``AttentionResult.of_kind``)
and the views that draw them: tiny random BART, Marian and T5."""

from __future__ import annotations

import numpy as np
import pytest

import mhsa
from mhsa import plots
from mhsa.engine.result import ATTENTION_KINDS

SOURCE = "the cat sat on the mat"  # 8 tokens with [CLS] and [SEP]
TARGET = "le chat"  # 4: a transpose of the cross array cannot pass for it


@pytest.fixture(scope="module")
def bart(tiny_bart_path: str) -> mhsa.engine.LoadedModel:
    return mhsa.load_model(tiny_bart_path, device="cpu")


@pytest.fixture(scope="module")
def result(bart: mhsa.engine.LoadedModel) -> mhsa.AttentionResult:
    return mhsa.attend(SOURCE, text_pair=TARGET, model=bart)


def _own_attentions(path: str) -> tuple[object, list[str], list[str]]:
    """The checkpoint's own eager forward, with the tokenizer's ids for the encoder and its
    teacher-forced decoder input (the target's ids shifted right after the start token):
    (outputs, encoder tokens, decoder tokens)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSeq2SeqLM.from_pretrained(path, attn_implementation="eager").eval()
    src, tgt = tok(SOURCE, return_tensors="pt"), tok(TARGET, return_tensors="pt")
    forced = model.prepare_decoder_input_ids_from_labels(labels=tgt["input_ids"])
    with torch.no_grad():
        out = model(
            input_ids=src["input_ids"],
            attention_mask=src["attention_mask"],
            decoder_input_ids=forced,
            output_attentions=True,
        )
    return (
        out,
        tok.convert_ids_to_tokens(src["input_ids"][0]),
        tok.convert_ids_to_tokens(forced[0]),
    )


def test_each_kind_is_the_models_own_array_with_its_tokens(tiny_seq2seq_path: str) -> None:
    out, enc_tokens, dec_tokens = _own_attentions(tiny_seq2seq_path)
    r = mhsa.attend(SOURCE, text_pair=TARGET, model=tiny_seq2seq_path, device="cpu")
    m, n = len(dec_tokens), len(enc_tokens)
    assert (m, n) == (4, 8)
    cross = r.of_kind("cross")
    assert cross.attention.shape == (2, 4, m, n)
    assert cross.queries == dec_tokens and cross.tokens == enc_tokens
    own_cross = np.stack([a[0].numpy() for a in out.cross_attentions])
    np.testing.assert_allclose(cross.attention, own_cross, atol=1e-6)
    decoder = r.of_kind("decoder")
    assert decoder.tokens == dec_tokens and decoder.queries == dec_tokens
    own_decoder = np.stack([a[0].numpy() for a in out.decoder_attentions])
    np.testing.assert_allclose(decoder.attention, own_decoder, atol=1e-6)
    assert decoder.special == [True, True, False, False]  # start [PAD], [CLS] le chat
    encoder = r.of_kind("encoder")
    own_encoder = np.stack([a[0].numpy() for a in out.encoder_attentions])
    np.testing.assert_allclose(encoder.attention, own_encoder, atol=1e-6)
    assert encoder.tokens == enc_tokens


def test_kinds_refuse_what_a_result_lacks(result, minilm) -> None:
    with pytest.raises(mhsa.InputError, match="Unknown attention"):
        result.of_kind("sideways")
    encoder_only = mhsa.attend(SOURCE, model=minilm)
    assert encoder_only.of_kind("encoder") is encoder_only
    with pytest.raises(mhsa.InputError, match="encoder-decoder"):
        encoder_only.of_kind("cross")
    with pytest.raises(mhsa.InputError, match="cross attention only"):
        result.of_kind("cross").of_kind("decoder")
    assert set(ATTENTION_KINDS) == {"encoder", "decoder", "cross"}


def test_decoder_kind_is_causal_and_saved_results_keep_decoder_flags(result, tmp_path) -> None:
    decoder = result.of_kind("decoder")
    upper = np.triu(np.ones((4, 4), dtype=bool), 1)
    assert np.all(decoder.attention[..., upper] == 0)
    back = mhsa.AttentionResult.load(result.save(tmp_path / "r.npz"))
    assert back.of_kind("decoder").special == decoder.special
    np.testing.assert_array_equal(back.of_kind("cross").attention, result.cross_attention)


def test_cross_statistics_are_per_query_row_over_the_keys(result) -> None:
    cross = result.of_kind("cross")
    stats = mhsa.head_stats(cross)
    a = cross.attention.astype(np.float64)  # (L, H, m, n)
    n = a.shape[-1]
    p = 0.9999 * a + 0.0001 / n
    entropy = (-(p * np.log(p)).sum(-1)).mean(-1).reshape(-1)  # per row, mean over 4 rows
    np.testing.assert_allclose(stats["entropy"], entropy, rtol=1e-6)
    np.testing.assert_allclose(stats["to_first"], a[..., 0].mean(-1).reshape(-1), rtol=1e-6)
    last = a[..., n - 1].mean(-1).reshape(-1)  # the encoder's [SEP]
    np.testing.assert_allclose(stats["to_sep"], last, rtol=1e-6)
    # positions of two texts are no distance apart
    for column in ("mean_distance", "to_self", "to_prev", "to_next", "positional_share"):
        assert stats[column].isna().all(), column


def test_cross_similarity_flattens_each_head(result) -> None:
    cross = result.of_kind("cross")
    flat = cross.attention.reshape(8, -1).astype(np.float64)
    unit = flat / np.linalg.norm(flat, axis=1, keepdims=True)
    sim = mhsa.head_similarity(cross, metric="cosine")
    np.testing.assert_allclose(sim.to_numpy(), unit @ unit.T, atol=1e-9)
    js = mhsa.head_similarity(cross, metric="js").to_numpy()
    p, q = (0.999 * cross.attention[0, h].astype(np.float64) + 0.001 / 8 for h in (0, 1))
    mid = (p + q) / 2
    expected = 0.5 * ((p * np.log(p / mid)).sum() + (q * np.log(q / mid)).sum())
    assert js[0, 1] == pytest.approx(expected, rel=1e-4)


def test_cross_figures_put_decoder_queries_down_and_encoder_keys_across(result) -> None:
    cross = result.of_kind("cross")
    dec, enc = result.decoder_tokens, result.tokens
    fig = plots.head_heatmap(cross, 1, 2)
    heat = fig.data[0]
    assert np.asarray(heat.z).shape == (4, 8)
    np.testing.assert_array_equal(heat.z, cross.attention[1, 2])
    assert list(fig.layout.yaxis.ticktext) == dec and list(fig.layout.xaxis.ticktext) == enc
    assert "cross" in fig.layout.title.text
    mean = plots.mean_heatmap(cross, layer=0)
    assert np.asarray(mean.data[0].z).shape == (4, 8)
    focus = plots.token_focus(cross, 3)
    assert np.asarray(focus.data[0].z).shape == (8, 8)  # 8 heads x 8 keys
    assert "'chat'" in focus.layout.title.text  # decoder token 3: [PAD] [CLS] le chat
    grid = plots.head_grid(cross)
    assert np.isfinite(np.asarray(grid.data[0].z, dtype=float)).sum() == 2 * 4 * 4 * 8
    top = mhsa.analysis.top_attended(cross, 0, 0, 2)
    assert list(top.index) == [f"#{i} {t}" for i, t in enumerate(dec)]


def test_cross_line_view_decoder_left_encoder_right(result) -> None:
    cross = result.of_kind("cross")
    fig = plots.line_view(cross, 0, heads=[0], min_weight=0.0)
    left, right = fig.data[0], fig.data[1]
    assert list(left.text) == result.decoder_tokens and set(left.x) == {0.0}
    assert list(right.text) == result.tokens and set(right.x) == {1.0}
    lines = sum(t.meta["lines"] for t in fig.data[2:] if t.meta)
    assert lines == 4 * 8  # every decoder token to every encoder token
    ys = np.concatenate([np.asarray(t.y, dtype=float) for t in fig.data[3:]])
    starts, ends = ys[0::3], ys[1::3]
    assert starts.min() == -3 and ends.min() == -7  # 4 rows on the left, 8 on the right


def test_generated_target_keeps_the_decoders_own_ids(bart) -> None:
    g = mhsa.engine.generate_ids(SOURCE, model=bart, max_new_tokens=3)
    assert g.decoder_ids[0] == bart.config.decoder_start_token_id
    assert 2 <= len(g.decoder_ids) <= 4
    r = mhsa.engine.attend_generated(g, model=bart)
    assert r.decoder_tokens == bart.tokenizer.convert_ids_to_tokens(list(g.decoder_ids))
    assert r.tokens == bart.tokenizer.convert_ids_to_tokens(list(g.ids))
    assert r.cross_attention.shape == (2, 4, len(g.decoder_ids), 8)
    assert r.text_pair == g.target == mhsa.engine.generate(SOURCE, model=bart, max_new_tokens=3)


def test_cross_walkthrough_takes_queries_from_the_decoder_and_keys_from_the_encoder(
    minilm,
) -> None:
    from mhsa.analysis.classroom import cross_walkthrough

    w = cross_walkthrough(SOURCE, TARGET, model=minilm, d_model=16, num_heads=2)
    m, n = 4, 8
    assert w.tokens == ["[CLS]", "le", "chat", "[SEP]"] and len(w.keys) == n
    shapes = {s.name: s.shape for s in w.steps}
    assert shapes["memory"] == [1, n, 16] and shapes["X"] == [1, m, 16]
    assert shapes["K"] == shapes["V"] == [1, n, 16] and shapes["Q"] == [1, m, 16]
    assert shapes["raw scores"] == shapes["probabilities"] == [1, 2, m, n]
    assert shapes["output"] == [1, m, 16]
    assert w.rows(w.step("K")) == w.keys and w.rows(w.step("Q")) == w.tokens
    q, k = w.step("per-head Q").value[0], w.step("per-head K").value[0]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(8)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(w.step("probabilities").value[0], expected, rtol=1e-5, atol=1e-6)
    # "the" twice in the sentence: the same memory row, so the same key; not so for queries
    first, second = (i for i, t in enumerate(w.keys) if t == "the")
    np.testing.assert_array_equal(k[:, first], k[:, second])
    assert "K = M W_K" in w.step("K").formula


def test_cross_walkthrough_of_an_encoder_decoder_is_its_own_cross_attention(
    tiny_seq2seq_path: str,
) -> None:
    from mhsa.analysis.classroom import cross_walkthrough

    out, enc_tokens, dec_tokens = _own_attentions(tiny_seq2seq_path)
    lm = mhsa.load_model(tiny_seq2seq_path, device="cpu")
    for layer in (0, 1):
        w = cross_walkthrough(SOURCE, TARGET, model=lm, layer=layer)
        assert w.tokens == dec_tokens and w.keys == enc_tokens
        assert w.step("probabilities").shape == [1, 4, 4, 8]  # the model's 4 heads, m x n
        own = out.cross_attentions[layer][0].numpy()
        np.testing.assert_allclose(w.step("probabilities").value[0], own, atol=1e-5)
        np.testing.assert_allclose(
            w.step("memory").value[0], out.encoder_last_hidden_state[0].numpy(), atol=1e-5
        )
        assert f"decoder layer {layer}" in w.source
    with pytest.raises(mhsa.InputError, match="choose 0 to 1"):
        cross_walkthrough(SOURCE, TARGET, model=lm, layer=2)

"""mhsa.attend on the real embedded model and on tiny random models built offline."""

from __future__ import annotations

import numpy as np
import pytest

import mhsa
from mhsa import AttentionResult, InputError, ModelLoadError, UnsupportedModelError

SENTENCES = [
    "The cat sat on the mat.",
    "Unbelievably, the tokenizer splits rare words into pieces!",
    "Attention heads in BERT often attend to [SEP], commas and the previous token.",
]


@pytest.mark.parametrize("text", SENTENCES)
@pytest.mark.slow
def test_engines_agree_on_the_embedded_model(minilm, text: str) -> None:
    theirs = mhsa.attend(text, model=minilm, engine="transformers")
    ours = mhsa.attend(text, model=minilm, engine="mhsa", verify=True)
    assert theirs.tokens == ours.tokens
    assert theirs.attention.shape == (6, 12, len(theirs.tokens), len(theirs.tokens))
    assert theirs.attention.dtype == np.float32
    assert np.abs(theirs.attention - ours.attention).max() < 1e-4
    assert ours.max_abs_diff is not None and ours.max_abs_diff < 1e-4
    assert theirs.max_abs_diff is None
    np.testing.assert_allclose(theirs.attention.sum(-1), 1.0, atol=1e-5)
    assert not theirs.causal


def test_tokens_offsets_and_flags(minilm) -> None:
    r = mhsa.attend("The cat sat on the mat.", model=minilm)
    assert r.tokens == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]
    assert r.special == [True] + [False] * 7 + [True]
    assert r.punctuation == [False] * 7 + [True, False]
    assert r.offsets[2] == (4, 7) and r.text[4:7] == "cat"
    assert r.word_ids == [-1, 0, 1, 2, 3, 4, 5, 6, -1]
    assert r.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert r.num_parameters == sum(p.numel() for p in minilm.model.parameters())
    assert r.timings["load"] == minilm.load_seconds  # the model's own load, not this call's


@pytest.mark.slow
def test_random_engine_differs_and_is_reproducible(minilm) -> None:
    text = SENTENCES[0]
    trained = mhsa.attend(text, model=minilm, engine="mhsa")
    a = mhsa.attend(text, model=minilm, engine="mhsa-random", seed=1)
    b = mhsa.attend(text, model=minilm, engine="mhsa-random", seed=1)
    c = mhsa.attend(text, model=minilm, engine="mhsa-random", seed=2)
    np.testing.assert_array_equal(a.attention, b.attention)
    assert np.abs(a.attention - c.attention).max() > 1e-3
    assert np.abs(a.attention - trained.attention).max() > 1e-2
    np.testing.assert_allclose(a.attention.sum(-1), 1.0, atol=1e-5)
    assert a.seed == 1 and a.engine == "mhsa-random"


def test_decoder_is_causal_in_both_engines(tiny_gpt2_path) -> None:
    model = mhsa.load_model(tiny_gpt2_path, device="cpu")
    theirs = mhsa.attend("the cat sat on the mat", model=model)
    ours = mhsa.attend("the cat sat on the mat", model=model, engine="mhsa", verify=True)
    assert theirs.causal and ours.causal
    n = len(theirs.tokens)
    assert theirs.attention.shape == (2, 4, n, n)
    upper = np.triu(np.ones((n, n), dtype=bool), 1)
    assert (theirs.attention[..., upper] == 0).all()
    assert (ours.attention[..., upper] == 0).all()
    assert ours.max_abs_diff < 1e-4


def test_encoder_decoder_gives_self_and_cross_attention(tiny_t5_path) -> None:
    r = mhsa.attend("the cat sat", model=tiny_t5_path, text_pair="le chat", device="cpu")
    n, m = len(r.tokens), len(r.decoder_tokens)
    assert r.attention.shape == (2, 4, n, n)
    assert r.decoder_attention.shape == (2, 4, m, m)
    assert r.cross_attention.shape == (2, 4, m, n)
    np.testing.assert_allclose(r.cross_attention.sum(-1), 1.0, atol=1e-5)
    upper = np.triu(np.ones((m, m), dtype=bool), 1)
    assert (r.decoder_attention[..., upper] == 0).all()
    # our module runs encoder-decoders too (tests/test_seq2seq.py): the same three attentions
    ours = mhsa.attend(
        "the cat sat", model=tiny_t5_path, text_pair="le chat", device="cpu", engine="mhsa"
    )
    np.testing.assert_allclose(ours.cross_attention, r.cross_attention, atol=1e-4)


@pytest.mark.slow
def test_word_level_rows_sum_to_one_and_merge_pieces(minilm) -> None:
    r = mhsa.attend("Unbelievably, tokenization works.", model=minilm)
    assert len(r.tokens) > 7  # sub-word pieces
    w = r.to_words()
    assert w.tokens == ["[CLS]", "Unbelievably", ",", "tokenization", "works", ".", "[SEP]"]
    np.testing.assert_allclose(w.attention.sum(-1), 1.0, atol=1e-5)
    pieces = [i for i, wid in enumerate(r.word_ids) if wid == 0]
    # attention from [CLS] to the first word = sum over its pieces
    np.testing.assert_allclose(
        w.attention[..., 0, 1], r.attention[..., 0, pieces].sum(-1), atol=1e-6
    )
    # attention from the first word to [CLS] = mean over its pieces
    np.testing.assert_allclose(
        w.attention[..., 1, 0], r.attention[..., pieces, 0].mean(-1), atol=1e-6
    )
    assert w.to_words() is w


@pytest.mark.slow
def test_save_load_round_trip(minilm, tmp_path) -> None:
    r = mhsa.attend("The <b>cat</b> & 🐱 sat.", model=minilm, engine="mhsa", verify=True)
    path = r.save(tmp_path / "r.npz")
    back = AttentionResult.load(path)
    np.testing.assert_array_equal(back.attention, r.attention)
    assert back.tokens == r.tokens and back.offsets == r.offsets and back.text == r.text
    assert back.max_abs_diff == r.max_abs_diff and back.engine == "mhsa"
    assert back.layer_max_abs_diff == r.layer_max_abs_diff
    assert back.hidden_max_abs_diff == r.hidden_max_abs_diff is not None
    plain = r.save(tmp_path / "result")  # no extension added behind the caller's back
    assert (tmp_path / "result").is_file() and AttentionResult.load(plain).tokens == r.tokens
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not an MHSA Explorer result"):
        AttentionResult.load(tmp_path / "junk.npz")


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_text_is_refused(minilm, text: str) -> None:
    with pytest.raises(InputError, match="empty"):
        mhsa.attend(text, model=minilm)


@pytest.mark.slow
def test_too_long_text_is_refused_or_truncated(minilm) -> None:
    text = "word " * 700
    with pytest.raises(InputError, match=r"702 tokens long.*at most 512.*max_tokens"):
        mhsa.attend(text, model=minilm)
    r = mhsa.attend(text, model=minilm, max_tokens=64)
    assert len(r.tokens) == 64 and r.truncated_tokens == 702 - 64
    r = mhsa.attend(text, model=minilm, max_tokens=3)  # [CLS] word [SEP]
    assert r.tokens == ["[CLS]", "word", "[SEP]"] and r.truncated_tokens == 699
    for too_few in (1, 2):  # [CLS] and [SEP] alone: no room for the text
        with pytest.raises(InputError, match=r"max_tokens must be at least 3.*adds 2 special"):
            mhsa.attend(text, model=minilm, max_tokens=too_few)
    r = mhsa.attend(text, model=minilm, max_tokens=10_000)
    assert len(r.tokens) == 512 and r.truncated_tokens == 190


def test_unknown_engine_is_refused(minilm) -> None:
    with pytest.raises(InputError, match=r"Unknown engine 'fast'.*transformers, mhsa, mhsa-random"):
        mhsa.attend("hi", model=minilm, engine="fast")


def test_missing_model_and_non_model_folder(tmp_path) -> None:
    with pytest.raises(ModelLoadError, match="not found locally"):
        mhsa.load_model("no-such-org/no-such-model-xyz", device="cpu")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="holds no transformers model"):
        mhsa.load_model(str(tmp_path), device="cpu")


def test_model_too_large_is_refused_before_loading(minilm) -> None:
    millions = f"{minilm.num_parameters / 1e6:.0f}M"
    with pytest.raises(
        ModelLoadError, match=rf"{millions} parameters, over this server's limit of 1M"
    ):
        mhsa.load_model("default", device="cpu", max_parameters=1_000_000)


def test_architecture_without_attentions_is_refused(tmp_path) -> None:
    import torch
    from transformers import AutoTokenizer, MambaConfig, MambaModel

    torch.manual_seed(0)
    folder = tmp_path / "mamba"
    MambaModel(
        MambaConfig(
            vocab_size=30522,
            hidden_size=16,
            state_size=4,
            num_hidden_layers=1,
            intermediate_size=32,
        )
    ).save_pretrained(folder)
    AutoTokenizer.from_pretrained(mhsa.engine.models.loading.default_model_path()).save_pretrained(
        folder
    )
    with pytest.raises(ModelLoadError, match="returned no self-attention weights"):
        mhsa.attend("hello there", model=str(folder), device="cpu")
    with pytest.raises(UnsupportedModelError, match="Supported: BERT family"):
        mhsa.attend("hello there", model=str(folder), device="cpu", engine="mhsa")


@pytest.mark.parametrize(
    ("cuda", "mps", "want"),
    [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu"), (True, False, "cuda")],
)
def test_auto_device_prefers_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, want) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert mhsa.engine.pick_device("auto").type == want
    if not cuda:
        with pytest.raises(ModelLoadError, match="no CUDA GPU"):
            mhsa.engine.pick_device("cuda")


def test_device_choice() -> None:
    assert mhsa.engine.pick_device("cpu").type == "cpu"
    with pytest.raises(ModelLoadError, match="Unknown device"):
        mhsa.engine.pick_device("tpu9")

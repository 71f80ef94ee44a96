"""The encoder-decoder toy task (``reverse-seq2seq``), its BART family, its cross-attention
anti-diagonal score, and the shipped ``toy:reverse-seq2seq``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mhsa
from mhsa.training import (
    TASKS,
    TrainConfig,
    anti_diagonal_scores,
    build_model,
    evaluate,
    sample,
    toy_model_path,
    train,
)
from mhsa.training.tasks import BOS, IGNORE, PAD, SYMBOLS, VOCAB

TASK = "reverse-seq2seq"
#: a model small enough that a few steps take a fraction of a second
TINY = {"layers": 1, "heads": 2, "width": 32, "batch": 16, "warmup": 2}
WORD = {i: t for t, i in VOCAB.items()}


def test_the_encoder_reads_the_symbols_and_the_decoder_writes_them_reversed() -> None:
    spec = TASKS[TASK]
    batch = sample(spec, np.random.default_rng(3), 64)
    assert spec.encoder_decoder and batch.decoder_ids is not None
    assert batch.targets.shape == batch.decoder_ids.shape
    assert len(set(batch.lengths.tolist())) > 3 and 4 <= batch.lengths.min() <= 12
    for row, n in enumerate(batch.lengths.tolist()):
        source = [WORD[i] for i in batch.ids[row]]
        decoder = [WORD[i] for i in batch.decoder_ids[row]]
        symbols = source[1 : 1 + n]
        assert source[0] == BOS and decoder[0] == BOS  # [BOS] is also the decoder's start
        assert len(set(symbols)) == n and set(symbols) <= set(SYMBOLS)
        assert source[1 + n :] == [PAD] * (len(source) - 1 - n)
        assert batch.attention_mask[row].tolist() == [1] * (1 + n) + [0] * (len(source) - 1 - n)
        assert decoder[1 : 1 + n] == symbols[::-1]
        # decoder position k predicts the token at k + 1; the last position is not scored
        targets = batch.targets[row]
        assert [WORD[i] for i in targets[:n]] == symbols[::-1]
        assert (targets[n:] == IGNORE).all()


def _pattern(lengths: list[int], where) -> np.ndarray:
    """Cross attention ``[B, 1, 1, T, T]`` with all weight of row k on column ``where(k, n)``."""
    width = 1 + max(lengths)
    a = np.zeros((len(lengths), 1, 1, width, width), dtype=np.float32)
    for b, n in enumerate(lengths):
        for k in range(1 + n):
            a[b, 0, 0, k, where(k, n)] = 1
    return a


def test_anti_diagonal_score_counts_the_mirrored_source_position() -> None:
    lengths = [4, 7, 12]
    mirrored = anti_diagonal_scores(_pattern(lengths, lambda k, n: n - k), np.array(lengths))
    np.testing.assert_allclose(mirrored, [[1.0]], atol=1e-6)
    # a diagonal, and the anti-diagonal of the padded square, miss it but where they cross it
    diagonal = anti_diagonal_scores(_pattern(lengths, lambda k, n: k), np.array(lengths))
    crossings = sum(sum(k == n - k for k in range(n)) for n in lengths)  # k = n / 2, n even
    np.testing.assert_allclose(diagonal, [[crossings / sum(lengths)]], atol=1e-6)
    padded = anti_diagonal_scores(_pattern(lengths, lambda k, n: 12 - k), np.array(lengths))
    np.testing.assert_allclose(padded, [[12 / sum(lengths)]], atol=1e-6)  # only n = 12's rows
    # one sequence without a batch axis; uniform rows give 1 / (n + 1)
    uniform = np.full((2, 3, 6, 6), 1 / 6, dtype=np.float32)
    np.testing.assert_allclose(anti_diagonal_scores(uniform, 5), np.full((2, 3), 1 / 6), rtol=1e-6)


@pytest.mark.parametrize(
    ("task", "family", "message"),
    [
        (TASK, "llama", "task 'reverse-seq2seq' needs an encoder-decoder family (bart)"),
        ("copy", "bart", "task 'copy' needs a decoder-only family (llama, gpt2)"),
    ],
)
def test_a_task_trains_only_in_a_family_of_its_kind(task: str, family: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(task=task, family=family).check()


def test_the_bart_family_is_a_tiny_attention_only_bart() -> None:
    model = build_model(TrainConfig(task=TASK, family="bart"))
    c = model.config
    assert type(model).__name__ == "BartForConditionalGeneration" and c.is_encoder_decoder
    assert (c.encoder_layers, c.decoder_layers, c.d_model, c.decoder_attention_heads) == (
        2,
        2,
        64,
        4,
    )
    assert c.dropout == c.attention_dropout == 0 and c.vocab_size == len(VOCAB)
    assert c.decoder_start_token_id == VOCAB[BOS] == c.bos_token_id
    assert c.pad_token_id == VOCAB[PAD]
    for layer in (*model.model.encoder.layers, *model.model.decoder.layers):
        assert not layer.fc2.weight.any()
        assert not any(p.requires_grad for p in (*layer.fc1.parameters(), *layer.fc2.parameters()))
        assert layer.self_attn.q_proj.weight.requires_grad


@pytest.mark.slow
def test_a_short_run_lowers_the_loss_and_scores_the_cross_heads() -> None:
    config = TrainConfig(task=TASK, family="bart", steps=40, lr=1e-2, **TINY)
    result = train(config, snapshot_every=20)
    history = result.history
    assert history["step"].tolist() == [0, 20, 40]
    loss = history["loss"].tolist()  # on the same held-out batch at every snapshot
    assert loss[0] > loss[1] > loss[2] and loss[2] < loss[0] - 0.05
    assert "anti_diagonal L0H1" in history and "induction" not in history
    last = result.snapshots[-1]
    assert last.probe_source_tokens[0] == BOS and last.probe_tokens[0] == BOS
    n_dec, n_enc = len(last.probe_tokens), len(last.probe_source_tokens)
    assert last.probe_attention.shape == (1, 2, n_dec, n_enc)
    np.testing.assert_allclose(last.probe_attention.sum(-1), 1, atol=1e-5)  # cross: rows sum 1
    assert result.final.best_anti_diagonal()[0] in {"L0H0", "L0H1"}


# --- the shipped model ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped():
    lm = mhsa.load_model(f"toy:{TASK}", device="cpu")
    assert lm.lm_head == "seq2seq"
    return lm.head_model  # BartForConditionalGeneration


def test_the_shipped_folder_is_small_and_its_card_gives_the_command() -> None:
    folder = toy_model_path(TASK)
    assert sum(f.stat().st_size for f in folder.iterdir()) < 1_000_000
    card = (folder / "README.md").read_text()
    assert f"python -m mhsa train {TASK} --out data/toy/{TASK} --seed 0\n" in card
    assert "anti-diagonal score" in card and "next-token accuracy" in card


def test_the_shipped_model_reverses_held_out_sequences(shipped) -> None:
    measured = evaluate(shipped, TASK, sequences=256, seed=4242)
    assert measured.accuracy >= 0.99
    head, score = measured.best_anti_diagonal()
    assert score >= 0.8, head
    # greedy decoding from [BOS] alone writes the reversed sequence
    rng = np.random.default_rng(99)
    for n in (4, 9, 12):
        symbols = [SYMBOLS[i] for i in rng.choice(len(SYMBOLS), n, replace=False)]
        ids = torch.tensor([[VOCAB[BOS], *(VOCAB[s] for s in symbols)]])
        out = shipped.generate(ids, max_new_tokens=n, do_sample=False, num_beams=1)
        assert [WORD[i] for i in out[0, 1 : 1 + n].tolist()] == symbols[::-1]


def test_the_shipped_cross_attention_has_an_anti_diagonal_head() -> None:
    rows = {}  # (layer, head) -> every row's argmax matched, over all lengths
    for n in (4, 7, 12):  # different lengths: a diagonal or a fixed square would fail
        symbols = list(SYMBOLS[5 : 5 + n])
        r = mhsa.attend(
            " ".join(symbols),
            text_pair=" ".join(reversed(symbols)),
            model=f"toy:{TASK}",
            engine="transformers",
            device="cpu",
        )
        # the decoder reads its start token [BOS] once, then the target but its last symbol
        # (teacher forcing: the input that predicts each target symbol)
        assert r.tokens == [BOS, *symbols] and r.decoder_tokens == [BOS, *symbols[::-1][:-1]]
        cross = r.cross_attention  # (layers, heads, decoder, encoder)
        assert cross.shape[2:] == (n, n + 1)
        mirrored = np.array([n - k for k in range(n)])  # row k writes s_(n-k), at column n - k
        argmax = cross.argmax(-1)  # every row is scored
        for (layer, head), ok in np.ndenumerate((argmax == mirrored).all(-1)):
            rows[layer, head] = rows.get((layer, head), True) and bool(ok)
    assert any(rows.values()), rows


def test_the_shipped_model_runs_through_our_module_as_its_own() -> None:
    symbols = list(SYMBOLS[20:29])
    text, pair = " ".join(symbols), " ".join(reversed(symbols))
    kwargs = {"text_pair": pair, "model": f"toy:{TASK}", "device": "cpu"}
    ours = mhsa.attend(text, engine="mhsa", verify=True, **kwargs)
    theirs = mhsa.attend(text, engine="transformers", **kwargs)
    assert ours.max_abs_diff < 1e-5 and max(ours.cross_layer_max_abs_diff) < 1e-5
    np.testing.assert_allclose(ours.cross_attention, theirs.cross_attention, atol=1e-5)
    np.testing.assert_allclose(ours.attention, theirs.attention, atol=1e-5)

"""mhsa.training: toy tasks, training through our module, the shipped toy models."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import mhsa
from mhsa.engine.models.limits import Limits
from mhsa.engine.runs.swap import OurBlock, OurPass, through_our_module, trainable_our_blocks
from mhsa.errors import ModelLoadError
from mhsa.training import (
    TASKS,
    TrainConfig,
    as_loaded_model,
    build_model,
    evaluate,
    head_scores,
    make_tokenizer,
    probe,
    sample,
    save_model,
    toy_model_path,
    train,
)
from mhsa.training.tasks import BOS, IGNORE, SEP, SYMBOLS, VOCAB

#: a model small enough that a few steps take a fraction of a second
TINY = {"layers": 2, "heads": 2, "width": 16, "batch": 8, "warmup": 2}
#: the tasks of decoder-only models (the encoder-decoder one: tests/test_toy_seq2seq.py)
CAUSAL_TASKS = [name for name, spec in TASKS.items() if not spec.encoder_decoder]


# --- tasks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CAUSAL_TASKS)
def test_task_sequences_repeat_their_input_as_the_task_says(name: str) -> None:
    spec = TASKS[name]
    batch = sample(spec, np.random.default_rng(1), 64)
    assert batch.ids.shape == batch.targets.shape and batch.ids.shape[0] == 64
    lo, hi = spec.lengths
    assert batch.lengths.min() >= lo and batch.lengths.max() <= hi
    assert len(set(batch.lengths.tolist())) > 3  # lengths drawn over the range
    expected = {
        "induction": lambda s: s,
        "copy": lambda s: s,
        "reverse": lambda s: s[::-1],
        "sort": sorted,  # the vocabulary lists symbols in alphabetical order
    }[name]
    sep = VOCAB[SEP]
    for ids, targets, n in zip(batch.ids, batch.targets, batch.lengths, strict=True):
        assert ids[0] == VOCAB[BOS]
        symbols = ids[1 : 1 + n].tolist()
        assert len(set(symbols)) == n and min(symbols) >= len(VOCAB) - len(SYMBOLS)
        start = 1 + n + (name != "induction")
        if name != "induction":
            assert ids[1 + n] == sep
        output = ids[start : start + n].tolist()
        words = [list(VOCAB)[i] for i in symbols]
        assert [list(VOCAB)[i] for i in output] == list(expected(words))
        scored = np.flatnonzero(targets != IGNORE)
        # induction: every repeated symbol but the first; after [SEP]: the whole output
        assert len(scored) == (n - 1 if name == "induction" else n)
        assert (targets[scored] == ids[scored + 1]).all()
        assert (ids[scored + 1] == output[-len(scored) :]).all()


def test_tasks_are_seeded_and_the_vocabulary_is_word_level() -> None:
    spec = TASKS["induction"]
    one, two = (sample(spec, np.random.default_rng(7), 16) for _ in range(2))
    assert np.array_equal(one.ids, two.ids)
    assert not np.array_equal(one.ids, sample(spec, np.random.default_rng(8), 16).ids)
    assert len(SYMBOLS) >= 50 and len(set(SYMBOLS)) == len(SYMBOLS)
    tokenizer = make_tokenizer()
    ids = probe(spec)
    words = [list(VOCAB)[i] for i in ids[1:]]
    assert tokenizer(" ".join(words))["input_ids"] == ids  # [BOS] put in front
    assert tokenizer.convert_ids_to_tokens(ids)[0] == BOS


def test_head_scores_follow_their_definitions() -> None:
    ids = np.array(probe(TASKS["induction"]))  # [BOS], 10 symbols, the same 10
    n = len(ids)
    attention = np.zeros((2, 2, n, n), dtype=np.float32)
    attention[:, :, 0, 0] = 1
    for i in range(1, n):
        attention[0, 0, i, i - 1] = 1  # a previous-token head
        attention[0, 1, i, 0] = 1  # a head resting on [BOS]
        attention[1, 0, i, i - 10 + 1 if i > 10 else 0] = 1  # an induction head (period 10)
        attention[1, 1, i, i] = 1  # a self head
    scores = head_scores(attention, ids)
    np.testing.assert_allclose(scores.previous_token, [[1, 0], [0, 0]], atol=1e-6)
    np.testing.assert_allclose(scores.induction, [[0, 0], [1, 0]], atol=1e-6)


# --- settings -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": "parity"}, "Unknown task 'parity'"),
        ({"family": "bert"}, "family must be one of llama, gpt2"),
        ({"layers": 5}, "layers must be a whole number between 1 and 4, got 5"),
        ({"heads": 0}, "heads must be a whole number between 1 and 8, got 0"),
        ({"width": 512}, "width must be a whole number between 8 and 256, got 512"),
        ({"width": 66}, "width must be a multiple of 8"),
        ({"lr": 0.5}, "lr must be between 1e-05 and 0.1, got 0.5"),
        ({"steps": 0}, "steps must be a whole number between 1 and 5000, got 0"),
        ({"batch": 1000}, "batch must be a whole number between 1 and 256"),
        ({"warmup": -1}, "warmup must be a whole number between 0 and 5000, got -1"),
        ({"seed": -1}, "seed must be a whole number between 0 and 2147483647, got -1"),
        ({"device": "tpu"}, "device must be one of auto, cpu, cuda, mps"),
        ({"layers": 2.5}, "layers must be a whole number between 1 and 4, got 2.5"),
    ],
)
def test_out_of_range_settings_name_the_setting_and_its_range(change, message) -> None:
    config = TrainConfig(**change)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        config.check()
    with pytest.raises(ValueError):
        train(config)


def test_server_limits_bound_steps_and_parameters(monkeypatch) -> None:
    monkeypatch.setenv("MHSA_MAX_TRAIN_STEPS", "300")
    TrainConfig(steps=300).check()
    with pytest.raises(ValueError, match="steps must be a whole number between 1 and 300, got 301"):
        TrainConfig(steps=301).check()
    monkeypatch.setenv("MHSA_MAX_TRAIN_PARAMETERS", "100000")
    with pytest.raises(ValueError, match=r"has 139,584 parameters, over MHSA_MAX_TRAIN_PARAMETERS"):
        TrainConfig(steps=300).check()  # 2 x (4 x 64^2 + 3 x 64 x 256 + 2 x 64) + 2 x 64 x 64 + 64


# --- training through our module -------------------------------------------------------------
def _gradients_as_the_blocks(block: OurBlock) -> dict[str, torch.Tensor]:
    """Our module's gradients named and laid out as the model's own block's parameters: the
    family's ``store`` (the inverse weight mapping) applied to the gradients."""
    grads = copy.deepcopy(block.ours)
    with torch.no_grad():
        for g, p in zip(grads.parameters(), block.ours.parameters(), strict=True):
            g.copy_(p.grad)
    scratch = copy.deepcopy(block.original)
    block.family.store(grads, scratch)
    return {n: p.detach() for n, p in scratch.named_parameters()}


@pytest.mark.parametrize("family", ["llama", "gpt2", "bart"])
def test_one_step_through_our_module_has_the_models_own_gradients(family: str) -> None:
    task = "reverse-seq2seq" if family == "bart" else "copy"
    config = TrainConfig(task=task, family=family, mlp=True, **TINY)
    theirs = build_model(config)
    ours = copy.deepcopy(theirs)
    batch = sample(TASKS[task], np.random.default_rng(0), 8)
    ids, targets = torch.from_numpy(batch.ids), torch.from_numpy(batch.targets)
    inputs = {"input_ids": ids}
    if batch.decoder_ids is not None:  # an encoder-decoder: padded sources, teacher forcing
        inputs["attention_mask"] = torch.from_numpy(batch.attention_mask)
        inputs["decoder_input_ids"] = torch.from_numpy(batch.decoder_ids)

    def loss_of(model) -> torch.Tensor:
        logits = model(**inputs).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    loss_of(theirs).backward()
    lm = as_loaded_model(ours, None, "test")
    blocks = trainable_our_blocks(lm)
    with through_our_module(lm, blocks, OurPass(need_weights=False)):
        loss_of(ours).backward()
    names = {id(m): n for n, m in ours.named_modules()}
    grads = {n: p.grad for n, p in ours.named_parameters()}
    for block in blocks:
        assert all(p.grad is None for p in block.original.parameters())  # not in the pass
        path = names[id(block.original)]
        for name, grad in _gradients_as_the_blocks(block).items():
            grads[f"{path}.{name}"] = grad
    expected = dict(theirs.named_parameters())
    assert set(grads) == set(expected)
    for name, p in expected.items():
        assert grads[name] is not None and p.grad.abs().max() > 0, name
        torch.testing.assert_close(grads[name], p.grad, atol=1e-5, rtol=0, msg=name)


def test_initial_weights_depend_on_the_seed_only() -> None:
    config = TrainConfig(family="gpt2", **TINY)
    torch.manual_seed(1)  # torch's global generator (other threads draw from it) plays no part
    one = build_model(config).state_dict()
    torch.manual_seed(2)
    two = build_model(config).state_dict()
    other = build_model(dataclasses.replace(config, seed=1)).state_dict()
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert not torch.equal(one["transformer.wte.weight"], other["transformer.wte.weight"])


def test_same_seed_gives_bitwise_the_same_weights() -> None:
    runs = [train(TrainConfig(task="sort", steps=12, seed=s, **TINY)) for s in (3, 3, 4)]
    one, two, other = (r.model.state_dict() for r in runs)
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert not all(torch.equal(one[k], other[k]) for k in one)
    assert runs[0].history.equals(runs[1].history)


def test_a_short_run_learns_copy_above_chance_and_writes_the_weights_back() -> None:
    config = TrainConfig(task="copy", steps=150, batch=32, warmup=10, lr=3e-3, heads=2, width=32)
    seen = []
    result = train(config, on_snapshot=seen.append, snapshot_every=50)
    assert [s.step for s in seen] == [0, 50, 100, 150] == result.history["step"].tolist()
    chance = 1 / len(SYMBOLS)
    assert result.accuracy > 5 * chance
    assert seen[-1].accuracy > seen[0].accuracy
    assert result.snapshots[-1].probe_attention.shape == (2, 2, 18, 18)  # [BOS] 8 [SEP] 8
    # the model's own attention (weights written back) now gives what our module gave
    lm = as_loaded_model(result.model, result.tokenizer, "copy")
    text = " ".join(result.snapshots[-1].probe_tokens[1:])
    r = mhsa.attend(text, model=lm, engine="mhsa", verify=True)
    assert r.max_abs_diff < 1e-5
    np.testing.assert_allclose(r.attention, result.snapshots[-1].probe_attention, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_trains_on_the_gpu_from_the_same_initial_weights() -> None:
    config = TrainConfig(task="copy", steps=5, device="cuda", **TINY)
    result = train(config)
    assert next(result.model.parameters()).device.type == "cuda"
    first = build_model(config).state_dict()  # drawn on the CPU whatever the device
    on_gpu = build_model(config, device="cuda").state_dict()
    assert all(torch.equal(first[k], on_gpu[k].cpu()) for k in first)


def test_should_stop_keeps_what_was_trained_and_snapshot_errors_propagate() -> None:
    polls = []

    def stop() -> bool:
        polls.append(1)
        return len(polls) >= 3

    config = TrainConfig(family="gpt2", steps=50, **TINY)
    result = train(config, should_stop=stop, snapshot_every=10)
    assert result.stopped_early and result.steps_done == 3
    assert result.history["step"].tolist() == [0, 3]
    # GPT-2's weights written back too: its own attention gives what our module gave
    lm = as_loaded_model(result.model, result.tokenizer, "gpt2")
    text = " ".join(result.snapshots[-1].probe_tokens[1:])
    theirs = mhsa.attend(text, model=lm, engine="transformers")
    np.testing.assert_allclose(theirs.attention, result.snapshots[-1].probe_attention, atol=1e-5)

    def fail(snapshot) -> None:
        if snapshot.step == 10:
            raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt, match="cancelled"):
        train(TrainConfig(steps=50, **TINY), on_snapshot=fail, snapshot_every=10)


# --- saving and the shipped models ----------------------------------------------------------
@pytest.fixture(scope="module")
def short_result():
    return train(TrainConfig(task="reverse", steps=3, **TINY))


def test_save_writes_a_model_folder_with_a_card(tmp_path, short_result) -> None:
    out = save_model(short_result, tmp_path / "reverse")
    assert {p.name for p in out.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "README.md",
    }
    card = (out / "README.md").read_text()
    assert "--seed 0" in card and f"{short_result.accuracy:.3f}" in card
    assert [p.name for p in tmp_path.iterdir()] == ["reverse"]  # no temporary folder left
    loaded = mhsa.load_model(str(out), device="cpu")
    assert loaded.lm_head == "causal"
    for name, p in short_result.model.state_dict().items():
        assert torch.equal(loaded.head_model.state_dict()[name], p), name


def test_a_failed_save_leaves_no_half_written_folder(tmp_path, monkeypatch, short_result) -> None:
    result = dataclasses.replace(short_result, tokenizer=copy.copy(short_result.tokenizer))

    def broken(*_args, **_kwargs) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(result.tokenizer, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        save_model(result, tmp_path / "new")
    assert list(tmp_path.iterdir()) == []
    kept = save_model(short_result, tmp_path / "kept")  # an existing model is not lost either
    with pytest.raises(OSError, match="disk full"):
        save_model(result, kept)
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    assert (kept / "tokenizer.json").is_file()


def test_toy_names_are_allowed_like_the_embedded_model() -> None:
    limits = Limits(allowed_models=())
    for task in TASKS:
        limits.check_model(f"toy:{task}")
    for name in ("toy:parity", "toy:", "toy:../induction"):
        with pytest.raises(ModelLoadError, match="does not load"):
            limits.check_model(name)
    with pytest.raises(ModelLoadError, match="not a shipped toy model"):
        mhsa.load_model("toy:parity", device="cpu")


@pytest.mark.parametrize("task", CAUSAL_TASKS)
def test_shipped_models_open_by_name_in_both_engines(task: str) -> None:
    folder = toy_model_path(task)
    assert folder == Path(__file__).parents[1] / "data" / "toy" / task
    assert sum(f.stat().st_size for f in folder.iterdir()) < 1_000_000
    card = (folder / "README.md").read_text()
    assert f"python -m mhsa train {task} --out data/toy/{task} --seed 0" in card
    text = " ".join(SYMBOLS[:6])
    ours = mhsa.attend(text, model=f"toy:{task}", engine="mhsa", verify=True, device="cpu")
    theirs = mhsa.attend(text, model=f"toy:{task}", engine="transformers", device="cpu")
    assert ours.tokens == [BOS, *SYMBOLS[:6]] and ours.model == f"toy:{task}"
    assert ours.max_abs_diff < 1e-5 and ours.hidden_max_abs_diff < 1e-4
    np.testing.assert_allclose(ours.attention, theirs.attention, atol=1e-5)


def test_the_shipped_induction_model_shows_the_mechanism() -> None:
    lm = mhsa.load_model("toy:induction", device="cpu")
    measured = evaluate(lm.head_model, "induction", sequences=512, seed=12345)
    assert measured.accuracy >= 0.95
    # a previous-token head in layer 0, an induction head in layer 1
    assert measured.scores.previous_token[0].max() >= 0.5
    assert measured.scores.induction[1].max() >= 0.5

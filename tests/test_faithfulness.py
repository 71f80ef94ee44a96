"""Faithfulness (``mhsa.explain.faithfulness``) against the plain transformers model: the same
patterns put in by patching its eager attention function, the loss or the embedding's distance
computed here by hand, never through our recorder or our metrics."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mhsa
from mhsa.errors import InputError
from mhsa.explain.faithfulness import (
    heads_faithfulness,
    layer_faithfulness,
    many_heads_faithfulness,
    pattern_faithfulness,
)
from tests.tiny import save_tiny

TEXTS = [
    "the cat sat on the mat and the dog slept",
    "a bird sang in the tall tree by the river",
    "she gave him the old red book",
]


@pytest.fixture(scope="module")
def sharp_gpt2_path(tmp_path_factory) -> str:
    """A tiny GPT-2 with its head, its matrices at ten times the initial scale: heads whose
    patterns move the loss by far more than float32's rounding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(2)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=30522, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "wte" not in name and "wpe" not in name:
                p.mul_(10)
    return save_tiny(tmp_path_factory.mktemp("gpt2-sharp"), model)


def _plain(path: str, causal: bool):
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    cls = AutoModelForCausalLM if causal else AutoModel
    model = cls.from_pretrained(path, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(path)


def _attention_modules(model, causal: bool) -> list[torch.nn.Module]:
    if causal:
        return [block.attn for block in model.transformer.h]
    return [layer.attention.self for layer in model.encoder.layer]


def _inputs(model, tok, text: str) -> dict[str, torch.Tensor]:
    """The tokenizer's inputs that the model's forward names (the tiny GPT-2 reads BERT's
    tokenizer's token types too, as our engine gives them)."""
    named = inspect.signature(model.forward).parameters
    return {k: v for k, v in tok(text, return_tensors="pt").items() if k in named}


def _run_patched(model, modeling, modules, inputs, patterns: dict) -> object:
    """The plain model's outputs with ``patterns[(layer, head)]`` ``[n, n]`` as that head's
    probabilities, through its eager attention function patched for the pass."""
    own = modeling.eager_attention_forward
    layer_of = {id(m): i for i, m in enumerate(modules)}

    def patched(module, query, key, value, attention_mask, *args, **kwargs):
        out, weights = own(module, query, key, value, attention_mask, *args, **kwargs)
        layer = layer_of[id(module)]
        mine = {h: p for (li, h), p in patterns.items() if li == layer}
        if not mine:
            return out, weights
        weights = weights.clone()
        for h, p in mine.items():
            weights[0, h] = torch.as_tensor(p, dtype=weights.dtype)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    saved = modeling.eager_attention_forward
    modeling.eager_attention_forward = patched
    try:
        with torch.no_grad():
            return model(**inputs)
    finally:
        modeling.eager_attention_forward = saved


def _uniform(n: int, causal: bool) -> np.ndarray:
    allowed = np.tril(np.ones((n, n))) if causal else np.ones((n, n))
    return allowed / allowed.sum(1, keepdims=True)


def _previous(n: int) -> np.ndarray:
    """Each query on the token before it (the first on itself): a program of our own."""
    p = np.zeros((n, n))
    p[0, 0] = 1
    p[np.arange(1, n), np.arange(n - 1)] = 1
    return p


def _first(n: int) -> np.ndarray:
    p = np.zeros((n, n))
    p[:, 0] = 1
    return p


def _gpt2_m(model, modeling, modules, tok, patterns_per_text) -> float:
    """Mean next-token cross-entropy over every token of every text together, by hand."""
    total, count = 0.0, 0
    for t, text in enumerate(TEXTS):
        inputs = _inputs(model, tok, text)
        ids = inputs["input_ids"]
        patterns = {h: ps[t] for h, ps in patterns_per_text.items()}
        logits = _run_patched(model, modeling, modules, inputs, patterns).logits[0].double()
        logp = torch.log_softmax(logits[:-1], -1)
        total += float(-logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]].sum())
        count += ids.shape[1] - 1
    return total / count


def _bert_m(model, modeling, modules, tok, patterns_per_text) -> float:
    """Mean over texts of 1 - cosine between the patched and the intact mean-pooled embedding."""
    out = []
    for t, text in enumerate(TEXTS):
        inputs = _inputs(model, tok, text)
        patterns = {h: ps[t] for h, ps in patterns_per_text.items()}
        clean = _run_patched(model, modeling, modules, inputs, {}).last_hidden_state[0].double()
        run = _run_patched(model, modeling, modules, inputs, patterns).last_hidden_state[0]
        out.append(1 - float(F.cosine_similarity(run.double().mean(0), clean.mean(0), dim=0)))
    return float(np.mean(out))


def _sizes(tok) -> list[int]:
    return [len(tok(text)["input_ids"]) for text in TEXTS]


def _check_against_plain(f, plain_m, program: dict, uniform: dict) -> None:
    m_clean = plain_m({})
    m_program = plain_m(program)
    m_uniform = plain_m(uniform)
    assert abs(f.m_clean - m_clean) < 1e-5
    assert abs(f.m_program - m_program) < 1e-5
    assert abs(f.m_uniform - m_uniform) < 1e-5
    assert abs(m_uniform - m_clean) > 1e-3  # the heads matter: the checks below can fail
    by_hand = 1 - (m_program - m_clean) / (m_uniform - m_clean)
    assert f.reason == "" and abs(f.value - by_hand) < 1e-3
    assert abs(f.value - 1) > 0.05 and abs(f.value) > 0.05  # neither end: a real ratio


def test_gpt2_faithfulness_matches_the_plain_model_patched(sharp_gpt2_path) -> None:
    from transformers.models.gpt2 import modeling_gpt2

    model, tok = _plain(sharp_gpt2_path, causal=True)
    modules = _attention_modules(model, causal=True)
    sizes = _sizes(tok)
    program = {(0, 1): [_previous(n) for n in sizes], (1, 2): [_first(n) for n in sizes]}
    uniform = {h: [_uniform(n, True) for n in sizes] for h in program}
    lm = mhsa.load_model(sharp_gpt2_path, device="cpu")
    f = pattern_faithfulness(lm, TEXTS, program)
    assert f.task == "lm-loss" and f.heads == ((0, 1), (1, 2)) and f.texts == 3
    _check_against_plain(
        f, lambda p: _gpt2_m(model, modeling_gpt2, modules, tok, p), program, uniform
    )


def test_bert_faithfulness_matches_the_plain_model_patched(tiny_bert_sharp_path) -> None:
    from transformers.models.bert import modeling_bert

    model, tok = _plain(tiny_bert_sharp_path, causal=False)
    modules = _attention_modules(model, causal=False)
    sizes = _sizes(tok)
    program = {(1, 0): [_previous(n) for n in sizes]}
    uniform = {(1, 0): [_uniform(n, False) for n in sizes]}
    f = pattern_faithfulness(tiny_bert_sharp_path, TEXTS, {"L1H0": program[(1, 0)]})
    assert f.task == "embedding" and f.m_clean == 0.0
    _check_against_plain(
        f, lambda p: _bert_m(model, modeling_bert, modules, tok, p), program, uniform
    )


def test_the_heads_own_pattern_scores_1_and_the_uniform_0(tiny_bert_sharp_path) -> None:
    lm = mhsa.load_model(tiny_bert_sharp_path, device="cpu")
    own = [
        mhsa.engine.stream.record(t, model=lm, points=["L0.pattern"])["L0.pattern"] for t in TEXTS
    ]
    heads = {(0, h): [o[h].numpy() for o in own] for h in (1, 2)}
    for head, f in heads_faithfulness(lm, TEXTS, heads).items():
        assert abs(f.m_program - f.m_clean) < 1e-6, head
        assert abs(f.value - 1) < 1e-3, head
    uniform = [_uniform(o.shape[-1], False) for o in own]
    f = pattern_faithfulness(lm, TEXTS, {(0, 2): uniform})
    assert f.m_program == f.m_uniform and f.value == 0.0


def test_a_head_that_writes_nothing_gets_no_number_and_a_reason(tmp_path) -> None:
    """Head 0 of layer 0 with its output projection's columns zeroed: no pattern of it can
    change anything, so no ratio is meaningful; its layer replaced whole still gets one."""
    from tests.tiny import tiny_bert

    torch.manual_seed(1)
    model = tiny_bert()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)
        model.encoder.layer[0].attention.output.dense.weight[:, :8] = 0  # head 0: 8 dims
    lm = mhsa.load_model(save_tiny(tmp_path / "mute", model), device="cpu")
    sizes = [len(lm.tokenizer(t)["input_ids"]) for t in TEXTS]
    mute = pattern_faithfulness(lm, TEXTS, {(0, 0): [_first(n) for n in sizes]})
    assert math.isnan(mute.value)
    assert "L0H0" in mute.reason and "5%" in mute.reason and "L0" in mute.reason
    assert abs(mute.m_uniform - mute.m_clean) < 1e-9 < mute.scale
    layer = layer_faithfulness(lm, TEXTS, {(0, h): [_first(n) for n in sizes] for h in range(4)})
    assert set(layer) == {0}
    whole = layer[0]
    assert whole.reason == "" and not math.isnan(whole.value)
    assert whole.scale == pytest.approx(whole.m_uniform - whole.m_clean)


def test_the_best_explained_quarter_is_replaced_together(tiny_bert_sharp_path) -> None:
    lm = mhsa.load_model(tiny_bert_sharp_path, device="cpu")
    sizes = [len(lm.tokenizer(t)["input_ids"]) for t in TEXTS]
    patterns = {(li, h): [_previous(n) for n in sizes] for li in range(2) for h in range(4)}
    scores = {f"L{li}H{h}": 0.1 * (li * 4 + h) for li in range(2) for h in range(4)}
    scores["L1H3"] = math.nan  # never chosen
    f = many_heads_faithfulness(lm, TEXTS, patterns, scores)  # 8 heads: a quarter is 2
    assert f.heads == ((1, 1), (1, 2))
    alone = pattern_faithfulness(lm, TEXTS, {h: patterns[h] for h in f.heads})
    assert alone.m_program == f.m_program and alone.value == f.value


def test_toy_induction_heads_programs_are_faithful() -> None:
    """toy:induction on a repeated sequence, scored on the repeat: its previous-token head L0H3
    put back as offset(-1) keeps the loss (its measure is the repeat's loss)."""
    from mhsa.atlas.corpora import task_corpus

    texts = task_corpus("induction", count=4, seed=5)
    lm = mhsa.load_model("toy:induction", device="cpu")
    sizes = [len(lm.tokenizer(t)["input_ids"]) for t in texts]
    f = pattern_faithfulness(lm, texts, {(0, 3): [_previous(n) for n in sizes]})
    assert f.task == "repeat-loss"
    assert f.m_uniform > f.m_clean + 0.5  # the head matters for the repeat
    assert f.value > 0.8


def test_bad_patterns_get_one_clear_message(sharp_gpt2_path) -> None:
    lm = mhsa.load_model(sharp_gpt2_path, device="cpu")
    sizes = [len(lm.tokenizer(t)["input_ids"]) for t in TEXTS]
    future = [np.eye(n, k=1) + np.diag([0] * (n - 1) + [1]) for n in sizes]  # on the next token
    with pytest.raises(InputError, match="may not see"):
        pattern_faithfulness(lm, TEXTS, {(0, 0): future})
    with pytest.raises(InputError, match="2 patterns for 3 texts"):
        pattern_faithfulness(lm, TEXTS, {(0, 0): [_first(n) for n in sizes[:2]]})
    with pytest.raises(InputError, match="row 0 sums to 2"):
        pattern_faithfulness(lm, TEXTS, {(0, 0): [2 * _first(n) for n in sizes]})
    with pytest.raises(InputError, match="tokens"):
        pattern_faithfulness(lm, TEXTS, {(0, 0): [_first(n + 1) for n in sizes]})
    with pytest.raises(InputError, match="no head L5H0"):
        pattern_faithfulness(lm, TEXTS, {(5, 0): [_first(n) for n in sizes]})
    with pytest.raises(InputError, match="not a head"):
        pattern_faithfulness(lm, TEXTS, {"head": [_first(n) for n in sizes]})
    with pytest.raises(InputError, match="embedding"):
        pattern_faithfulness(lm, TEXTS, {(0, 0): [_first(n) for n in sizes]}, task="nope")


@pytest.mark.parametrize("toy", ["induction", "copy"])
def test_a_toy_model_is_measured_on_its_tasks_scored_positions(toy: str) -> None:
    """m_clean is the plain model's cross-entropy over the positions the task scores, counted
    here from the sequence's layout: the repeat after its first token (induction), the output
    after [SEP] (copy)."""
    from transformers import AutoModelForCausalLM

    from mhsa.atlas.corpora import task_corpus
    from mhsa.training.toy import toy_model_path

    texts = task_corpus(toy, count=3, seed=1)
    lm = mhsa.load_model(f"toy:{toy}", device="cpu")
    plain = AutoModelForCausalLM.from_pretrained(toy_model_path(toy)).eval()
    total, count = 0.0, 0
    for text in texts:
        ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
        tokens = lm.tokenizer.convert_ids_to_tokens(ids[0].tolist())
        if toy == "induction":
            half = (len(tokens) - 1) // 2  # [BOS], L symbols, the same L again
            first = 1 + half + 1
        else:
            first = tokens.index("[SEP]") + 1
        with torch.no_grad():
            logp = torch.log_softmax(plain(input_ids=ids).logits[0].double(), -1)
        for k in range(first, len(tokens)):
            total -= float(logp[k - 1, ids[0, k]])
            count += 1
    sizes = [len(lm.tokenizer(t)["input_ids"]) for t in texts]
    f = pattern_faithfulness(lm, texts, {(0, 0): [_previous(n) for n in sizes]})
    assert f.task == ("repeat-loss" if toy == "induction" else "output-loss")
    assert abs(f.m_clean - total / count) < 1e-5
    named = pattern_faithfulness(lm, texts, {(0, 0): [_previous(n) for n in sizes]}, task=toy)
    assert named.task == f.task and named.m_program == f.m_program

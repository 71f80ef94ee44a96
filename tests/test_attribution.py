"""Direct logit attribution and the logit lens (``mhsa.causal.attribution``): the components sum to
the
model's logit difference; a head's share equals a computation from plain hooks on the plain
transformers model; the lens's last stage is the model's logits; post-norm models refused."""

from __future__ import annotations

import pytest
import torch

import mhsa
from mhsa.causal.attribution import answer_tokens, head_attribution, logit_lens, residual_pass
from tests.tiny import DECODER_SIZES, perturbed_biases, save_tiny

TEXT = "the cat sat on the mat and the cat"
TOY_TEXT = "ba ke mo di lu ba ke mo"


def _loud(lm: mhsa.engine.LoadedModel) -> mhsa.engine.LoadedModel:
    """Embeddings and unembedding 30x their initial scale (std 0.6, about a trained model's):
    logit differences of order 1 to 10, so that a sum check to 1e-4 means something."""
    with torch.no_grad():
        lm.head_model.get_input_embeddings().weight.mul_(30)
        if lm.head_model.get_output_embeddings().weight is not (
            lm.head_model.get_input_embeddings().weight
        ):
            lm.head_model.get_output_embeddings().weight.mul_(30)
    return lm


@pytest.fixture(scope="module")
def gpt2(tiny_gpt2_path: str) -> mhsa.engine.LoadedModel:
    """GPT-2: LayerNorm, biases everywhere, tied embeddings."""
    return _loud(perturbed_biases(mhsa.load_model(tiny_gpt2_path, device="cpu")))


@pytest.fixture(scope="module")
def llama_bias(tmp_path_factory: pytest.TempPathFactory) -> mhsa.engine.LoadedModel:
    """Llama with biases on every attention projection and the MLP, grouped-query attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**DECODER_SIZES, num_key_value_heads=2, attention_bias=True, mlp_bias=True)
    folder = save_tiny(tmp_path_factory.mktemp("llama-bias"), LlamaForCausalLM(config))
    return _loud(perturbed_biases(mhsa.load_model(folder, device="cpu")))


@pytest.fixture(scope="module")
def toy() -> mhsa.engine.LoadedModel:
    return mhsa.load_model("toy:induction", device="cpu")


@pytest.mark.parametrize("name", ["gpt2", "llama_bias", "toy"])
def test_components_sum_to_the_logit_difference(name: str, request: pytest.FixtureRequest):
    lm = request.getfixturevalue(name)
    text, answer, wrong = (TOY_TEXT, "di", "lu") if name == "toy" else (TEXT, "sat", "mat")
    a = head_attribution(text, model=lm, answer=answer, wrong=wrong)
    # the model's own logits, from a plain forward without our module
    logits = lm.head_model(**_inputs(lm, text)).logits[0, -1]
    own = float(logits[a.answer_id] - logits[a.wrong_id])
    assert abs(a.logit_diff - own) <= 1e-4
    assert abs(a.total - own) <= 1e-4
    assert a.norm == ("RMSNorm" if name != "gpt2" else "LayerNorm")
    frame = a.frame()
    assert abs(frame["contribution"].sum() - own) <= 1e-4
    assert frame["contribution"].abs().sum() > 1  # components large enough to test the sum
    layers, heads = a.heads.shape
    assert len(frame) == 1 + layers * (heads + 2) + 2
    if name != "toy":  # biases were made non-zero: each bias is a component that counts
        assert (abs(a.attn_bias) > 1e-6).all()
    if name == "gpt2":
        assert abs(a.final_norm_bias) > 1e-6


def _inputs(lm: mhsa.engine.LoadedModel, text: str) -> dict[str, torch.Tensor]:
    """The tokenizer's inputs as the model takes them (GPT-2 adds the token-type embeddings of
    the tiny models' BERT tokenizer; Llama takes no token types)."""
    inputs = dict(lm.tokenizer(text, return_tensors="pt"))
    if not hasattr(lm.head_model, "transformer"):
        inputs.pop("token_type_ids", None)
    return inputs


def _hooked_head_attribution(lm: mhsa.engine.LoadedModel, text: str, answer: int, wrong: int):
    """Each head's direct logit attribution at the last token, from hooks on the plain model:
    the input of each layer's output projection (the heads' concatenated contexts) and of the
    final norm (the whole residual)."""
    seen: dict[str, torch.Tensor] = {}
    model = lm.head_model
    gpt2 = hasattr(model, "transformer")
    layers = model.transformer.h if gpt2 else model.model.layers
    projections = [la.attn.c_proj if gpt2 else la.self_attn.o_proj for la in layers]
    norm = model.transformer.ln_f if gpt2 else model.model.norm
    handles = [
        p.register_forward_pre_hook(lambda _m, args, i=i: seen.__setitem__(f"z{i}", args[0]))
        for i, p in enumerate(projections)
    ]
    handles.append(norm.register_forward_pre_hook(lambda _m, args: seen.__setitem__("x", args[0])))
    try:
        model(**_inputs(lm, text))
    finally:
        for h in handles:
            h.remove()
    x = seen["x"][0, -1]
    if gpt2:
        centred = x - x.mean()
        sigma = torch.sqrt((centred**2).mean() + norm.eps)
    else:
        sigma = torch.sqrt((x**2).mean() + norm.variance_epsilon)
    w_u = model.get_output_embeddings().weight
    direction = w_u[answer] - w_u[wrong]
    d_head = x.shape[0] // lm.config.num_attention_heads
    out = torch.zeros(len(layers), lm.config.num_attention_heads)
    for layer, proj in enumerate(projections):
        z = seen[f"z{layer}"][0, -1]
        for h in range(out.shape[1]):
            cols = slice(h * d_head, (h + 1) * d_head)
            # Conv1D (GPT-2) is x @ W with W [in, out]; nn.Linear is x @ W^T
            head_out = z[cols] @ (proj.weight[cols] if gpt2 else proj.weight[:, cols].T)
            if gpt2:
                head_out = head_out - head_out.mean()
            out[layer, h] = (head_out / sigma * norm.weight) @ direction
    return out


@pytest.mark.parametrize("name", ["gpt2", "llama_bias"])
def test_heads_match_a_hand_computation_on_the_plain_model(
    name: str, request: pytest.FixtureRequest
):
    lm = request.getfixturevalue(name)
    a = head_attribution(TEXT, model=lm, answer="sat", wrong="mat")
    expected = _hooked_head_attribution(lm, TEXT, a.answer_id, a.wrong_id)
    assert torch.allclose(torch.from_numpy(a.heads).float(), expected, atol=1e-5)


def test_logit_lens_last_stage_is_the_models_logits(gpt2: mhsa.engine.LoadedModel):
    lens = logit_lens(TEXT, model=gpt2, answer="sat", wrong="mat", top_k=4)
    inputs = _inputs(gpt2, TEXT)
    ids = inputs["input_ids"]
    logits = gpt2.head_model(**inputs).logits[0]  # (T, V)
    top = logits.topk(4, dim=-1)
    assert lens.stages == ("embeddings", "L0", "L1")
    assert lens.top_tokens.shape == (3, ids.shape[1], 4)
    assert torch.allclose(torch.from_numpy(lens.top_logits[-1]), top.values, atol=1e-4)
    names = gpt2.tokenizer.convert_ids_to_tokens(top.indices[-1].tolist())
    assert list(lens.top_tokens[-1, -1]) == names
    probs = logits.softmax(-1).gather(-1, top.indices)
    assert torch.allclose(torch.from_numpy(lens.top_probs[-1]), probs, atol=1e-5)
    sat, mat = answer_tokens(gpt2, "sat", "mat")
    assert abs(lens.logit_diff[-1, -1] - float(logits[-1, sat] - logits[-1, mat])) <= 1e-4
    # the embeddings' stage: the embeddings through the final norm and the unembedding
    model = gpt2.head_model
    wte = model.transformer.wte
    embedded = (
        wte(ids) + wte(inputs["token_type_ids"]) + model.transformer.wpe(torch.arange(ids.shape[1]))
    )
    first = model.lm_head(model.transformer.ln_f(embedded))[0]
    assert torch.allclose(
        torch.from_numpy(lens.top_logits[0]), first.topk(4, dim=-1).values, atol=1e-4
    )


def test_toy_lens_predicts_the_repeat_only_after_the_induction_layer(toy: mhsa.engine.LoadedModel):
    lens = logit_lens(TOY_TEXT, model=toy, answer="di", wrong="lu")
    assert lens.top_tokens[-1, -1, 0] == "di"  # the token after the earlier "mo"
    assert lens.logit_diff[-1, -1] > 5 > lens.logit_diff[1, -1]


def test_post_norm_models_are_refused(tiny_bert_mlm_path: str):
    bert = mhsa.load_model(tiny_bert_mlm_path, device="cpu")
    with pytest.raises(mhsa.UnsupportedModelError, match="post-norm"):
        head_attribution("the cat sat", model=bert, answer="cat", wrong="dog")
    with pytest.raises(mhsa.UnsupportedModelError, match="LayerNorm sits inside each layer"):
        logit_lens("the cat sat", model=bert)


def test_answer_words_must_be_one_token_each(gpt2: mhsa.engine.LoadedModel):
    pieces = gpt2.tokenizer(" xylophonequartz", add_special_tokens=False)["input_ids"]
    assert len(pieces) > 1
    names = gpt2.tokenizer.convert_ids_to_tokens(pieces)
    with pytest.raises(mhsa.InputError) as info:
        answer_tokens(gpt2, "xylophonequartz", "cat")
    assert all(n in str(info.value) for n in names)
    with pytest.raises(mhsa.InputError, match=r"vocabulary \(it becomes \[UNK\]\)"):
        answer_tokens(gpt2, "\u2603", "cat")  # a snowman: no WordPiece of its own
    with pytest.raises(mhsa.InputError, match="same token"):
        answer_tokens(gpt2, "cat", " cat ")
    with pytest.raises(mhsa.InputError, match="wrong answer"):
        answer_tokens(gpt2, "cat", "")
    cat = gpt2.tokenizer(" cat", add_special_tokens=False)["input_ids"]
    assert answer_tokens(gpt2, "cat", "dog")[0] == cat[0]


def test_residual_pass_parts_add_up(gpt2: mhsa.engine.LoadedModel):
    """The recorded parts are the model's residual stream: per layer, the residual after it is
    the one before plus attention plus MLP; attention is its heads plus the output bias."""
    run = residual_pass(TEXT, model=gpt2)
    for layer in range(run.layers):
        added = run.resid_pre[layer] + run.attn_out[layer] + run.mlp_out[layer]
        assert torch.allclose(added, run.resid_post[layer], atol=1e-5)
        heads = sum(run.head_outputs(layer, -1)) + run.b_o[layer]
        assert torch.allclose(heads, run.attn_out[layer][-1], atol=1e-5)


def test_a_generation_runs_over_the_ids_the_model_chose(toy: mhsa.engine.LoadedModel):
    """Decoded and tokenized again, "ba ke" + "mo di lu" would be "ba kemo di lu": the lens and
    the attribution read the ids themselves."""
    generation = mhsa.engine.generate_ids("ba ke mo di lu ba ke", model=toy, max_new_tokens=3)
    lens = logit_lens(generation, model=toy)
    assert list(lens.tokens) == toy.tokenizer.convert_ids_to_tokens(list(generation.ids))
    assert lens.tokens[-3:] == ("mo", "di", "lu")  # the repeat, continued
    a = head_attribution(generation, model=toy, answer="ba", wrong="ke")
    assert a.text == generation.text and abs(a.total - a.logit_diff) <= 1e-4


def test_predicted_words_drop_the_word_marks():
    import numpy as np

    from mhsa.causal.attribution import LogitLens, predicted_words

    tops = np.array([[["Ġcat", "\n", "▁dog", "x"]]], dtype=object)
    lens = LogitLens(("a",), ("L0",), tops, np.zeros((1, 1, 4)), np.zeros((1, 1, 4)))
    assert predicted_words(lens) == ("cat", "dog")
    assert predicted_words(lens, 3) == ("cat", "dog", "x")

"""Knock-outs, head importance and pruning curves, checked against the model's own forward
with heads zeroed by hand, brute-force loops and finite differences."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mhsa
from mhsa.causal.importance import target_value
from mhsa.causal.targets import MASK_FRACTION, mask_tokens
from mhsa.engine.encoding import encode
from mhsa.engine.runs.swap import OurPass, forward_through_ours

TEXT = "The quick brown fox jumps over the lazy dog near the bank."
PAIR = "A fast fox leaps over a sleepy dog by the river."


def _out_projections(lm: mhsa.engine.LoadedModel) -> list[torch.nn.Module]:
    """The model's own output projection of every layer (their input is the heads' context,
    head h in features h * d_head .. (h + 1) * d_head)."""
    base = lm.model
    if hasattr(base, "encoder"):  # BERT
        return [layer.attention.output.dense for layer in base.encoder.layer]
    if hasattr(base, "h"):  # GPT-2
        return [block.attn.c_proj for block in base.h]
    return [layer.self_attn.o_proj for layer in base.layers]  # Llama


def _zeroing(heads: list[int], d_head: int):
    def hook(_module, args):
        x = args[0].clone()
        for h in heads:
            x[..., h * d_head : (h + 1) * d_head] = 0
        return (x,)

    return hook


def _by_hand(lm: mhsa.engine.LoadedModel, text: str, off: list[tuple[int, int]]):
    """The model's own eager forward with heads zeroed before its output projection: its
    attentions, its pooled embedding and (with an LM head) its own loss."""
    facts = lm.facts()
    d_head = facts["d_model"] // facts["heads"]
    handles = []
    for layer, proj in enumerate(_out_projections(lm)):
        heads = [h for li, h in off if li == layer]
        if heads:
            handles.append(proj.register_forward_pre_hook(_zeroing(heads, d_head)))
    inputs = lm.tokenizer(text, return_tensors="pt")
    try:
        with torch.no_grad():
            out = lm.model(**inputs, output_attentions=True)
            loss = None
            if lm.head_model is not None:
                loss = float(lm.head_model(**inputs, labels=inputs["input_ids"]).loss)
    finally:
        for h in handles:
            h.remove()
    attention = torch.stack([a[0] for a in out.attentions]).numpy()
    embedding = out.last_hidden_state[0].mean(0)
    return attention, embedding, loss


@pytest.mark.parametrize(
    ("model", "off"),
    [("minilm", [(0, 3), (2, 5), (2, 7)]), ("gpt2", [(0, 1), (0, 2)]), ("llama", [(0, 3)])],
)
@pytest.mark.slow
def test_ablate_equals_zeroing_heads_before_the_models_own_output_projection(
    model, off, request
) -> None:
    lm = (
        request.getfixturevalue("minilm")
        if model == "minilm"
        else mhsa.load_model(request.getfixturevalue(f"tiny_{model}_path"), device="cpu")
    )
    a = mhsa.ablate(TEXT, [f"L{li}H{h}" for li, h in off], model=lm)
    attention, embedding, loss = _by_hand(lm, TEXT, off)
    intact_attention, intact_embedding, intact_loss = _by_hand(lm, TEXT, [])
    np.testing.assert_allclose(a.ablated.attention, attention, atol=1e-5)
    np.testing.assert_allclose(a.intact.attention, intact_attention, atol=1e-5)
    # the knock-out changed the layers above it (else the comparison above proves nothing)
    assert np.abs(a.ablated.attention[1:] - a.intact.attention[1:]).max() > 1e-4  # 10x atol
    assert a.heads == tuple(off)
    if model == "minilm":
        assert a.target == "embedding"  # no LM head: the sentence embedding
        expected = 1 - F.cosine_similarity(embedding, intact_embedding, dim=0)
        assert a.change == pytest.approx(float(expected), abs=1e-5)
        assert a.change > 1e-4
    else:
        assert a.target == "lm-loss"  # decoders with their head: the model's own loss
        assert a.ablated_value == pytest.approx(loss, abs=1e-5)
        assert a.intact_value == pytest.approx(intact_loss, abs=1e-5)
        assert a.change == pytest.approx(loss - intact_loss, abs=1e-5)


@pytest.mark.slow
def test_all_gates_on_reproduces_the_intact_model_exactly(minilm, tiny_llama_path) -> None:
    for lm in (minilm, mhsa.load_model(tiny_llama_path, device="cpu")):
        inputs = dict(lm.tokenizer(TEXT, return_tensors="pt"))
        layers, heads = lm.facts()["layers"], lm.facts()["heads"]
        ones = {layer: torch.ones(heads) for layer in range(layers)}
        with torch.inference_mode():
            plain = forward_through_ours(lm, inputs, OurPass(need_weights=False))
            gated = forward_through_ours(lm, inputs, OurPass(gates=ones, need_weights=False))
        assert torch.equal(plain.last_hidden_state, gated.last_hidden_state)


def test_leave_one_out_equals_the_brute_force_loop(tiny_bert_sharp_path) -> None:
    """On the embedded model's architecture and tokenizer at 2 layers of 4 heads with heads that
    matter (the brute-force loop on MiniLM's 72 heads took a minute of the suite)."""
    lm = mhsa.load_model(tiny_bert_sharp_path, device="cpu")
    texts = [TEXT, "Dogs bark at night."]
    # batch_size 3: the four heads of a layer run in uneven chunks
    table = mhsa.causal.head_importance(texts, model=lm, batch_size=3)
    assert list(table.columns) == ["layer", "head", "importance", "std"]
    assert table.loc["L1H2", ["layer", "head"]].tolist() == [1, 2]
    brute = np.array(
        [
            [np.mean([mhsa.ablate(t, [(li, h)], model=lm).change for t in texts]) for h in range(4)]
            for li in range(2)
        ]
    )
    np.testing.assert_allclose(table["importance"].to_numpy().reshape(2, 4), brute, atol=1e-6)
    assert brute.std() > 1e-3  # the heads differ: an all-equal answer would fail


@pytest.mark.slow
def test_leave_one_out_on_a_decoder_loss_equals_the_brute_force_loop(tiny_gpt2_path) -> None:
    lm = mhsa.load_model(tiny_gpt2_path, device="cpu")
    table = mhsa.causal.head_importance([TEXT], model=lm)
    assert table.attrs["target"] == "lm-loss"
    brute = [mhsa.ablate(TEXT, [(li, h)], model=lm).change for li in range(2) for h in range(4)]
    np.testing.assert_allclose(table["importance"], brute, atol=1e-5)


def _finite_difference(text, layer, head, heads, **kw) -> float:
    eps = 1e-2
    up, down = [1.0] * heads, [1.0] * heads
    up[head], down[head] = 1 + eps, 1 - eps
    return (target_value(text, {layer: up}, **kw) - target_value(text, {layer: down}, **kw)) / (
        2 * eps
    )


@pytest.mark.slow
def test_gradient_importance_matches_finite_differences(tiny_gpt2_path, minilm) -> None:
    lm = mhsa.load_model(tiny_gpt2_path, device="cpu")
    lm.head_model.double()  # float64: the differences of a loss near 10 stay exact enough
    table = mhsa.causal.head_importance([TEXT], model=lm, method="gradient")
    for name in ("L0H1", "L1H0", "L1H3"):
        layer, head = int(name[1]), int(name[3])
        fd = _finite_difference(TEXT, layer, head, 4, model=lm)
        assert table.loc[name, "gradient"] == pytest.approx(fd, rel=2e-2, abs=1e-5)
        assert table.loc[name, "importance"] == pytest.approx(abs(fd), rel=2e-2, abs=1e-5)
    # the similarity of a sentence pair through the embedded model
    sim = mhsa.causal.head_importance([(TEXT, PAIR)], model=minilm, method="gradient")
    assert sim.attrs["target"] == "similarity"
    for name in ("L0H3", "L3H8", "L5H11"):
        layer, head = int(name[1]), int(name[3:])
        fd = _finite_difference(TEXT, layer, head, 12, model=minilm, text_pair=PAIR)
        assert sim.loc[name, "gradient"] == pytest.approx(fd, rel=2e-2, abs=2e-5)
    assert sim["importance"].max() > 1e-3


def test_michel_normalisation_gives_unit_norm_per_layer(minilm) -> None:
    table = mhsa.causal.head_importance(
        [(TEXT, PAIR)], model=minilm, method="gradient", normalize=True
    )
    norms = table.groupby("layer")["importance"].apply(lambda v: float(np.linalg.norm(v)))
    np.testing.assert_allclose(norms, 1.0, rtol=1e-9)
    raw = table["importance_raw"].to_numpy().reshape(6, 12)
    ratio = table["importance"].to_numpy().reshape(6, 12) / raw
    np.testing.assert_allclose(
        ratio, 1 / np.linalg.norm(raw, axis=1, keepdims=True) * np.ones_like(raw)
    )


@pytest.mark.slow
def test_pruning_curve_ends_at_the_intact_and_the_empty_model(tiny_gpt2_path, minilm) -> None:
    lm = mhsa.load_model(tiny_gpt2_path, device="cpu")
    curve = mhsa.causal.pruning_curve([TEXT], model=lm, steps=4)
    everything = {0: [0.0] * 4, 1: [0.0] * 4}
    for name in ("importance", "random"):
        rows = curve[curve["order"] == name].set_index("heads_pruned")
        assert list(rows.index) == [0, 2, 4, 6, 8]
        assert rows.loc[0, "metric"] == pytest.approx(target_value(TEXT, model=lm), abs=1e-5)
        assert rows.loc[8, "metric"] == pytest.approx(
            target_value(TEXT, everything, model=lm), abs=1e-5
        )
    # each step prunes the previous step's heads and more, least important first
    imp = curve[curve["order"] == "importance"]["pruned"].tolist()
    steps = [set(filter(None, p.split(","))) for p in imp]
    assert all(a < b for a, b in itertools.pairwise(steps))
    table = mhsa.causal.head_importance([TEXT], model=lm)
    assert imp[1].split(",") == list(table["importance"].sort_values(kind="stable").index[:2])
    # a sentence pair through the embedded model: the similarity at 0% is the intact one
    sim = mhsa.causal.pruning_curve([(TEXT, PAIR)], model=minilm, steps=2)
    first = sim[(sim["order"] == "random") & (sim["heads_pruned"] == 0)]["metric"].item()
    assert first == pytest.approx(target_value(TEXT, model=minilm, text_pair=PAIR), abs=1e-5)


@pytest.mark.slow
def test_random_baseline_is_reproducible_from_its_seed(tiny_bert_sharp_path) -> None:
    lm = mhsa.load_model(tiny_bert_sharp_path, device="cpu")
    importance = mhsa.causal.head_importance([TEXT], model=lm)
    kw = {"model": lm, "importance": importance, "steps": 3}

    def random_rows(seed):
        curve = mhsa.causal.pruning_curve([TEXT], seed=seed, **kw)
        return curve[curve["order"] == "random"].reset_index(drop=True)

    a, b, c = random_rows(3), random_rows(3), random_rows(4)
    assert a["pruned"].tolist() == b["pruned"].tolist()
    np.testing.assert_array_equal(a["metric"], b["metric"])
    assert a["pruned"].tolist() != c["pruned"].tolist()


@pytest.mark.slow
def test_masked_lm_loss_masks_a_fixed_fifteen_percent(tiny_bert_mlm_path) -> None:
    lm = mhsa.load_model(tiny_bert_mlm_path, device="cpu")
    assert lm.lm_head == "masked"
    encoded = encode(lm, TEXT, None, None)
    inputs, labels = mask_tokens(lm, encoded)
    words = [i for i, sp in enumerate(encoded.tokens.special) if not sp]
    masked = (inputs["input_ids"][0] == lm.tokenizer.mask_token_id).nonzero().flatten().tolist()
    assert len(masked) == round(MASK_FRACTION * len(words)) and set(masked) <= set(words)
    assert mask_tokens(lm, encoded)[1].equal(labels)  # fixed: the same tokens every time
    a = mhsa.ablate(TEXT, ["L1H2"], model=lm)
    assert a.target == "lm-loss"
    with torch.no_grad():  # the model's own masked-LM loss on the same masked tokens
        own = float(lm.head_model(**inputs, labels=labels).loss)
    assert a.intact_value == pytest.approx(own, abs=1e-5)
    assert a.ablated_value != pytest.approx(own, abs=1e-6)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda m: mhsa.ablate(TEXT, ["L0H0"], model=m, target="lm-loss"),
            "no language-model head",
        ),
        (lambda m: mhsa.ablate(TEXT, ["L6H0"], model=m), "There is no head L6H0"),
        (lambda m: mhsa.ablate(TEXT, ["head 3"], model=m), "is not a head"),
        (lambda m: mhsa.ablate(TEXT, [], model=m, target="similarity"), "second sentence"),
        (
            lambda m: mhsa.causal.head_importance([TEXT], model=m, method="gradient"),
            "method='ablation'",
        ),
        (lambda m: mhsa.causal.head_importance([TEXT], model=m, method="taylor"), "Unknown method"),
        (lambda m: mhsa.causal.head_importance([], model=m), "No sentences"),
        (lambda m: mhsa.causal.pruning_curve([TEXT], model=m, order="sideways"), "Unknown order"),
    ],
)
def test_bad_requests_say_what_to_do(call, message, minilm) -> None:
    with pytest.raises(mhsa.InputError, match=message):
        call(minilm)


def test_a_toy_repeat_models_automatic_target_is_the_loss_on_the_repeat() -> None:
    """toy:induction scores the repeated half only (its random first half no head can
    predict): the automatic target is the loss there, as the lessons choose. With the loss
    over every token, 7 of 8 heads came out harmful and the pruning curve ended below the
    intact model; on the repeat no head is harmful and every head off loses the repeat."""
    from mhsa.causal import head_importance, pruning_curve
    from mhsa.causal.metrics import default_target
    from mhsa.examples import model_examples

    toy = mhsa.load_model("toy:induction", device="cpu")
    assert default_target(toy) == "repeat-loss"
    assert default_target(mhsa.load_model("default", device="cpu")) == "embedding"
    text = model_examples("toy:induction")[0].text
    auto = head_importance([text], model=toy)
    repeat = head_importance([text], model=toy, target="repeat-loss")
    np.testing.assert_allclose(auto["importance"], repeat["importance"])
    assert (auto["importance"] > -1e-3).all()
    curve = pruning_curve([text], model=toy)
    intact = curve[curve["heads_pruned"] == 0]["metric"].iloc[0]
    every = curve[curve["heads_pruned"] == len(auto)]["metric"]
    assert (every > intact + 1.0).all()

"""Encoder-decoder models through our module: BART, mBART and Marian (plain multi-head
attention with biases) and T5 (relative position bias as a float mask, no scaling, no biases).

Every tiny model is saved to a folder with its language-model head and loaded by path, as a user
would. Encoder self-attention, the decoder's causal self-attention and the cross-attention all
run as our ``MultiHeadSelfAttention``.
"""

from __future__ import annotations

import copy
from unittest import mock

import numpy as np
import pytest
import torch

import mhsa
from mhsa.engine.families.bart import load_bart, store_bart
from mhsa.engine.families.t5 import load_t5, store_t5
from mhsa.engine.runs.swap import OurPass, our_blocks, through_our_module, trainable_our_blocks
from tests.tiny import SEQ2SEQ_FAMILIES, save_tiny, tiny_seq2seq

SOURCE = "the cat sat on the mat"
TARGET = "le chat dort"
TOL = 1e-4

KINDS = list(SEQ2SEQ_FAMILIES)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, mhsa.engine.LoadedModel]:
    models = {}
    for kind in KINDS:
        folder = save_tiny(tmp_path_factory.mktemp(kind), tiny_seq2seq(kind))
        models[kind] = mhsa.load_model(folder, device="cpu")
    return models


def _attention_class(lm: mhsa.engine.LoadedModel) -> type:
    """The class of the model's own attention blocks."""
    return type(our_blocks(lm)[0].original)


@pytest.mark.parametrize("kind", KINDS)
def test_every_attention_and_both_hidden_states_agree_with_the_models_own(loaded, kind) -> None:
    lm = loaded[kind]
    assert lm.lm_head == "seq2seq"
    ours = mhsa.attend(SOURCE, text_pair=TARGET, model=lm, engine="mhsa", verify=True)
    theirs = mhsa.attend(SOURCE, text_pair=TARGET, model=lm)
    n, m = len(ours.tokens), len(ours.decoder_tokens)
    assert ours.attention.shape == (2, 4, n, n)
    assert ours.decoder_attention.shape == (2, 4, m, m)
    assert ours.cross_attention.shape == (2, 4, m, n)
    for name in ("attention", "decoder_attention", "cross_attention"):
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), atol=TOL)
    upper = np.triu(np.ones((m, m), dtype=bool), 1)
    assert (ours.decoder_attention[..., upper] == 0).all()
    np.testing.assert_allclose(ours.cross_attention.sum(-1), 1.0, atol=1e-5)
    for diffs in (
        ours.layer_max_abs_diff,
        ours.decoder_layer_max_abs_diff,
        ours.cross_layer_max_abs_diff,
    ):
        assert len(diffs) == 2 and max(diffs) <= TOL
    assert ours.hidden_max_abs_diff <= TOL and ours.encoder_hidden_max_abs_diff <= TOL
    assert ours.max_abs_diff <= TOL


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_the_models_own_attention_never_runs(loaded, kind) -> None:
    lm = loaded[kind]
    theirs = mhsa.attend(SOURCE, text_pair=TARGET, model=lm)
    calls = []

    def refuse(*_args, **_kwargs):
        calls.append(1)
        raise AssertionError("the model's own attention ran")

    with mock.patch.object(_attention_class(lm), "forward", refuse):
        ours = mhsa.attend(SOURCE, text_pair=TARGET, model=lm, engine="mhsa")
        with pytest.raises(AssertionError, match="own attention ran"):  # the patch bites
            mhsa.attend(SOURCE, text_pair=TARGET, model=lm, engine="mhsa", verify=True)
    assert len(calls) == 1
    np.testing.assert_allclose(ours.cross_attention, theirs.cross_attention, atol=TOL)
    np.testing.assert_allclose(ours.decoder_attention, theirs.decoder_attention, atol=TOL)


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_untrained_modules_differ_from_the_models_weights(loaded, kind) -> None:
    lm = loaded[kind]
    theirs = mhsa.attend(SOURCE, text_pair=TARGET, model=lm)
    fresh = mhsa.attend(SOURCE, text_pair=TARGET, model=lm, engine="mhsa-random", seed=3)
    again = mhsa.attend(SOURCE, text_pair=TARGET, model=lm, engine="mhsa-random", seed=3)
    for name in ("attention", "decoder_attention", "cross_attention"):
        assert np.abs(getattr(fresh, name) - getattr(theirs, name)).max() > 1e-2, name
        np.testing.assert_array_equal(getattr(fresh, name), getattr(again, name))
    np.testing.assert_allclose(fresh.cross_attention.sum(-1), 1.0, atol=1e-5)
    assert fresh.seed == 3


def test_blocks_are_numbered_encoder_then_decoder_then_cross(loaded) -> None:
    lm = loaded["bart"]
    with lm.lock:
        blocks = our_blocks(lm)
    assert [(b.layer, b.kind, b.index) for b in blocks] == [
        (0, "encoder", 0),
        (1, "encoder", 1),
        (2, "decoder", 0),
        (3, "decoder", 1),
        (4, "cross", 0),
        (5, "cross", 1),
    ]
    model = lm.model
    assert blocks[0].original is model.encoder.layers[0].self_attn
    assert blocks[3].original is model.decoder.layers[1].self_attn
    assert blocks[4].original is model.decoder.layers[0].encoder_attn
    assert [b.causal for b in blocks] == [False, False, True, True, False, False]


@pytest.mark.parametrize(
    ("kind", "load", "store"), [("bart", load_bart, store_bart), ("t5", load_t5, store_t5)]
)
def test_weights_written_back_round_trip(loaded, kind, load, store) -> None:
    """Every block's projections -> our module -> into a copy whose projections were changed ->
    equal to the block's again, bit for bit (T5's position bias is not ours to write)."""
    with loaded[kind].lock:
        blocks = our_blocks(loaded[kind])
    for block in blocks:
        scratch = copy.deepcopy(block.original)
        projections = {
            n: p for n, p in scratch.named_parameters() if "relative_attention_bias" not in n
        }
        assert len(projections) == (8 if kind == "bart" else 4)  # weights (+ biases)
        with torch.no_grad():
            for p in projections.values():
                p.add_(1.0)
        store(load(block.original), scratch)
        theirs = dict(block.original.named_parameters())
        for name, p in projections.items():
            assert torch.equal(p, theirs[name]), name


def test_t5_scores_are_unscaled_and_biasless_with_the_models_position_bias(loaded) -> None:
    """Our T5 module: scale 1, no biases; the first encoder layer's scores get the model's
    relative position bias (``compute_bias``), which its weights must show."""
    lm = loaded["t5"]
    with lm.lock:
        blocks = our_blocks(lm)
    first = blocks[0]
    assert first.ours.scale == 1.0
    assert first.ours.qkv.bias is None and first.ours.out.bias is None
    ids = lm.tokenizer(SOURCE, return_tensors="pt")["input_ids"]
    x = lm.model.encoder.block[0].layer[0].layer_norm(lm.model.shared(ids))
    bias = first.original.compute_bias(ids.shape[1], ids.shape[1])  # (1, H, n, n)
    q, k, _ = first.ours.projections()[0][:3]
    per_head = (x @ q.T).view(1, -1, 4, 8).transpose(1, 2) @ (x @ k.T).view(1, -1, 4, 8).permute(
        0, 2, 3, 1
    )
    want = torch.softmax(per_head + bias, dim=-1)  # no 1/sqrt(d) scaling
    r = mhsa.attend(SOURCE, model=lm, text_pair=TARGET, engine="mhsa")
    np.testing.assert_allclose(r.attention[0], want[0].detach().numpy(), atol=1e-5)
    assert np.abs(r.attention[0] - torch.softmax(per_head, -1)[0].detach().numpy()).max() > 1e-3


def test_one_step_through_our_module_has_bart_s_own_gradients(loaded) -> None:
    """Training through our module (``trainable_our_blocks``): the decoder's LM loss gives each
    attention projection the gradient the model's own blocks get."""
    # eval mode: no dropout, so that both passes are the same function; gradients still flow
    theirs = copy.deepcopy(loaded["bart"].head_model).eval().requires_grad_(True)
    ours = copy.deepcopy(theirs)
    enc = loaded["bart"].tokenizer(SOURCE, return_tensors="pt")
    labels = loaded["bart"].tokenizer(TARGET, return_tensors="pt")["input_ids"]
    theirs(**enc, labels=labels).loss.backward()
    lm = mhsa.engine.LoadedModel(
        name="bart",
        display_name="bart",
        model=ours.model,
        tokenizer=None,
        device=torch.device("cpu"),
        num_parameters=0,
        load_seconds=0.0,
        head_model=ours,
        lm_head="seq2seq",
    )
    blocks = trainable_our_blocks(lm)
    assert {b.kind for b in blocks} == {"encoder", "decoder", "cross"}
    with through_our_module(lm, blocks, OurPass(need_weights=False)):
        ours(**enc, labels=labels).loss.backward()
    names = {id(m): n for n, m in ours.named_modules()}
    mirror = dict(theirs.named_modules())
    for block in blocks:
        assert all(p.grad is None for p in block.original.parameters())  # not in the pass
        want = mirror[names[id(block.original)]]
        grads = load_bart(want)  # a module of our layout to hold the model's gradients
        with torch.no_grad():
            grads.qkv.weight.copy_(
                torch.cat(
                    [want.q_proj.weight.grad, want.k_proj.weight.grad, want.v_proj.weight.grad]
                )
            )
            grads.out.weight.copy_(want.out_proj.weight.grad)
        for got, want_grad in (
            (block.ours.qkv.weight.grad, grads.qkv.weight),
            (block.ours.out.weight.grad, grads.out.weight),
        ):
            want_grad = want_grad.detach()
            scale = float(want_grad.abs().max())
            assert scale > 0, block.kind
            # float32 sums in another order: equal up to a small share of the largest gradient
            torch.testing.assert_close(got, want_grad, atol=1e-4 * scale, rtol=0)


# --- head gates: knock-outs and importance ----------------------------------------------------


def _cross_output_projection(lm: mhsa.engine.LoadedModel, layer: int) -> torch.nn.Module:
    """The plain model's W_O of a cross-attention block: its input is the heads' contexts."""
    model = lm.head_model
    if hasattr(model, "model"):  # BART family
        return model.model.decoder.layers[layer].encoder_attn.out_proj
    return model.decoder.block[layer].layer[1].EncDecAttention.o  # T5


def _loss_with_cross_head_scaled(
    lm: mhsa.engine.LoadedModel, layer: int, head: int, gate: torch.Tensor
) -> torch.Tensor:
    """The decoder's LM loss of TARGET given SOURCE on the plain model (its own attention),
    with one cross-attention head's context multiplied by ``gate`` (a hook on W_O's input)."""
    d_head = 8

    def scale(_module, args):
        x = args[0]
        keep = torch.ones(x.shape[-1])
        keep[head * d_head : (head + 1) * d_head] = 0
        return (x * keep + x * (1 - keep) * gate,)

    enc = lm.tokenizer(SOURCE, return_tensors="pt")
    labels = lm.tokenizer(TARGET, return_tensors="pt")["input_ids"]
    handle = _cross_output_projection(lm, layer).register_forward_pre_hook(scale)
    try:
        return lm.head_model(**enc, labels=labels).loss
    finally:
        handle.remove()


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_knocking_out_a_cross_head_moves_the_loss_as_a_hook_on_the_plain_model(
    loaded, kind
) -> None:
    lm = loaded[kind]
    with torch.no_grad():
        intact = float(
            lm.head_model(
                **lm.tokenizer(SOURCE, return_tensors="pt"),
                labels=(lm.tokenizer(TARGET, return_tensors="pt")["input_ids"]),
            ).loss
        )
        off = float(_loss_with_cross_head_scaled(lm, 0, 1, torch.tensor(0.0)))
    a = mhsa.ablate(SOURCE, ["C0H1"], model=lm, text_pair=TARGET)
    assert a.target == "lm-loss" and a.heads == ((4, 1),)  # blocks: E0 E1 D0 D1 C0 C1
    assert a.intact_value == pytest.approx(intact, abs=1e-5)
    assert a.ablated_value == pytest.approx(off, abs=1e-5)
    assert abs(a.change) > 1e-5 and a.change == pytest.approx(off - intact, abs=1e-5)
    # the shown attention: cross attention of layer 0 is the same (the knock-out acts after
    # the weights), the decoder's next layer moves
    np.testing.assert_allclose(a.ablated.cross_attention[0], a.intact.cross_attention[0])
    assert np.abs(a.ablated.cross_attention[1] - a.intact.cross_attention[1]).max() > 0
    assert a.ablated.decoder_tokens == a.intact.decoder_tokens


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_importance_labels_say_which_attention_and_match_a_hand_gradient(loaded, kind) -> None:
    lm = loaded[kind]
    pair = [(SOURCE, TARGET)]
    imp = mhsa.causal.head_importance(pair, model=lm)
    labels = [f"{k}{li}H{h}" for k in "EDC" for li in range(2) for h in range(4)]
    assert list(imp.index) == labels
    assert list(imp["kind"].unique()) == ["encoder", "decoder", "cross"]
    a = mhsa.ablate(SOURCE, ["D1H2"], model=lm, text_pair=TARGET)
    assert imp.loc["D1H2", "importance"] == pytest.approx(a.change, abs=1e-6)
    grad = mhsa.causal.head_importance(pair, model=lm, method="gradient")
    gate = torch.ones((), requires_grad=True)
    (want,) = torch.autograd.grad(_loss_with_cross_head_scaled(lm, 1, 3, gate), [gate])
    assert grad.loc["C1H3", "gradient"] == pytest.approx(float(want), rel=1e-3, abs=1e-7)
    curve = mhsa.causal.pruning_curve(pair, model=lm, steps=2, importance=imp)
    assert set(curve["pruned"].iloc[-1].split(",")) == set(labels)


def test_encoder_decoder_heads_are_named_by_their_attention(loaded) -> None:
    lm = loaded["bart"]
    with pytest.raises(mhsa.InputError, match=r"There is no head L0H1.*E0H0 to C1H3"):
        mhsa.ablate(SOURCE, ["L0H1"], model=lm, text_pair=TARGET)
    with pytest.raises(mhsa.InputError, match=r"There is no head C2H0"):
        mhsa.ablate(SOURCE, ["C2H0"], model=lm, text_pair=TARGET)
    with pytest.raises(mhsa.InputError, match="'lm-loss'"):
        mhsa.ablate(SOURCE, ["C0H1"], model=lm, text_pair=TARGET, target="embedding")


def test_the_walk_through_shows_an_encoder_layer_and_composition_is_refused(loaded) -> None:
    from mhsa.analysis.classroom import walkthrough

    lm = loaded["bart"]
    walk = walkthrough(SOURCE, model=lm, layer=1)
    r = mhsa.attend(SOURCE, model=lm, text_pair=TARGET, engine="mhsa")
    np.testing.assert_allclose(walk.step("probabilities").value[0], r.attention[1], atol=1e-6)
    with pytest.raises(mhsa.InputError, match="choose 0 to 1"):  # the encoder's layers only
        walkthrough(SOURCE, model=lm, layer=2)
    with pytest.raises(mhsa.UnsupportedModelError, match="encoder-decoder"):
        mhsa.analysis.head_composition(lm, kind="K")


def test_cli_attend_verify_reports_every_attention(loaded, capsys) -> None:
    from mhsa.__main__ import main

    folder = loaded["marian"].name
    args = ["attend", SOURCE, "--pair", TARGET, "--model", folder, "--engine", "mhsa"]
    assert main([*args, "--verify", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for what in ("decoder attention per layer", "cross attention per layer", "encoder final"):
        line = next(s for s in lines if what in s)
        assert all(float(d) <= TOL for d in line.split(":")[1].split(","))


def test_knock_outs_of_a_generated_target_score_the_ids_the_model_chose(loaded) -> None:
    lm = loaded["bart"]
    g = mhsa.engine.generate_ids(SOURCE, model=lm, max_new_tokens=3)
    ids = torch.tensor([g.decoder_ids])  # its start token first
    with torch.no_grad():  # teacher forcing on what it wrote: inputs before, labels after
        enc = lm.tokenizer(SOURCE, return_tensors="pt")
        want = lm.head_model(**enc, decoder_input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
    a = mhsa.ablate(g, ["C0H1"], model=lm)
    assert a.intact_value == pytest.approx(float(want), abs=1e-5)
    assert abs(a.change) > 1e-6
    assert a.intact.decoder_tokens == lm.tokenizer.convert_ids_to_tokens(list(g.decoder_ids))


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_a_typed_target_is_the_models_teacher_forced_input_everywhere(loaded, kind) -> None:
    """The decoder tokens and attention shown, and the loss knock-outs score, all read the
    decoder input the model is trained on: the labels shifted right after the decoder start
    token (BART's ``shift_tokens_right``, T5's ``_shift_right``), not the tokenizer's ids."""
    from transformers.models.bart.modeling_bart import shift_tokens_right

    lm = loaded[kind]
    labels = lm.tokenizer(TARGET, return_tensors="pt")["input_ids"]
    config = lm.config
    if kind == "t5":
        forced = lm.head_model._shift_right(labels)
    else:
        forced = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
    assert forced[0, 0] == config.decoder_start_token_id and forced[0, 0] != labels[0, 0]
    r = mhsa.attend(SOURCE, text_pair=TARGET, model=lm)
    assert r.decoder_tokens == lm.tokenizer.convert_ids_to_tokens(forced[0].tolist())
    enc = lm.tokenizer(SOURCE, return_tensors="pt")
    with torch.no_grad():
        own = lm.head_model(**enc, decoder_input_ids=forced, output_attentions=True)
        loss = lm.head_model(**enc, labels=labels).loss
    np.testing.assert_allclose(r.decoder_attention[1], own.decoder_attentions[1][0], atol=1e-6)
    np.testing.assert_allclose(r.cross_attention[0], own.cross_attentions[0][0], atol=1e-6)
    a = mhsa.ablate(SOURCE, ["C0H1"], model=lm, text_pair=TARGET)
    assert a.intact_value == pytest.approx(float(loss), abs=1e-5)
    assert a.intact.decoder_tokens == r.decoder_tokens

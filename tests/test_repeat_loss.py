"""The loss on the repeat (importance target ``repeat-loss``): which tokens it scores, checked by
a plain loop over a hand-made sequence, and its value, checked against the toy induction model's
own eager forward with heads zeroed by hand and the cross-entropy summed in a loop."""

from __future__ import annotations

import math

import pytest
import torch

import mhsa
from mhsa.causal.metrics import induction_scored
from mhsa.examples import model_examples


def test_only_tokens_an_induction_head_can_predict_are_scored() -> None:
    # positions: 0 BOS, 1 a, 2 b, 3 c, 4 a, 5 b, 6 d, 7 b, 8 c
    ids = torch.tensor([[9, 1, 2, 3, 1, 2, 4, 2, 3]])
    # label k counts when x[k-1] was seen before and followed then by x[k]:
    # k=5 (a -> b seen at 1,2), k=8 (b -> c seen at 2,3); k=4 (c -> a: c never followed by a),
    # k=6 (b -> d: b followed by c before), k=7 (d new)
    expected = [False] * 9
    expected[5] = expected[8] = True
    assert induction_scored(ids)[0].tolist() == expected


def _repeat_loss_by_hand(model, ids: list[int], off: list[tuple[int, int]]) -> float:
    """The model's own forward with heads zeroed before its output projection; the mean
    cross-entropy over the positions a loop finds predictable."""
    d_head = model.config.hidden_size // model.config.num_attention_heads
    handles = []
    for layer, block in enumerate(model.model.layers):
        heads = [h for li, h in off if li == layer]

        def zero(_module, args, heads=heads):
            x = args[0].clone()
            for h in heads:
                x[..., h * d_head : (h + 1) * d_head] = 0
            return (x,)

        if heads:
            handles.append(block.self_attn.o_proj.register_forward_pre_hook(zero))
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
    finally:
        for handle in handles:
            handle.remove()
    losses = []
    for k in range(1, len(ids)):
        earlier = [j for j in range(k - 1) if ids[j] == ids[k - 1]]
        if any(ids[j + 1] == ids[k] for j in earlier):
            row = logits[k - 1]
            losses.append(float(torch.logsumexp(row, 0) - row[ids[k]]))
    return sum(losses) / len(losses)


@pytest.mark.slow
def test_the_repeat_loss_is_the_models_own_loss_on_the_repeated_tokens() -> None:
    from transformers import AutoModelForCausalLM

    lm = mhsa.load_model("toy:induction", device="cpu")
    text = model_examples("toy:induction")[0].text
    plain = AutoModelForCausalLM.from_pretrained(
        mhsa.training.toy_model_path("induction"), attn_implementation="eager"
    ).eval()
    ids = lm.tokenizer(text)["input_ids"]
    layer1 = [(1, h) for h in range(4)]
    a = mhsa.ablate(text, [f"L{li}H{h}" for li, h in layer1], model=lm, target="repeat-loss")
    intact = _repeat_loss_by_hand(plain, ids, [])
    ablated = _repeat_loss_by_hand(plain, ids, layer1)
    assert a.intact_value == pytest.approx(intact, abs=1e-4)
    assert a.ablated_value == pytest.approx(ablated, abs=1e-4)
    assert ablated > intact + 1  # the induction heads off: the repeat is broken
    # the whole text's loss counts the random first half too: not the same number
    whole = mhsa.ablate(text, [], model=lm, target="lm-loss").intact_value
    assert not math.isclose(whole, intact, abs_tol=0.1)


def test_the_repeat_loss_refuses_what_it_cannot_measure(minilm) -> None:
    with pytest.raises(mhsa.InputError, match="repeats itself"):
        mhsa.ablate("ba be bi bo bu", [], model="toy:induction", target="repeat-loss")
    with pytest.raises(mhsa.InputError, match="no language-model head"):
        mhsa.ablate("The cat sat.", [], model=minilm, target="repeat-loss")

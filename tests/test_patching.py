"""Activation and attribution patching (``mhsa.causal.patching``) against patching done by hand with
plain torch hooks on the transformers model itself (its own eager attention, not our module)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import mhsa
from mhsa.analysis import roles
from mhsa.causal import patching

TOY = Path(__file__).resolve().parent.parent / "data" / "toy" / "induction"

CLEAN, CORRUPTED = "the cat sat on the mat and the cat", "the dog sat on the mat and the cat"
#: a repeat, and the same with the symbol before the answer's first occurrence ("fu") replaced
TOY_TEXTS = ("ba ke mo di fu lo ba ke mo di", "ba ke mo ra fu lo ba ke mo di")


@pytest.fixture(scope="module")
def gpt2(tiny_gpt2_path: str) -> mhsa.engine.LoadedModel:
    return mhsa.load_model(tiny_gpt2_path, device="cpu")


@pytest.fixture(scope="module")
def llama(tiny_llama_path: str) -> mhsa.engine.LoadedModel:
    return mhsa.load_model(tiny_llama_path, device="cpu")  # grouped-query: 4 heads, 2 kv heads


@pytest.fixture(scope="module")
def toy() -> mhsa.engine.LoadedModel:
    if not TOY.is_dir():
        pytest.skip("the toy induction model is not in data/toy")
    return mhsa.load_model(str(TOY), device="cpu")


# --- patching by hand: forward hooks on the model's own modules --------------------------------


def _attention(lm: mhsa.engine.LoadedModel, layer: int) -> torch.nn.Module:
    """The model's own attention block of ``layer`` (GPT-2, Llama, BERT)."""
    model = lm.model
    if hasattr(model, "h"):
        return model.h[layer].attn
    if hasattr(model, "layers"):
        return model.layers[layer].self_attn
    return model.encoder.layer[layer].attention


def _site(lm: mhsa.engine.LoadedModel, layer: int, what: str) -> tuple[torch.nn.Module, bool, int]:
    """Where ``what`` of ``layer`` is in the model's own modules: ``(module, its input (True)
    or its output, offset of the activation's features in that tensor)``."""
    attn = _attention(lm, layer)
    d = lm.config.hidden_size
    if what == "z":  # the concatenated heads entering the output projection
        out = getattr(attn, "o_proj", None) or getattr(attn, "c_proj", None)
        return (out if out is not None else attn.output.dense), True, 0
    if hasattr(attn, "c_attn"):  # GPT-2: one fused projection, q | k | v
        return attn.c_attn, False, {"q": 0, "k": d, "v": 2 * d}[what]
    return getattr(attn, f"{what}_proj"), False, 0


def _hooked(
    lm: mhsa.engine.LoadedModel,
    layer: int,
    what: str,
    change: Callable[[torch.Tensor], torch.Tensor],
) -> torch.utils.hooks.RemovableHandle:
    """A hook on the model's own module that passes ``what``'s features of ``layer`` (``[T,
    features]``) through ``change``."""
    module, is_input, offset = _site(lm, layer, what)

    def apply(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        width = change.width  # type: ignore[attr-defined]
        y[0, :, offset : offset + width] = change(x[0, :, offset : offset + width])
        return y

    if is_input:
        return module.register_forward_pre_hook(lambda _m, args: (apply(args[0]), *args[1:]))
    return module.register_forward_hook(lambda _m, _a, out: apply(out))


def _metric(lm: mhsa.engine.LoadedModel, ids: dict, answer: str = "", wrong: str = "", ref=None):
    """The metric on the plain model: logit difference at the last position, or the cosine of
    the mean-pooled embedding with ``ref``; and the embedding."""
    if lm.lm_head == "causal":
        logits = lm.head_model(**ids).logits[0, -1]
        a, w = (
            lm.tokenizer(" " + t, add_special_tokens=False)["input_ids"][0] for t in (answer, wrong)
        )
        return logits[a] - logits[w], None
    hidden = lm.model(**ids).last_hidden_state[0]
    pooled = hidden.mean(0)
    return (F.cosine_similarity(pooled, ref, dim=0) if ref is not None else None), pooled


def _capture(
    lm: mhsa.engine.LoadedModel, ids: dict, layer: int, what: str, width: int
) -> torch.Tensor:
    """``what``'s features of ``layer`` in a plain forward pass, ``[T, width]``."""
    seen: list[torch.Tensor] = []

    def keep(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.detach().clone())
        return x

    keep.width = width  # type: ignore[attr-defined]
    handle = _hooked(lm, layer, what, keep)
    try:
        (lm.head_model or lm.model)(**ids)
    finally:
        handle.remove()
    return seen[0]


def _sizes(lm: mhsa.engine.LoadedModel, what: str) -> tuple[int, int]:
    """``(heads patched per layer, d_head)``."""
    heads = lm.config.num_attention_heads
    d_head = lm.config.hidden_size // heads
    kv = getattr(lm.config, "num_key_value_heads", None) or heads
    return (kv if what in ("k", "v") else heads), d_head


def _by_hand(
    lm: mhsa.engine.LoadedModel,
    what: str,
    *,
    answer: str = "",
    wrong: str = "",
    position: int | None = None,
    layers: list[int] | None = None,
    texts: tuple[str, str] = (CLEAN, CORRUPTED),
) -> dict[tuple[int, int], float]:
    """Activation patching of every head done by hand: a clean pass captures the activation, a
    corrupted pass per head replaces that head's features (at ``position``, or everywhere)."""
    tok = lm.tokenizer
    clean, corrupted = (tok(t, return_tensors="pt") for t in texts)
    heads, d_head = _sizes(lm, what)
    out = {}
    with torch.no_grad():
        ref = None if lm.lm_head == "causal" else _metric(lm, clean)[1]
        for layer in layers if layers is not None else range(lm.config.num_hidden_layers):
            width = heads * d_head
            cache = _capture(lm, clean, layer, what, width)
            for h in range(heads):
                cols = slice(h * d_head, (h + 1) * d_head)
                rows = slice(None) if position is None else slice(position, position + 1)

                def patch(x: torch.Tensor, cols=cols, rows=rows, cache=cache) -> torch.Tensor:
                    y = x.clone()
                    y[rows, cols] = cache[rows, cols]
                    return y

                patch.width = width  # type: ignore[attr-defined]
                handle = _hooked(lm, layer, what, patch)
                try:
                    out[(layer, h)] = float(_metric(lm, corrupted, answer, wrong, ref)[0])
                finally:
                    handle.remove()
    return out


def _assert_matches(table: pd.DataFrame, hand: dict[tuple[int, int], float]) -> None:
    assert len(hand) == len(table)
    ours = table.set_index(["layer", "head"])["patched"]
    for (layer, head), value in hand.items():
        assert abs(ours[(layer, head)] - value) <= 1e-4, (layer, head, ours[(layer, head)], value)
    clean, corrupted = table.attrs["clean"], table.attrs["corrupted"]
    expected = (np.array([hand[k] for k in ours.index]) - corrupted) / (clean - corrupted)
    np.testing.assert_allclose(table["effect"].to_numpy(), expected, atol=1e-4)


# --- (a) exact patching of the head outputs ----------------------------------------------------


def test_patch_heads_equals_hand_patching_on_gpt2(gpt2: mhsa.engine.LoadedModel) -> None:
    table = patching.patch_heads(
        CLEAN, CORRUPTED, model=gpt2, answer="mat", wrong="sat", batch_size=3
    )
    assert list(table.index) == [f"L{i}H{h}" for i in range(2) for h in range(4)]
    assert table.attrs["clean_tokens"] != table.attrs["corrupted_tokens"]
    hand = _by_hand(gpt2, "z", answer="mat", wrong="sat")
    _assert_matches(table, hand)
    # the runs themselves, by hand
    tok = gpt2.tokenizer
    with torch.no_grad():
        m_clean = float(_metric(gpt2, tok(CLEAN, return_tensors="pt"), "mat", "sat")[0])
        m_corr = float(_metric(gpt2, tok(CORRUPTED, return_tensors="pt"), "mat", "sat")[0])
    assert abs(table.attrs["clean"] - m_clean) <= 1e-4
    assert abs(table.attrs["corrupted"] - m_corr) <= 1e-4
    assert np.ptp(table["patched"]) > 1e-3  # the heads differ: a real comparison


def test_patch_heads_equals_hand_patching_on_the_toy_llama(toy: mhsa.engine.LoadedModel) -> None:
    table = patching.patch_heads(*TOY_TEXTS, model=toy, answer="fu", wrong="lo")
    _assert_matches(table, _by_hand(toy, "z", answer="fu", wrong="lo", texts=TOY_TEXTS))


@pytest.mark.slow
def test_patch_heads_on_an_encoder_measures_cosine_to_the_clean_embedding(
    minilm: mhsa.engine.LoadedModel,
) -> None:
    table = patching.patch_heads(CLEAN, CORRUPTED, model=minilm)
    assert table.attrs["clean"] == pytest.approx(1.0, abs=1e-5)
    assert table.attrs["corrupted"] < 0.99
    hand = _by_hand(minilm, "z", layers=[0, 5])
    _assert_matches(table[table["layer"].isin([0, 5])], hand)


# --- (b) queries, keys, values; per position -----------------------------------------------------


def test_patching_queries_and_keys_equals_hand_patching_before_rotary(
    toy: mhsa.engine.LoadedModel,
) -> None:
    for what in ("q", "k"):
        table = patching.patch_heads(*TOY_TEXTS, model=toy, answer="fu", wrong="lo", what=what)
        assert table.attrs["what"] == what
        _assert_matches(table, _by_hand(toy, what, answer="fu", wrong="lo", texts=TOY_TEXTS))


def test_values_of_gpt2_and_keys_per_kv_head_of_grouped_query_llama(
    gpt2: mhsa.engine.LoadedModel, llama: mhsa.engine.LoadedModel
) -> None:
    table = patching.patch_heads(CLEAN, CORRUPTED, model=gpt2, answer="mat", wrong="sat", what="v")
    _assert_matches(table, _by_hand(gpt2, "v", answer="mat", wrong="sat"))
    keys = patching.patch_heads(CLEAN, CORRUPTED, model=llama, answer="mat", wrong="sat", what="k")
    assert keys.attrs["kv_heads"] is True
    assert sorted(set(keys["head"])) == [0, 1]  # 2 key/value heads serve the 4 query heads
    _assert_matches(keys, _by_hand(llama, "k", answer="mat", wrong="sat"))


def test_patch_positions_equals_hand_patching_per_position(gpt2: mhsa.engine.LoadedModel) -> None:
    table = patching.patch_positions(
        CLEAN, CORRUPTED, 1, model=gpt2, answer="mat", wrong="sat", batch_size=5
    )
    n = len(table.attrs["clean_tokens"])
    assert len(table) == 4 * n
    assert table["token"].tolist()[:n] == table.attrs["clean_tokens"]
    for position in (2, n - 1):
        hand = _by_hand(gpt2, "z", answer="mat", wrong="sat", position=position, layers=[1])
        at = table[table["position"] == position]
        _assert_matches(at.set_axis([f"L1H{h}" for h in at["head"]]), hand)
    # positions where the two texts agree, before the first difference, change nothing
    # in a causal model: the clean and corrupted activations there are the same
    first = table[table["position"] < 2]
    np.testing.assert_allclose(first["effect"], 0.0, atol=1e-5)


def test_patching_the_pattern_of_every_head_and_position_adds_up(
    toy: mhsa.engine.LoadedModel,
) -> None:
    """Patching one head's pattern at every query row at once (all positions) is the same
    intervention as patch_heads(what="pattern"); per row it is a finer one."""
    whole = patching.patch_heads(*TOY_TEXTS, model=toy, answer="fu", wrong="lo", what="pattern")
    rows = patching.patch_positions(
        *TOY_TEXTS, 1, model=toy, answer="fu", wrong="lo", what="pattern"
    )
    last = rows[rows["position"] == rows["position"].max()].set_index("head")["patched"]
    # layer 1 is the last layer: only its last query row reaches the last position's logits
    for head in range(4):
        assert last[head] == pytest.approx(whole.loc[f"L1H{head}", "patched"], abs=1e-4)
    earlier = rows[rows["position"] < rows["position"].max()]
    np.testing.assert_allclose(earlier["effect"], 0.0, atol=1e-5)


# --- (c) attribution patching --------------------------------------------------------------------


def _attribution_by_hand(lm: mhsa.engine.LoadedModel, answer: str, wrong: str) -> np.ndarray:
    """grad(metric at corrupted) . (clean - corrupted) per head, with autograd on the plain
    model: a zero added to every layer's concatenated heads, one backward pass."""
    tok = lm.tokenizer
    clean, corrupted = (tok(t, return_tensors="pt") for t in (CLEAN, CORRUPTED))
    heads, d_head = _sizes(lm, "z")
    width = heads * d_head
    layers = lm.config.num_hidden_layers
    with torch.no_grad():
        caches = [
            _capture(lm, ids, layer, "z", width)
            for ids in (clean, corrupted)
            for layer in range(layers)
        ]
    deltas, handles = [], []
    for layer in range(layers):
        delta = torch.zeros(caches[0].shape, requires_grad=True)

        def shift(x: torch.Tensor, delta=delta) -> torch.Tensor:
            return x + delta

        shift.width = width  # type: ignore[attr-defined]
        deltas.append(delta)
        handles.append(_hooked(lm, layer, "z", shift))
    try:
        value = _metric(lm, corrupted, answer, wrong)[0]
        grads = torch.autograd.grad(value, deltas)
    finally:
        for h in handles:
            h.remove()
    out = np.zeros((layers, heads))
    for layer in range(layers):
        diff = caches[layer] - caches[layers + layer]
        per = (grads[layer] * diff).reshape(-1, heads, d_head).sum((0, 2))
        out[layer] = per.numpy()
    return out


@pytest.mark.slow
def test_attribution_patching_equals_hand_autograd(gpt2: mhsa.engine.LoadedModel) -> None:
    table = patching.attribution_patching(CLEAN, CORRUPTED, model=gpt2, answer="mat", wrong="sat")
    hand = _attribution_by_hand(gpt2, "mat", "sat")
    np.testing.assert_allclose(table["attribution"].to_numpy().reshape(2, 4), hand, atol=1e-4)
    assert np.abs(hand).max() > 1e-3
    diff = table.attrs["clean"] - table.attrs["corrupted"]
    np.testing.assert_allclose(table["effect"], table["attribution"] / diff, rtol=1e-9)


def test_attribution_approximates_exact_patching_on_the_toy(toy: mhsa.engine.LoadedModel) -> None:
    exact = patching.patch_heads(*TOY_TEXTS, model=toy, answer="fu", wrong="lo")
    approx = patching.attribution_patching(*TOY_TEXTS, model=toy, answer="fu", wrong="lo")
    r = patching.patching_correlation(exact, approx)
    x, y = exact["effect"].to_numpy(), approx["effect"].to_numpy()
    assert r == pytest.approx(float(np.corrcoef(x, y)[0, 1]))
    assert r > 0.5  # a first-order estimate: it follows exact patching, not exactly


# --- (d) the toy induction model ----------------------------------------------------------------


@pytest.mark.slow
def test_patching_a_broken_repeat_singles_out_the_previous_token_and_induction_heads(
    toy: mhsa.engine.LoadedModel,
) -> None:
    """Clean: symbols, then the same symbols again up to a point (the next one is the answer).
    Corrupted: the symbol before the answer's first occurrence replaced, so no earlier token
    says what came after the current one. Restoring the layer-0 head that writes "my previous
    token was ..." into the answer's first position, or the layer-1 head that reads it and
    copies the answer, restores the prediction."""
    symbols = sorted(w for w in toy.tokenizer.get_vocab() if not w.startswith("["))
    rng = np.random.default_rng(2)
    effects, repeated = [], []
    for _ in range(8):
        half = list(rng.choice(symbols, size=12, replace=False))
        unused = [s for s in symbols if s not in half]
        k = 8  # the answer is half[k]; the repeat breaks at half[k - 1]'s first occurrence
        broken = [*half[: k - 1], unused[0], *half[k:]]
        table = patching.patch_heads(
            " ".join(half + half[:k]),
            " ".join(broken + half[:k]),
            model=toy,
            answer=half[k],
            wrong=unused[1],
        )
        assert table.attrs["clean"] > table.attrs["corrupted"] + 3  # the repeat is what it uses
        effects.append(table["effect"])
        repeated.append(" ".join(half + half))
    effect = pd.concat(effects, axis=1).mean(axis=1)
    previous = roles.detect_heads(repeated, "previous token", model=toy)["score"]
    induction = roles.detect_heads(repeated, "induction", model=toy)["score"]
    prev_head = previous[previous.index.str.startswith("L0")].idxmax()
    induction_head = induction[induction.index.str.startswith("L1")].idxmax()
    top = effect.sort_values(ascending=False)
    assert set(top.index[:2]) == {prev_head, induction_head}
    assert top.iloc[1] > 1.2 * top.iloc[2]
    others_in_layer_0 = effect[effect.index.str.startswith("L0") & (effect.index != prev_head)]
    assert others_in_layer_0.abs().max() < 0.3 * effect[prev_head]


# --- (e) errors ---------------------------------------------------------------------------------


def test_errors_say_what_to_do(
    gpt2: mhsa.engine.LoadedModel, minilm: mhsa.engine.LoadedModel
) -> None:
    with pytest.raises(
        mhsa.InputError, match=r"clean text has 11 tokens and the corrupted text 12"
    ):
        patching.patch_heads(CLEAN, CORRUPTED + " now", model=gpt2, answer="mat", wrong="sat")
    with pytest.raises(mhsa.InputError, match=r"'unbelievably'.*gives 5.*\['un', '##bel"):
        patching.patch_heads(CLEAN, CORRUPTED, model=gpt2, answer="unbelievably", wrong="sat")
    with pytest.raises(mhsa.InputError, match="same token"):
        patching.patch_heads(CLEAN, CORRUPTED, model=gpt2, answer="mat", wrong=" mat ")
    with pytest.raises(mhsa.InputError, match="give both answer= and wrong="):
        patching.patch_heads(CLEAN, CORRUPTED, model=gpt2, answer="mat")
    with pytest.raises(mhsa.InputError, match="for causal language models"):
        patching.patch_heads(CLEAN, CORRUPTED, model=minilm, answer="mat", wrong="sat")
    with pytest.raises(mhsa.InputError, match="needs text_pair"):
        patching.patch_heads(CLEAN, CORRUPTED, model=minilm, target="similarity")
    with pytest.raises(mhsa.InputError, match="Unknown activation 'out'"):
        patching.patch_heads(CLEAN, CORRUPTED, model=minilm, what="out")
    with pytest.raises(mhsa.InputError, match="same metric"):
        patching.patch_heads(CLEAN, CLEAN, model=minilm)
    with pytest.raises(mhsa.InputError, match="no layer 6"):
        patching.patch_positions(CLEAN, CORRUPTED, 6, model=minilm)
    with pytest.raises(mhsa.InputError, match="batch_size"):
        patching.patch_heads(CLEAN, CORRUPTED, model=minilm, batch_size=0)


def test_similarity_target_measures_cosine_to_the_second_sentence(
    minilm: mhsa.engine.LoadedModel,
) -> None:
    pair = "a kitten rested on the rug"
    table = patching.patch_heads(
        CLEAN, CORRUPTED, model=minilm, target="similarity", text_pair=pair
    )
    tok = minilm.tokenizer
    with torch.no_grad():
        _, ref = _metric(minilm, tok(pair, return_tensors="pt"))
        m_clean = _metric(minilm, tok(CLEAN, return_tensors="pt"), ref=ref)[0]
    assert table.attrs["clean"] == pytest.approx(float(m_clean), abs=1e-5)


@pytest.mark.slow
def test_one_driver_with_thin_entry_points(toy: mhsa.engine.LoadedModel) -> None:
    """``patch_heads`` and ``patch_positions`` are partials of ``generic_activation_patch``
    (issue 37.4, as TransformerLens's ``get_act_patch_*``); one layer's heads alone give that
    layer's rows of the whole table, each head patched by hand as above."""
    assert patching.patch_heads.func is patching.generic_activation_patch
    assert patching.patch_positions.func is patching.generic_activation_patch
    options = {"model": toy, "answer": "fu", "wrong": "lo"}
    one = patching.patch_heads(*TOY_TEXTS, 1, **options)
    assert list(one.index) == [f"L1H{h}" for h in range(len(one))] and set(one["layer"]) == {1}
    hand = _by_hand(toy, "z", answer="fu", wrong="lo", texts=TOY_TEXTS, layers=[1])
    _assert_matches(one, hand)
    with pytest.raises(mhsa.InputError, match="needs a layer"):
        patching.generic_activation_patch(*TOY_TEXTS, index="positions", **options)
    with pytest.raises(mhsa.InputError, match="Unknown index 'cells'"):
        patching.generic_activation_patch(*TOY_TEXTS, index="cells", **options)
    with pytest.raises(mhsa.InputError, match="There is no layer 7"):
        patching.patch_heads(*TOY_TEXTS, 7, **options)

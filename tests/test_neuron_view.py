"""The neuron view (``result.show("neuron")``, Vig 2019) and ``attend(qk=True)``.

The other side of every comparison is the plain transformers model run by hand: forward hooks
on its query and key ``Linear`` modules (and, for the Llama-style toy model, transformers' own
``apply_rotary_pos_emb`` with the cos/sin its rotary module gave), scores and softmax in
float64 here. Its behaviour in a browser: tests/browser/test_notebook_browser.py.
"""

from __future__ import annotations

import base64
import json
import math
import re

import numpy as np
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import mhsa

TEXT = "The cat sat on the mat, and the cat slept."
TOY_TEXT = "ba be bi bo du ba be bi bo du"


def _embedded(html: str) -> dict:
    found = re.search(r'<script type="application/json" class="mhsa-data">(.*?)</script>', html)
    assert found is not None
    return json.loads(found.group(1))


def _decoded(data: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The view's weights ``[L, H, m, n]``, q ``[L, H, m, d]`` and k ``[L, H, n, d]``."""
    shape = (data["L"], data["H"])
    w = np.frombuffer(base64.b64decode(data["w"]), "<u2").reshape(*shape, data["m"], data["n"])
    q = np.frombuffer(base64.b64decode(data["q"]), "<f4").reshape(*shape, data["m"], data["d"])
    k = np.frombuffer(base64.b64decode(data["kv"]), "<f4").reshape(*shape, data["n"], data["d"])
    return w / 65535.0, q.astype(np.float64), k.astype(np.float64)


def _softmax(scores: np.ndarray, causal: bool) -> np.ndarray:
    if causal:
        scores = np.where(np.triu(np.ones(scores.shape, bool), 1), -np.inf, scores)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _hooked(lm: mhsa.engine.LoadedModel, text: str, layer: int, q_mod, k_mod, rotary=None):
    """The model's own q and k of ``layer`` ``[H, T, Dh]`` from forward hooks (rotated with
    transformers' ``apply_rotary_pos_emb`` where the model has rotary positions)."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        q_mod.register_forward_hook(lambda _m, _a, out: seen.__setitem__("q", out.detach())),
        k_mod.register_forward_hook(lambda _m, _a, out: seen.__setitem__("k", out.detach())),
    ]
    if rotary is not None:
        hooks.append(rotary.register_forward_hook(lambda _m, _a, out: seen.__setitem__("cs", out)))
    inputs = lm.tokenizer(text, return_tensors="pt")
    try:
        with torch.no_grad():
            lm.model(**inputs)
    finally:
        for h in hooks:
            h.remove()
    heads = lm.facts()["heads"]

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.view(1, x.shape[1], heads, -1).transpose(1, 2).double()  # (1, H, T, Dh)

    q, k = split(seen["q"]), split(seen["k"])
    if rotary is not None:
        cos, sin = seen["cs"]
        q, k = apply_rotary_pos_emb(q, k, cos.double(), sin.double())
    return q[0].numpy(), k[0].numpy(), inputs["input_ids"].shape[1]


@pytest.mark.parametrize("engine", ["transformers", "mhsa"])
def test_minilm_neuron_view_holds_the_models_vectors_and_weights(minilm, engine: str) -> None:
    layer, head = 3, 7
    result = mhsa.attend(TEXT, model=minilm, engine=engine, qk=True)
    data = _embedded(result.show("neuron", layer=layer, head=head).html)
    w, q, k = _decoded(data)
    self_attn = minilm.model.encoder.layer[layer].attention.self
    hq, hk, n = _hooked(minilm, TEXT, layer, self_attn.query, self_attn.key)
    assert (data["m"], data["n"], data["d"]) == (n, n, 32) and data["causal"] is False
    assert data["scale"] == pytest.approx(1 / math.sqrt(32))
    np.testing.assert_allclose(q[layer, head], hq[head], atol=2e-5)
    np.testing.assert_allclose(k[layer, head], hk[head], atol=2e-5)
    by_hand = _softmax(hq[head] @ hk[head].T / math.sqrt(32), causal=False)
    quantum = 0.5 / 65535 + 1e-6
    np.testing.assert_allclose(w[layer, head], by_hand, atol=quantum + 1e-5)
    np.testing.assert_allclose(result.attention[layer, head], by_hand, atol=1e-5)
    # every head of every layer: the embedded weights are the softmax of the embedded vectors
    np.testing.assert_allclose(
        w, _softmax(np.einsum("lhqd,lhkd->lhqk", q, k) * data["scale"], False), atol=3e-5
    )


def test_toy_induction_neuron_view_masks_later_keys() -> None:
    toy = mhsa.load_model("toy:induction", device="cpu")
    result = mhsa.attend(TOY_TEXT, model=toy, qk=True)
    data = _embedded(result.show("neuron", layer=1).html)
    w, q, k = _decoded(data)
    assert data["causal"] is True
    for layer in range(2):
        attn = toy.model.layers[layer].self_attn
        hq, hk, _ = _hooked(toy, TOY_TEXT, layer, attn.q_proj, attn.k_proj, toy.model.rotary_emb)
        d = hq.shape[-1]
        assert data["scale"] == pytest.approx(1 / math.sqrt(d))
        for head in range(data["H"]):
            np.testing.assert_allclose(q[layer, head], hq[head], atol=2e-5)
            np.testing.assert_allclose(k[layer, head], hk[head], atol=2e-5)
            by_hand = _softmax(hq[head] @ hk[head].T / math.sqrt(d), causal=True)
            np.testing.assert_allclose(w[layer, head], by_hand, atol=1e-5 + 0.5 / 65535)
            np.testing.assert_allclose(result.attention[layer, head], by_hand, atol=1e-5)
    assert np.triu(w, 1).max() == 0.0  # the masked keys weigh nothing


def test_a_selection_keeps_the_vectors_of_its_heads(minilm) -> None:
    whole = mhsa.attend("The cat sat.", model=minilm, qk=True)
    part = mhsa.attend("The cat sat.", model=minilm, layers=[2, 4], heads=[1, 5], qk=True)
    assert part.q.shape == (2, 2, whole.num_tokens, 32)
    np.testing.assert_allclose(part.q, whole.q[[2, 4]][:, [1, 5]], atol=1e-5)
    np.testing.assert_allclose(part.k, whole.k[[2, 4]][:, [1, 5]], atol=1e-5)
    data = _embedded(part.show("neuron", layer=1, head=1).html)
    assert data["layers"] == ["L2", "L4"] and data["heads"] == ["H1", "H5"]


def test_vectors_are_kept_only_when_asked_and_travel_with_the_result(minilm, tmp_path) -> None:
    plain = mhsa.attend("The cat sat.", model=minilm)
    assert plain.q is None and plain.k is None
    with pytest.raises(mhsa.InputError, match=r"qk=True"):
        plain.show("neuron")
    result = mhsa.attend("The cat sat.", model=minilm, qk=True)
    loaded = mhsa.AttentionResult.load(result.save(tmp_path / "r.npz"))
    np.testing.assert_array_equal(loaded.q, result.q)
    assert loaded.qk_scale == result.qk_scale
    words = result.to_words()  # a word has no query vector of its own
    assert words.q is None and words.k is None
    with pytest.raises(ValueError, match="q must be"):
        mhsa.AttentionResult(**{**vars(result), "q": result.q[:, :, :2]})


def test_weights_from_elsewhere_say_how_to_get_vectors() -> None:
    a = np.full((1, 2, 3, 3), 1 / 3)
    result = mhsa.from_attention(a, ["<b>", "b", "c"])
    with pytest.raises(mhsa.InputError, match=r"from_attention hold weights only.*qk=True"):
        result.show("neuron")
    assert "mhsa-data" in result._repr_html_()  # the heads view is unaffected


def test_neuron_view_is_self_contained_and_sized(minilm, monkeypatch) -> None:
    result = mhsa.attend("<b>bold</b> & done", model=minilm, qk=True)
    html = result.show("neuron").html
    assert set(re.findall(r"https?://[^\s\"']+", html)) <= {"http://www.w3.org/2000/svg"}
    for fetch in ("src=", "href=", "@import", "fetch(", "XMLHttpRequest"):
        assert fetch not in html, fetch
    assert "<b>bold" not in html and _embedded(html)["keys"] == result.tokens
    vectors = result.q.nbytes + result.k.nbytes
    monkeypatch.setattr("mhsa.plots.notebook.MAX_VIEW_BYTES", vectors)  # weights tip it over
    with pytest.raises(mhsa.InputError, match="too much for one view"):
        result.show("neuron")
    result.show("heads")  # the vectors count for the neuron view only


def test_models_whose_scores_are_not_q_dot_k_are_refused(tiny_t5_path) -> None:
    with pytest.raises(mhsa.UnsupportedModelError, match="encoder-decoder"):
        mhsa.attend("a b c", model=tiny_t5_path, text_pair="a b", qk=True)

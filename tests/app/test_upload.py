"""The Overview page's upload of attention computed elsewhere (issue 50), under AppTest: the
file's heads, their statistics, head similarity, detection scores and rollout are shown, each
equal to the numbers computed here by hand from the array; a bad or hostile file is one literal
message and the rest of the page still works."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from tests.app.test_importance_page import decode
from tests.app.test_pages import ROOT

pytestmark = pytest.mark.slow
TOKENS = ["[CLS]", "the", "cat", "sat", "[SEP]"]


def _attention() -> np.ndarray:
    a = np.random.default_rng(3).random((2, 3, 5, 5)) ** 3
    return a / a.sum(-1, keepdims=True)


def _overview_with(name: str, data: bytes) -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages" / "0_Overview.py"), default_timeout=120).run()
    at.file_uploader[0].set_value((name, data, "application/octet-stream"))
    return at.run()


def test_an_npz_shows_its_heads_and_their_statistics() -> None:
    a = _attention()
    out = io.BytesIO()
    np.savez(out, attention=a, tokens=np.array(TOKENS))
    at = _overview_with("mine.npz", out.getvalue())
    assert not at.exception and not at.error
    assert any("2 layers x 3 heads over 5 tokens" in c.value for c in at.caption)
    stats = next(d.value for d in at.dataframe if "to_self" in d.value.columns)
    by_hand = [np.trace(a[li, h]) / 5 for li in range(2) for h in range(3)]  # mean of A[i, i]
    np.testing.assert_allclose(stats["to_self"].to_numpy(), by_hand, atol=1e-6)
    assert any("Tokens as the model sees them" in s.value for s in at.subheader)  # page goes on


def test_a_hostile_pt_is_refused_in_one_literal_message(tmp_path) -> None:
    out = io.BytesIO()
    torch.save({"attention": torch.ones(1, 1, 2, 2) / 2, "tokens": ["a", "b"], "x": Path0()}, out)
    at = _overview_with("[click](http://evil.example).pt", out.getvalue())
    assert not at.exception
    (message,) = [e.value for e in at.error]
    assert "could not be read as a tensor file" in message
    assert "\\[click\\]" in message  # the name shown as text, not a link
    assert any("Tokens as the model sees them" in s.value for s in at.subheader)


class Path0:
    """Any object: ``weights_only`` refuses to build it."""


def _charts(at: AppTest) -> dict[str, dict]:
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return {s["layout"]["title"]["text"].split(" (")[0]: s for s in specs}


def _js_by_hand(p: np.ndarray, q: np.ndarray) -> float:
    """Clark et al.'s divergence of two heads: JS (natural log) of each query row, smoothed
    0.999 A + 0.001 / n, summed over rows."""
    n = p.shape[-1]
    p, q = 0.999 * p + 0.001 / n, 0.999 * q + 0.001 / n
    m = (p + q) / 2
    return float((0.5 * (p * np.log(p / m)).sum(-1) + 0.5 * (q * np.log(q / m)).sum(-1)).sum())


def test_an_upload_gets_similarity_roles_and_rollout_from_its_array() -> None:
    tokens = ["[CLS]", "the", "<b>cat", "the", "<b>cat", "[SEP]"]
    a = np.random.default_rng(5).random((2, 3, 6, 6)) ** 3
    a /= a.sum(-1, keepdims=True)
    out = io.BytesIO()
    np.savez(out, attention=a, tokens=np.array(tokens))
    at = _overview_with("mine.npz", out.getvalue())
    assert not at.exception and not at.error
    assert [t.label for t in at.tabs] == [
        "Heads",
        "Statistics",
        "Head similarity",
        "Head roles",
        "Rollout",
    ]
    charts = _charts(at)
    heads = [(li, h) for li in range(2) for h in range(3)]

    similarity = charts["Head divergence"]["data"][0]
    order = [label.split(" #")[0] for label in similarity["x"]]
    shown = decode(similarity["z"]).astype(float)
    for i, u in enumerate(order):
        for j, v in enumerate(order):
            lu, hu = heads[[f"L{li}H{h}" for li, h in heads].index(u)]
            lv, hv = heads[[f"L{li}H{h}" for li, h in heads].index(v)]
            assert shown[i, j] == pytest.approx(_js_by_hand(a[lu, hu], a[lv, hv]), abs=1e-4)

    previous, duplicate, induction = (
        decode(d["z"]).astype(float) for d in charts["Detection scores"]["data"]
    )
    n = len(tokens)
    prev = np.eye(n, k=-1)  # query i on key i - 1
    dup = np.zeros((n, n))
    dup[3, 1] = dup[4, 2] = 1  # "the" and "<b>cat" seen before (equal strings: one token)
    ind = np.zeros((n, n))
    ind[3, 2] = ind[4, 3] = 1  # the token after each earlier occurrence
    for pattern, drawn in ((prev, previous), (dup, duplicate), (ind, induction)):
        by_hand = (a * pattern).sum((-1, -2)) / a.sum((-1, -2))  # "mul"
        np.testing.assert_allclose(drawn, by_hand, atol=1e-6)

    roll = decode(charts["Attention rollout through layer 1"]["data"][0]["z"]).astype(float)
    by_hand = np.eye(n)
    for layer in range(2):
        step = a[layer].mean(0) + np.eye(n)
        by_hand = (step / step.sum(-1, keepdims=True)) @ by_hand
    np.testing.assert_allclose(roll, by_hand, atol=1e-6)
    assert "&lt;b&gt;cat #2" in charts["Attention rollout through layer 1"]["data"][0]["x"]

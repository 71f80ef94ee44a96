"""The Head importance page and the Heads page's knock-outs through AppTest: every method and
target, the values on the figures against the library, state in the URL, errors."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import mhsa
from tests.hostile import rendered

ROOT = Path(__file__).resolve().parents[2]
CAT = "The cat sat on the mat."
PAIR = "A cat was sitting on the rug."


def run(page: str, **query: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / page), default_timeout=180)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def charts(at: AppTest) -> dict[str, dict]:
    out = {}
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        # a long title wraps (``mhsa.plots.common.title_text``): keyed as it reads, one line
        out[spec["layout"]["title"]["text"].replace(" <br>", " ")] = spec
    return out


def decode(z) -> np.ndarray:
    """A plotly array as the browser gets it (binary-encoded typed array, or a list)."""
    if isinstance(z, dict):
        raw = np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"]))
        shape = z.get("shape")
        return raw.reshape([int(s) for s in str(shape).split(",")]) if shape else raw
    return np.asarray(z, dtype=float)


def importance_grid(at: AppTest) -> np.ndarray:
    spec = next(s for t, s in charts(at).items() if t.startswith("Importance of each head"))
    return decode(spec["data"][0]["z"]).astype(float)


@pytest.mark.parametrize(
    ("method", "target", "items"),
    [
        ("ablation", "embedding", [CAT]),
        ("ablation", "similarity", [(CAT, PAIR)]),
        ("gradient", "similarity", [(CAT, PAIR)]),
    ],
)
@pytest.mark.slow
def test_importance_map_shows_the_librarys_values(method, target, items, tiny_bert) -> None:
    # the tiny BERT (2 layers of 4 heads): the page against the library, not the model, is tested
    link = {"model": tiny_bert, "method": method, "target": target, "pair": PAIR}
    at = run("pages/7_Head_importance.py", **link)
    assert not at.exception and not at.error, [e.value for e in at.error]
    model = mhsa.load_model(tiny_bert, device="cpu")
    expected = mhsa.causal.head_importance(items, model=model, method=method, target=target)
    grid = importance_grid(at)
    np.testing.assert_allclose(grid, expected["importance"].to_numpy().reshape(2, 4), rtol=1e-5)
    titles = list(charts(at))
    assert any(t.startswith("Pruning curve") for t in titles)
    assert "Importance against confidence" in titles
    curve = charts(at)[next(t for t in titles if t.startswith("Pruning curve"))]
    assert [trace["name"] for trace in curve["data"]] == ["importance order", "random order"]
    assert any(f"method: {method}" in c.value for c in at.caption)
    downloads = [b.proto.label for b in at.get("download_button")]
    assert "Download importance (.csv)" in downloads
    assert "Download the pruning curve (.csv)" in downloads


@pytest.mark.slow
def test_gradient_of_the_embedding_says_why_and_the_page_recovers() -> None:
    at = run("pages/7_Head_importance.py", method="gradient")
    assert not at.exception
    assert "zero at the intact model" in at.error[0].value
    at.radio(key="method").set_value("ablation").run()
    assert not at.error and importance_grid(at).max() > 0


def test_lm_loss_needs_a_language_model_head() -> None:
    at = run("pages/7_Head_importance.py", target="lm-loss")
    assert not at.exception
    assert "no language-model head" in rendered(at.error[0].value)[0]


@pytest.mark.parametrize("method", ["ablation", "gradient"])
def test_lm_loss_of_a_decoder_with_its_head(method, tiny_gpt2_path, monkeypatch) -> None:
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", tiny_gpt2_path)
    at = run("pages/7_Head_importance.py", model=tiny_gpt2_path, method=method, target="lm-loss")
    assert not at.exception and not at.error, [e.value for e in at.error]
    lm = mhsa.load_model(tiny_gpt2_path, device="cpu")
    expected = mhsa.causal.head_importance([CAT], model=lm, method=method, target="lm-loss")
    np.testing.assert_allclose(
        importance_grid(at), expected["importance"].to_numpy().reshape(2, 4), rtol=1e-4, atol=1e-7
    )
    curve = next(s for t, s in charts(at).items() if t.startswith("Pruning curve"))
    assert curve["layout"]["yaxis"]["title"]["text"] == "language-model loss"


def test_corpus_waits_for_the_button_and_can_be_cancelled() -> None:
    at = run("pages/7_Head_importance.py")
    at.text_area(key="corpus").set_value("The cat sat on the mat.\nDogs bark at night.").run()
    assert not charts(at)  # two sentences: nothing runs before the button
    assert any("takes a while" in i.value for i in at.info)
    at.button[0].click().run()
    assert importance_grid(at).shape == (6, 12)
    assert any("2 sentence(s)" in c.value for c in at.caption)
    cancel = next(b for b in at.button if b.label == "Cancel")
    cancel.click().run()
    assert not charts(at) and any("takes a while" in i.value for i in at.info)


@pytest.mark.slow
def test_knock_outs_on_the_heads_page_match_ablate(minilm) -> None:
    at = run("pages/1_Heads.py", off="L2H5,L0H3", layer="3", head="1")
    assert not at.exception and not at.error
    expected = mhsa.ablate(CAT, ["L0H3", "L2H5"], model=minilm)
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["Output change"]) == pytest.approx(expected.change, rel=1e-3)
    assert at.multiselect(key="off").value == ["L0H3", "L2H5"]
    titles = list(charts(at))
    assert "How much each layer's attention moved" in titles
    assert "Layer 3, head 1, after the knock-out" in titles
    bars = charts(at)["How much each layer's attention moved"]["data"][0]
    largest = decode(bars["y"])
    diff = np.abs(expected.ablated.attention - expected.intact.attention).max(axis=(1, 2, 3))
    np.testing.assert_allclose(largest, diff, atol=1e-6)
    # a gate acts after the softmax: layer 0's weights stay, every layer above moves
    assert largest[0] == 0 and largest[1:].min() > 1e-4
    # the selection travels in the link, sorted
    assert at.query_params["off"] in ("L0H3,L2H5", ["L0H3,L2H5"])
    # the button switches the selected head off too
    next(b for b in at.button if b.label == "Switch L3H1 off").click().run()
    assert at.multiselect(key="off").value == ["L0H3", "L2H5", "L3H1"]


@pytest.mark.parametrize("raw", ["L0H3,<b>x</b>", "L99H0", "L0H1," * 300])
def test_bad_or_foreign_heads_in_the_link_fall_back(raw) -> None:
    at = run("pages/1_Heads.py", off=raw)
    assert not at.exception and not at.error
    notices = [w.value for w in at.warning]
    assert notices, "a notice says the value was not used"
    assert at.multiselect(key="off").value == []

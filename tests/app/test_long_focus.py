"""Issue 41, point 4 on the pages: on a partial result the pages that pick a layer or head
show and accept the model's own numbers (link keys ``layer``/``head``; one not materialised
falls back with a notice), and a long input's focused head offers a full-resolution window
(link key ``zoom``) marked on the block-averaged overview."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import mhsa
from tests.app.test_pages import run, specs
from tests.tiny import save_tiny, tiny_bert
from ui import core

TEXT = "ba ke mo di fu lo ba ke mo di"
#: over 512 tokens in the embedded WordPiece tokenizer: one token a word, plus [CLS], [SEP]
LONG = " ".join(["the cat sat on a mat and then it ran"] * 62)  # 620 words


def _texts(elements) -> list[str]:
    return [e.value.replace("\\", "") for e in elements]  # shown literally: markdown escapes


def _z(trace: dict) -> np.ndarray:
    z = trace["z"]
    if isinstance(z, dict):  # {"dtype": "f4", "bdata": ..., "shape": "m, n"}
        shape = tuple(int(s) for s in z["shape"].split(","))
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.asarray(z, dtype=np.float32)


def _title(spec: dict) -> str:
    return spec["layout"]["title"]["text"]


def _open(
    page: str,
    layers: str,
    heads: str,
    *,
    model: str = "toy:induction",
    text: str = TEXT,
    **link: str,
) -> AppTest:
    """Open ``page`` on ``text`` with layers/heads selected (the long-input keys) and the
    other link keys given; the page ends without an exception or an error."""
    at = run(page, model=model, text=text, long_layers=layers, long_heads=heads, **link)
    assert not at.exception and not at.error, _texts(at.error)
    return at


def test_the_heads_page_takes_the_models_layer_and_head_from_the_link() -> None:
    at = _open("pages/1_Heads.py", "1", "2-3", layer="1", head="3")
    assert not at.warning, _texts(at.warning)
    large = next(s for s in specs(at) if _title(s).startswith("Layer 1, head 3"))
    shown = core.attention(core.Query(TEXT, model="toy:induction", layers="1", heads="2-3"))
    assert shown.layers == [1] and shown.heads == [2, 3]  # the page's own result (its cache)
    np.testing.assert_array_equal(_z(large["data"][0]), shown.attention[0, 1])
    lm = mhsa.load_model("toy:induction")
    whole = mhsa.attend(TEXT, model=lm)  # the same head in the whole result (not position 0, 1)
    np.testing.assert_allclose(_z(large["data"][0]), whole.attention[1, 3], atol=1e-6)
    assert not np.allclose(whole.attention[0, 1], whole.attention[1, 3], atol=1e-3)
    layer_box, head_box = at.selectbox(key="layer"), at.selectbox(key="head")
    assert layer_box.options == ["1"] and head_box.options == ["2", "3"]
    assert at.session_state["layer"] == 1 and at.session_state["head"] == 3
    assert at.query_params["head"] == "3"  # the link keeps the model's number


def test_a_head_that_was_not_materialised_falls_back_with_a_notice() -> None:
    at = _open("pages/1_Heads.py", "1", "2-3", layer="0", head="1")
    notices = " ".join(_texts(at.warning))
    assert "Layer 0 was not materialised" in notices and "showing layer 1" in notices
    assert "Head 1 was not materialised" in notices and "showing head 2" in notices
    assert at.session_state["layer"] == 1 and at.session_state["head"] == 2
    assert any(_title(s).startswith("Layer 1, head 2") for s in specs(at))


def test_the_line_view_names_the_models_layer_and_heads() -> None:
    at = _open("pages/8_Line_view.py", "1", "1-2", layer="1", line_heads="2")
    (lines,) = specs(at)
    assert _title(lines).startswith("Layer 1,")
    names = {t.get("name") for t in lines["data"][2:]}
    assert "head 2" in names and "head 0" not in names and "head 1" not in names
    assert at.multiselect(key="line_heads").options == ["head 1", "head 2"]


def test_compare_takes_the_models_head() -> None:
    at = _open("pages/6_Compare.py", "0", "3", text2="ke mo di fu lo ba ke mo", layer="0", head="3")
    first = specs(at)[0]
    assert _title(first).startswith("Layer 0, head 3")
    whole = mhsa.attend(TEXT, model=mhsa.load_model("toy:induction"))
    np.testing.assert_allclose(_z(first["data"][0]), whole.attention[0, 3], atol=1e-6)
    assert not np.allclose(whole.attention[0, 0], whole.attention[0, 3], atol=1e-3)


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny BERT with 1024 positions and the embedded model's tokens: a text over 512
    tokens fits it."""
    import torch

    torch.manual_seed(0)
    model = tiny_bert(positions=1024).eval()
    return save_tiny(tmp_path_factory.mktemp("long-bert"), model)


def test_the_focused_head_of_a_long_input_zooms_at_full_resolution(
    long_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", long_model)
    at = _open(
        "pages/1_Heads.py", "1", "0-1", model=long_model, text=LONG, layer="1", head="1", zoom="100"
    )
    result = core.attention(core.Query(LONG, model=long_model, layers="1", heads="0-1"))
    n = result.num_tokens
    assert n > 600
    drawn = specs(at)
    overview = next(s for s in drawn if _title(s).startswith("Layer 1, head 1 ("))
    zoom = next(s for s in drawn if "full resolution" in _title(s))
    assert _z(overview["data"][0]).shape == (512, 512)  # block-averaged
    np.testing.assert_array_equal(_z(zoom["data"][0]), result.attention[0, 1, 100:612, 100:612])
    assert zoom["data"][0]["x"][0].endswith("#100") and zoom["data"][0]["y"][-1].endswith("#611")
    (box,) = [s for s in overview["layout"]["shapes"] if s.get("name") == "zoom"]
    edges = np.linspace(0, n, 513).round().astype(int)  # the overview's blocks
    assert edges[int(box["x0"] + 0.5)] <= 100 < edges[int(box["x0"] + 0.5) + 1]
    assert edges[int(box["x1"] - 0.5)] <= 611 < edges[int(box["x1"] - 0.5) + 1]


def test_a_hostile_zoom_is_clamped_with_a_notice(
    long_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", long_model)
    at = _open("pages/1_Heads.py", "0", "2", model=long_model, text=LONG, zoom="99999")
    n = max(len(s["data"][0]["x"]) for s in specs(at) if "full resolution" in _title(s))
    assert n == 512
    last = at.session_state["zoom"]
    assert "Zoom start 99999 is outside 0 to" in " ".join(_texts(at.warning))
    zoom = next(s for s in specs(at) if "full resolution" in _title(s))
    assert zoom["data"][0]["x"][-1].endswith(f"#{last + 511}")
    assert at.session_state["layer"] == 0 and at.session_state["head"] == 2


def test_rollout_on_a_partial_result_says_what_it_needs() -> None:
    at = run(
        "pages/5_Rollout.py", model="toy:induction", text=TEXT, long_layers="1", long_heads="2-3"
    )
    assert not at.exception
    (message,) = _texts(at.error)
    assert "needs consecutive layers from 0" in message and "Select layers 0-1" in message
    assert not specs(at)


def test_head_roles_draws_the_top_heads_of_a_partial_result() -> None:
    at = _open("pages/10_Head_roles.py", "1", "2-3")
    shown = core.attention(core.Query(TEXT, model="toy:induction", layers="1", heads="2-3"))
    tops = [s for s in specs(at) if _title(s).startswith("Layer 1, head ")]
    assert tops  # the best heads, by the model's numbers, each drawn from its own weights
    for spec in tops:
        head = int(_title(spec).removeprefix("Layer 1, head ").split(",")[0].split(" ")[0])
        np.testing.assert_array_equal(_z(spec["data"][0]), shown.attention[0, head - 2])

"""The notebook view of an ``AttentionResult`` as markup: self-contained, small, weights as
given, tokens as text. Its behaviour in a browser: tests/browser/test_notebook_browser.py."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

import mhsa
from mhsa.plots.notebook import MAX_VIEW_BYTES


def _attention(layers: int, heads: int, n: int, seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).random((layers, heads, n, n)) ** 4
    return a / a.sum(-1, keepdims=True)


def _embedded(html: str) -> dict:
    found = re.search(r'<script type="application/json" class="mhsa-data">(.*?)</script>', html)
    assert found is not None
    return json.loads(found.group(1))


def test_minilm_at_64_tokens_fits_in_two_megabytes() -> None:
    """The issue's budget: MiniLM's 6 x 12 heads at 64 tokens, the script and styles included."""
    result = mhsa.from_attention(_attention(6, 12, 64), [f"t{i}" for i in range(64)])
    html = result._repr_html_()
    assert len(html.encode()) < 2 * 2**20
    assert len(html.encode()) > 6 * 12 * 64 * 64 * 2 * 4 / 3  # every weight is in it


def test_the_weights_are_embedded_to_within_one_in_65535() -> None:
    a = _attention(2, 3, 7)
    data = _embedded(mhsa.from_attention(a, list("abcdefg")).show().html)
    raw = np.frombuffer(base64.b64decode(data["w"]), dtype="<u2").reshape(2, 3, 7, 7)
    np.testing.assert_allclose(raw / 65535.0, a, atol=0.5 / 65535 + 1e-7)
    assert (data["L"], data["H"], data["m"], data["n"]) == (2, 3, 7, 7)


def test_nothing_is_fetched_and_tokens_stay_text() -> None:
    hostile = ["<s>", "</script><script>alert(1)</script>", "<img src=x onerror=alert(1)>", "&amp;"]
    html = mhsa.from_attention(_attention(1, 2, 4), hostile).show("line").html
    assert "</script><script>alert" not in html and "<img src=x" not in html
    assert _embedded(html)["keys"] == hostile  # as typed, once decoded
    plain = mhsa.from_attention(_attention(1, 2, 4), list("abcd")).show("line").html
    for fetch in ("src=", "href=", "url(", "@import", "fetch(", "XMLHttpRequest", "cdn"):
        assert fetch not in plain, fetch
    # the only URL is SVG's namespace name, which is never requested
    assert set(re.findall(r"https?://[^\s\"']+", plain)) == {"http://www.w3.org/2000/svg"}


def test_a_partial_result_names_the_models_heads(minilm) -> None:
    result = mhsa.attend("The cat sat.", model=minilm, layers=[2, 4], heads=[1, 5])
    data = _embedded(result.show(layer=1, head=0).html)
    assert data["layers"] == ["L2", "L4"] and data["heads"] == ["H1", "H5"]
    assert (data["layer"], data["head"]) == (1, 0)


def test_to_html_writes_a_whole_document(tmp_path) -> None:
    result = mhsa.from_attention(_attention(1, 1, 3), ["a", "b", "c"])
    path = result.to_html(tmp_path / "view.html", view="line", theme="dark")
    text = path.read_text()
    assert text.startswith("<!doctype html>") and 'data-theme="dark"' in text
    assert _embedded(text)["view"] == "line"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"view": "map"}, "Unknown view"),
        ({"theme": "sepia"}, "Unknown theme"),
        ({"layer": 3}, "No head at layer 3"),
        ({"head": -1}, "No head"),
    ],
)
def test_bad_options_say_what_is_wrong(options: dict, message: str) -> None:
    result = mhsa.from_attention(_attention(1, 2, 3), ["a", "b", "c"])
    with pytest.raises(mhsa.InputError, match=message):
        result.show(**options)


def test_too_many_weights_are_refused_with_advice(monkeypatch) -> None:
    monkeypatch.setattr("mhsa.plots.notebook.MAX_VIEW_BYTES", 1000)
    result = mhsa.from_attention(_attention(2, 2, 12), [f"t{i}" for i in range(12)])
    with pytest.raises(mhsa.InputError, match="select layers and heads"):
        result.show()
    shown = result._repr_html_()  # a notebook cell ending with it: one line, no traceback
    assert shown.startswith("<p>") and "select layers and heads" in shown
    assert MAX_VIEW_BYTES > 6 * 12 * 64 * 64 * 2

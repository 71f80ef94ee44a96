"""The Overview page's upload of attention computed elsewhere (issue 50), under AppTest: the
file's heads and their statistics are shown; a bad or hostile file is one literal message and
the rest of the page still works."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

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

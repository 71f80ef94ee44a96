"""Fixtures of the browser tests: a server of this checkout and Debian's Chromium, one each per
test module, and a fresh page per test that fails the test on any JavaScript error."""

from __future__ import annotations

import pytest

from bench.browser import chromium, streamlit_server


@pytest.fixture(scope="module")
def app_url(tiny_bert_path):
    """The server; it also allows the tiny BERT (``tiny_bert_path``: the default model's tokens
    at 2 layers of 4 heads) in links, for the tests where the model is not what is tested."""
    with streamlit_server(env={"MHSA_ALLOWED_MODELS": tiny_bert_path}) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert not errors, errors

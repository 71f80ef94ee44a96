"""Trained models kept in one store (``MHSA_STORE``) by real servers: two replicas behind the
shipped nginx share it, so a model trained through the page on one opens by its link on the
other; replicas killed with SIGKILL mid-training and mid-save leave nothing listed; a server
started afresh on the same store removes the half-saved leftover, opens the link, and with a
store of 1 MB refuses a bigger model with the message that says what to raise."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.browser import (
    PAGE_PLOTS,
    chromium,
    nginx_in_front,
    streamlit_server,
    tick_labels,
    wait_for_app,
)
from mhsa.engine.models.store import Store
from mhsa.engine.models.store_entry import flock

pytestmark = pytest.mark.browser
TINY = "layers=2&heads=2&width=16&train_seed=1"


def _train(page, url: str, settings: str) -> None:
    page.goto(f"{url}/Train_heads?{settings}")
    wait_for_app(page, plots=PAGE_PLOTS["Train heads"], timeout_ms=120_000)
    page.locator("[data-testid='stMain']").get_by_role("button", name="Train", exact=True).click()


def _opens_on_heads(page, link: str, name: str) -> None:
    """``link`` (the Heads page on ``name``) shows its heatmaps, with no error and no notice."""
    page.goto(link)
    wait_for_app(page, plots=PAGE_PLOTS["Heads"], timeout_ms=120_000)
    assert page.locator("[data-testid='stAlertContentError']").count() == 0
    assert page.locator("[data-testid='stAlertContentWarning']").count() == 0
    model_box = page.locator("[data-testid='stSidebar'] input[aria-label='Model']")
    assert model_box.input_value() == name
    assert tick_labels(page, 1)[0] == "[BOS]"  # the toy model's tokens, not MiniLM's


def test_trained_models_open_on_every_replica_and_after_a_restart(tmp_path) -> None:
    root = tmp_path / "store"
    env = {"MHSA_STORE": str(root)}
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        main = page.locator("[data-testid='stMain']")
        with contextlib.ExitStack() as replicas:
            with ThreadPoolExecutor(2) as pool:  # both start at once
                one, two = pool.map(replicas.enter_context, [streamlit_server(env) for _ in "12"])
            url = replicas.enter_context(nginx_in_front([one, two], tmp_path))
            _train(page, url, f"{TINY}&steps=30")
            main.get_by_text("30 of 30").wait_for(timeout=120_000)
            held = main.get_by_text(re.compile(r"trained:[0-9a-f]{12}")).first.inner_text()
            name = re.search(r"trained:[0-9a-f]{12}", held).group(0)
            kept = main.locator("[data-testid='stAlertContentSuccess']").inner_text()
            assert f"Kept in this server's store as {name}: " in kept, kept
            main.get_by_role("button", name="Explore this model").click()
            page.wait_for_url(re.compile(r"/Heads\?"), timeout=60_000)
            wait_for_app(page, plots=PAGE_PLOTS["Heads"])
            link = page.url.removeprefix(url)  # the student's link, under any server's address
            served = (tmp_path / "access.log").read_text().split()
            trainer = one if one.removeprefix("http://") in served else two
            other = two if trainer is one else one
            assert other.removeprefix("http://") not in served  # it never saw this model
            _opens_on_heads(page, f"{other}{link}", name)
            # the other replica dies mid-training: nothing of that run is kept
            _train(page, other, f"{TINY}&steps=5000")
            main.get_by_text(re.compile(r"Training: step [1-9]\d* of 5000")).wait_for(
                timeout=60_000
            )
            os.kill(other.pid, signal.SIGKILL)
            # the trainer dies mid-save: its files are written, not yet put in place (the test
            # holds the store's lock, as another replica putting an entry in place would)
            busy = flock(root / ".locks" / "store.lock", exclusive=True)
            try:
                _train(page, trainer, f"{TINY}&steps=5")
                deadline = time.monotonic() + 120
                while not list((root / ".tmp").glob("trained--*/manifest.json")):
                    assert time.monotonic() < deadline, "the save never reached its last step"
                    time.sleep(0.05)
                os.kill(trainer.pid, signal.SIGKILL)
            finally:
                os.close(busy)
        # what is listed: the first model only; the killed save's folder is left over
        assert [p.name for p in (root / "trained").iterdir()] == [name.split(":")[1]]
        (leftover,) = (root / ".tmp").iterdir()
        assert leftover.name.startswith("trained--") and (leftover / "model").is_dir()
        # every server down; one starts again, on the same store with room for 1 MB
        with streamlit_server({**env, "MHSA_STORE_MB": "1"}) as again:
            _opens_on_heads(page, f"{again}{link}", name)
            assert not leftover.exists()  # removed when the restarted server opened the store
            _train(page, again, "layers=1&heads=2&width=128&steps=5&train_seed=1")
            refusal = main.get_by_text(re.compile(r"The store has no room for this"))
            refusal.wait_for(timeout=120_000)
            assert re.fullmatch(
                r"The store has no room for this 1\.\d MB: it holds at most 1 MB "
                r"\(MHSA_STORE_MB\), and 0\.0 MB of it are entries in use right now\. Raise "
                r"MHSA_STORE_MB to at least 2, or remove entries \(python -m mhsa store list, "
                r"then store remove ID\)\.",
                refusal.inner_text().strip(),
            )
            assert page.locator("[data-testid='stException']").count() == 0
    assert [e.id for e in Store(root).entries("trained")] == [name.split(":")[1]]

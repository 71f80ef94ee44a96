"""The pages on a store (``MHSA_STORE``) that holds a good trained model and one whose manifest
is corrupted: a link to the good one opens it (trained by another process: here, written into
the store beforehand), a link to the damaged one falls back with the link notice on every page,
and the Train heads page says where a new model is kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from mhsa.engine.models.names import TOY_DIR
from mhsa.engine.models.store import Store
from mhsa.engine.models.trained import KIND, trained_store
from tests.hostile import rendered
from ui import navigation

ROOT = Path(__file__).resolve().parents[2]
GOOD, BAD = "0123456789ab", "ba9876543210"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with the shipped induction model as a trained model, and a copy of it whose
    manifest is cut short; ``trained_store()`` reads it while the module's tests run."""
    root = tmp_path_factory.mktemp("store")
    writer = Store(root)
    for entry_id in (GOOD, BAD):
        with writer.writing(KIND, entry_id, {"task": "induction"}) as folder:
            shutil.copytree(TOY_DIR / "induction", folder / "model")
    manifest = root / KIND / BAD / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MHSA_STORE", str(root))
        trained_store.cache_clear()
        yield root
        trained_store().release()
        trained_store.cache_clear()


def _run(page: str, **query: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / page), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


@pytest.mark.parametrize("page", sorted(p.file for p in navigation.PAGES))
def test_a_link_to_the_damaged_model_falls_back_on_every_page(store, page) -> None:
    at = _run(page, model=f"trained:{BAD}")
    assert not at.exception and not at.error, [e.value for e in at.error]
    notices = " ".join(rendered(w.value)[0] for w in at.warning)
    assert f"model='trained:{BAD}' ignored" in notices


def test_the_good_model_opens_by_link_and_a_new_one_says_where_it_is_kept(store) -> None:
    heads = _run("pages/1_Heads.py", model=f"trained:{GOOD}", text="ba be bi ba be bi")
    assert not heads.exception and not heads.error and not heads.warning
    assert heads.text_input(key="model").value == f"trained:{GOOD}"
    assert [m.id for m in trained_store().models()] == [GOOD]
    from ui.training import kept_text

    (model,) = trained_store().models()
    assert kept_text(model).startswith(f"Kept in this server's store as **trained:{GOOD}**")
    assert "every replica" in kept_text(model)

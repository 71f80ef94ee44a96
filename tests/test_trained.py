"""The store of trained models (``trained:<id>``): per process (no ``MHSA_STORE``) bounded, least
recently used dropped with its folder, a failed save leaves nothing, names it does not hold
refused; a held model opens through ``load_model`` and is allowed whatever the operator's
allow-list; with ``MHSA_STORE``, a model another process saved opens here by name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mhsa
from mhsa.engine.models.limits import Limits
from mhsa.engine.models.trained import TrainedModelStore, trained_store

ROOT = Path(__file__).resolve().parents[1]


def _write(folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text("{}")


def test_the_least_recently_used_model_is_dropped_with_its_folder(tmp_path) -> None:
    store = TrainedModelStore(2, root=tmp_path)
    a = store.add(_write, {"task": "copy"})
    b = store.add(_write)
    assert a.name.startswith("trained:") and a.name != b.name
    assert (a.folder / "config.json").is_file() and a.info == {"task": "copy"}
    store.get(a.name)  # a used: b is now the oldest
    c = store.add(_write)
    assert [m.id for m in store.models()] == [a.id, c.id]
    assert b.name not in store and not b.folder.exists()
    assert a.folder.exists() and c.folder.exists()
    with pytest.raises(mhsa.ModelLoadError, match=r"holds no trained model .*Train heads"):
        store.get(b.name)
    store.clear()
    assert len(store) == 0 and list((store.store.root / "trained").iterdir()) == []
    store.close()
    assert list(tmp_path.iterdir()) == []  # the temporary store's folder is gone


def test_a_failed_save_leaves_no_folder_and_holds_nothing(tmp_path) -> None:
    store = TrainedModelStore(3, root=tmp_path)

    def half_written(folder: Path) -> None:
        _write(folder)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        store.add(half_written)
    assert len(store) == 0 and list((store.store.root / ".tmp").iterdir()) == []
    assert not (store.store.root / "trained").exists()


@pytest.mark.parametrize(
    "name", ["trained:", "trained:../../etc", "trained:ABCDEF012345", "trained:0123", "/tmp", 7]
)
def test_names_that_are_no_held_id_are_refused(tmp_path, name) -> None:
    store = TrainedModelStore(1, root=tmp_path)
    store.add(_write)
    assert name not in store
    if isinstance(name, str):
        with pytest.raises(mhsa.ModelLoadError):
            store.get(name)


def test_a_store_needs_room() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TrainedModelStore(0)


def test_a_held_model_loads_by_name_and_passes_the_allow_list(monkeypatch, tiny_gpt2_path) -> None:
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", "")  # only the embedded model allowed
    held = trained_store().add(lambda folder: shutil.copytree(tiny_gpt2_path, folder))
    try:
        Limits.from_env().check_model(held.name)  # allowed: the store decides
        with pytest.raises(mhsa.ModelLoadError):
            Limits.from_env().check_model(tiny_gpt2_path)  # the same folder by path: refused
        loaded = mhsa.load_model(held.name, device="cpu")
        assert loaded.display_name == held.name and loaded.lm_head == "causal"
        direct = mhsa.attend("the cat sat", model=mhsa.load_model(tiny_gpt2_path, device="cpu"))
        result = mhsa.attend("the cat sat", model=loaded)
        np.testing.assert_array_equal(result.attention, direct.attention)
    finally:
        trained_store().clear()
    with pytest.raises(mhsa.ModelLoadError, match="holds no trained model"):
        mhsa.load_model(held.name, device="cpu")


@pytest.fixture
def shared_store(monkeypatch, tmp_path):
    """``MHSA_STORE`` set to a fresh folder for this test's ``trained_store()``."""
    monkeypatch.setenv("MHSA_STORE", str(tmp_path / "store"))
    trained_store.cache_clear()
    yield tmp_path / "store"
    trained_store().release()
    trained_store.cache_clear()


def test_a_model_saved_by_another_process_opens_here_by_name(shared_store, tiny_gpt2_path) -> None:
    """The other process has exited (a restart, or another replica): its model is in the
    store, opens by ``trained:<id>`` and gives the attention of the same folder opened by path;
    ``models()`` lists it with its settings."""
    code = (
        "import shutil, sys\n"
        "from mhsa.engine.models.trained import trained_store\n"
        "held = trained_store().add(lambda f: shutil.copytree(sys.argv[1], f), {'task': 'copy'})\n"
        "print(held.name)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code, tiny_gpt2_path], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    name = out.stdout.strip()
    store = trained_store()
    assert store.shared and name in store
    (listed,) = store.models()
    assert listed.name == name and listed.info == {"task": "copy"}
    loaded = mhsa.load_model(name, device="cpu")
    direct = mhsa.load_model(tiny_gpt2_path, device="cpu")
    np.testing.assert_array_equal(
        mhsa.attend("the cat sat", model=loaded).attention,
        mhsa.attend("the cat sat", model=direct).attention,
    )
    manifest = listed.folder.parent / "manifest.json"
    manifest.write_text("{ not json")  # damaged after this process held it: it keeps it
    assert mhsa.load_model(name, device="cpu").display_name == name
    trained_store().release()
    with pytest.raises(mhsa.ModelLoadError, match=r"copy of trained model .* is damaged"):
        trained_store().get(name)
    assert name not in trained_store() and trained_store().models() == []

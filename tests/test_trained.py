"""The per-process store of trained models (``trained:<id>``): bounded, least recently used
dropped with its folder, a failed save leaves nothing, names it does not hold refused; and a held
model opens through ``load_model`` and is allowed whatever the operator's allow-list."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import mhsa
from mhsa.engine.limits import Limits
from mhsa.engine.trained import TrainedModelStore, trained_store


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

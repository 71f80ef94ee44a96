"""The layers' import rules (CONTRIBUTING.md): pages -> ui -> mhsa, read from the source.

Every ``import`` statement counts, those inside functions too (a lazy import is still an
import). ``tests/app/test_views_page.py::test_pages_do_no_numerics`` adds that pages import no
numerical library.
"""

from __future__ import annotations

import ast
import importlib
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


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (annotations only: never
    imported when the program runs)."""
    found: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        for child in ast.iter_child_nodes(node):
            test = child.test if isinstance(child, ast.If) else None
            if test is not None and "TYPE_CHECKING" in ast.unparse(test):
                todo.extend(child.orelse)
            else:
                todo.append(child)
    return found


def _mhsa_import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Which ``mhsa`` modules each ``mhsa`` module imports (lazy imports too). Importing
    ``mhsa.training.toy`` also runs ``mhsa/training/__init__.py``: a module outside a
    subpackage that imports from it also imports the subpackage (``mhsa`` itself, the public
    re-exports that every module's import runs first, is left out: it is the top)."""
    files = {_module_name(p, root): p for p in sorted((root / "mhsa").rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        direct = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                direct |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    direct |= {full} if full in files else {base} if base in files else set()
        parents = {
            ".".join(target.split(".")[:k])
            for target in direct
            for k in range(2, target.count(".") + 1)
        }
        outside = {p for p in parents if p in files and not (name + ".").startswith(p + ".")}
        graph[name] = (direct | outside) - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    """On a made-up graph with one circle of three, a tail and a self-contained pair."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["e", "f"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_import_graph_reads_real_imports(tmp_path: Path) -> None:
    graph = _mhsa_import_graph()
    assert "mhsa.models" in graph["mhsa.swap"]  # a module-level import
    assert "mhsa.model_names" in graph["mhsa.limits"]
    assert "mhsa.training.tasks" in graph["mhsa.training.card"]
    # card.py's TrainResult is imported for annotations only (under TYPE_CHECKING)
    assert "mhsa.training.trainer" not in graph["mhsa.training.card"]
    # a planted tree: importing mhsa.sub.b runs mhsa/sub/__init__.py, which imports mhsa.a
    files = {
        "__init__.py": "from mhsa import a\n",
        "a.py": "def f():\n    from mhsa.sub.b import x\n",
        "sub/__init__.py": "from mhsa.a import f\n",
        "sub/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from mhsa import c\nx = 1\n",
        "c.py": "from mhsa.sub import b\n",
    }
    for name, text in files.items():
        (tmp_path / "mhsa" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "mhsa" / name).write_text(text)
    planted = _mhsa_import_graph(tmp_path)
    assert planted["mhsa.a"] == {"mhsa.sub", "mhsa.sub.b"}
    assert planted["mhsa.sub.b"] == set()  # TYPE_CHECKING: not imported when run
    assert planted["mhsa.c"] == {"mhsa.sub", "mhsa.sub.b"}
    assert _cycles(planted) == [["mhsa.a", "mhsa.sub"]]


def test_no_import_cycle_among_mhsa_modules() -> None:
    """Issue 37: "what a model name means" lived in four modules that imported each other
    (limits, models, swap, trained, training/toy, training/trainer); now in
    ``mhsa.model_names``, a leaf."""
    assert _cycles(_mhsa_import_graph()) == []


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


@pytest.mark.parametrize("folder", ["ui", "mhsa"])
def test_modules_stay_small(folder: str) -> None:
    """Each feature has a room of its own (CONTRIBUTING.md; issue 37): no module of ``ui/`` or
    ``mhsa/`` runs past 600 lines."""
    files = _files(folder)
    assert len(files) >= 8  # the folder was read
    sizes = {_ui_module(p): len(p.read_text().splitlines()) for p in files}
    assert {m: n for m, n in sizes.items() if n > 600} == {}


@pytest.mark.parametrize(
    ("old_home", "name", "new_home"),
    [
        ("mhsa.attention", "RotaryEmbedding", "mhsa.rotary"),
        ("mhsa.attribution", "ResidualPass", "mhsa.residual"),
        ("mhsa.attribution", "residual_pass", "mhsa.residual"),
    ],
)
def test_split_modules_keep_their_public_names(old_home: str, name: str, new_home: str) -> None:
    """Issue 37's splits moved these; the modules they left still export the very same object."""
    old, new = importlib.import_module(old_home), importlib.import_module(new_home)
    assert name in old.__all__ and name in new.__all__
    assert getattr(old, name) is getattr(new, name)
    assert getattr(new, name).__module__ == new_home

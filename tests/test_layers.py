"""The layers' import rules (CONTRIBUTING.md, docs/architecture.md): pages -> ui -> mhsa, and
within ``mhsa`` its concerns in one direction (``LAYERS``), read from the source.

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
    assert "torch" in _imports(ROOT / "mhsa" / "engine" / "attention" / "module.py")
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
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
    assert "mhsa.engine.models.loading" in graph["mhsa.engine.runs.swap"]  # a module-level import
    assert "mhsa.engine.models.names" in graph["mhsa.engine.models.limits"]
    assert "mhsa.training.tasks" in graph["mhsa.training.card"]
    # card.py's TrainResult is imported for annotations only: it counts (issue 45)
    assert "mhsa.training.trainer" in graph["mhsa.training.card"]
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
    assert planted["mhsa.sub.b"] == {"mhsa.c"}  # under TYPE_CHECKING: counted all the same
    assert planted["mhsa.c"] == {"mhsa.sub", "mhsa.sub.b"}
    assert _cycles(planted) == [["mhsa.a", "mhsa.c", "mhsa.sub", "mhsa.sub.b"]]


def test_no_import_cycle_among_mhsa_modules() -> None:
    """Imports under ``if TYPE_CHECKING:`` count (issue 45: three circles ran through them).
    Issue 37: "what a model name means" lived in four modules that imported each other
    (limits, models, swap, trained, training/toy, training/trainer); now in
    ``mhsa.engine.models.names``, a leaf."""
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


def test_the_engine_keeps_at_most_12_modules_at_its_level() -> None:
    """``mhsa/engine/`` is grouped in sub-folders by concern, each saying what it holds and may
    import; at most 12 modules stay at its own level."""
    engine = ROOT / "mhsa" / "engine"
    modules = sorted(p.name for p in engine.glob("*.py"))
    folders = sorted(p.name for p in engine.iterdir() if (p / "__init__.py").is_file())
    assert "extract.py" in modules and "families" in folders  # the folder was read
    assert len(modules) <= 12, modules
    for folder in folders:
        doc = ast.get_docstring(ast.parse((engine / folder / "__init__.py").read_text()))
        assert doc and "May import" in doc, folder


@pytest.mark.parametrize(
    ("old_home", "name", "new_home"),
    [
        ("mhsa.engine.attention.module", "RotaryEmbedding", "mhsa.engine.attention.rotary"),
        ("mhsa.causal.attribution", "ResidualPass", "mhsa.engine.stream.residual"),
        ("mhsa.causal.attribution", "residual_pass", "mhsa.engine.stream.residual"),
    ],
)
def test_split_modules_keep_their_public_names(old_home: str, name: str, new_home: str) -> None:
    """Names that moved to a module of their own are still exported, as the very same object,
    by the module they left."""
    old, new = importlib.import_module(old_home), importlib.import_module(new_home)
    assert name in old.__all__ and name in new.__all__
    assert getattr(old, name) is getattr(new, name)
    assert getattr(new, name).__module__ == new_home


#: ``mhsa``'s concerns from the bottom up (docs/architecture.md; issue 45): a module imports its
#: own group's modules and those of the groups below it, never above. ``base``: the top-level
#: modules every layer shares; ``front``: the top-level modules over everything (the package's
#: re-exports, the old names, the example texts); ``main``: ``python -m mhsa``.
LAYERS = [
    "base",
    "engine",
    "analysis",
    "causal",
    "circuits",
    "training",
    "corpus",
    "atlas",
    "explain",
    "plots",
    "front",
    "cli",
    "main",
]
BASE = {"mhsa.errors", "mhsa.registry", "mhsa.deprecation", "mhsa.heads"}
FRONT = {"mhsa", "mhsa.compat", "mhsa.examples"}


def _group(module: str) -> str:
    if module in BASE:
        return "base"
    if module in FRONT:
        return "front"
    if module == "mhsa.__main__":
        return "main"
    group = module.split(".")[1]
    assert group in LAYERS, f"{module} belongs to no layer: add its folder to LAYERS"
    return group


def test_mhsa_concerns_import_only_downwards() -> None:
    graph = _mhsa_import_graph()
    assert "mhsa.engine.models.loading" in graph["mhsa.causal.patching"]  # the graph reads them
    upward = {
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if LAYERS.index(_group(target)) > LAYERS.index(_group(name))
    }
    assert upward == set()


def test_the_direction_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """A planted engine module that imports an analysis: the rule above would see it."""
    files = {
        "engine/__init__.py": "",
        "engine/low.py": "def f():\n    from mhsa.analysis.high import g\n",
        "analysis/__init__.py": "",
        "analysis/high.py": "g = 1\n",
    }
    for name, text in files.items():
        (tmp_path / "mhsa" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "mhsa" / name).write_text(text)
    graph = _mhsa_import_graph(tmp_path)
    assert graph["mhsa.engine.low"] == {"mhsa.analysis", "mhsa.analysis.high"}
    assert LAYERS.index(_group("mhsa.analysis.high")) > LAYERS.index(_group("mhsa.engine.low"))


def test_mhsa_top_level_holds_at_most_20_modules() -> None:
    """Issue 45: the folder shows the architecture; what stays at the top is what every layer
    shares (``BASE``) and the front doors (``FRONT``), each placed in a layer."""
    top = {p.stem for p in (ROOT / "mhsa").glob("*.py")} - {"__init__"}
    assert 0 < len(top) <= 20
    assert {f"mhsa.{m}" for m in top} <= BASE | FRONT | {"mhsa.__main__"}
    for package in [p for p in (ROOT / "mhsa").iterdir() if (p / "__init__.py").exists()]:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        assert package.name in LAYERS, package.name
        assert "May import" in doc or package.name in {"plots", "cli", "training"}, package


@pytest.mark.parametrize("folder", ["pages"])
def test_pages_stay_small(folder: str) -> None:
    """Pages only arrange widgets and figures (issue 45): none runs past 250 lines."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in _files(folder)}
    assert len(sizes) >= 10
    assert {name: n for name, n in sizes.items() if n > 250} == {}


#: torch's calls that put a hook on a module or a tensor
_HOOK_CALLS = {
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_backward_hook",
    "register_hook",
    "register_module_forward_hook",
    "register_module_forward_pre_hook",
}


def _hook_calls(path: Path) -> list[int]:
    """The lines of ``path`` that call one of torch's hook registrations."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _HOOK_CALLS
    ]


def test_only_the_stream_and_the_families_register_hooks() -> None:
    """Every hook on a model goes through ``mhsa.engine.stream`` (its ``hooks`` module and the
    recorder) or a family's own file: no other module of ``mhsa`` registers one."""
    allowed = (ROOT / "mhsa" / "engine" / "stream", ROOT / "mhsa" / "engine" / "families")
    hooks = ROOT / "mhsa" / "engine" / "stream" / "hooks.py"
    assert _hook_calls(hooks), "the checker finds the registrations it must allow"
    offenders = {
        str(p.relative_to(ROOT)): lines
        for p in _files("mhsa")
        if not any(folder in p.parents for folder in allowed) and (lines := _hook_calls(p))
    }
    assert offenders == {}


def test_no_line_of_mhsa_names_an_issue() -> None:
    """Comments and docstrings say what and why; history is git's: no line of ``mhsa/`` names
    one of the project's issues ("issue 45", "issue 40.6"). Upstream issues are cited as
    ``owner/repo#N``."""
    import re

    pattern = re.compile(r"\bissues? \d+", re.IGNORECASE)
    assert pattern.search("split in issue 37") is not None  # the pattern finds the old wording
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _files("mhsa")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []

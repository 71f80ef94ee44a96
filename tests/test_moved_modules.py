"""Issue 45 grouped ``mhsa/`` by concern: every module path of before still imports, for a release,
as the very module it moved to, with a ``DeprecationWarning`` naming its new path
(``mhsa.compat.MovedModuleFinder``); nothing in the repository itself uses an old path; the
names ``mhsa`` re-exported then still resolve."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

import mhsa
from mhsa.compat import MOVED_MODULES, MOVED_PACKAGES, moved_to

ROOT = Path(__file__).resolve().parents[1]

#: every module of ``mhsa/`` before issue 45, package ones included (``git ls-tree`` of the
#: commit before the move), by the path it had then
OLD_TOP_LEVEL = """adapters analysis attention attribution block_search cache circuit_graph
circuit_layers circuit_pairs circuit_postnorm circuit_runs circuit_taps circuits classroom
compat composition core corpus deprecation detection distributed encoding errors examples
extract flow forward frozen_norm generation heads importance jobs layer_files layer_parts limits
metrics model_names models norms partial patch_runs patching plots pruning registry repeats
residual result rmsnorm roles rotary selection similarity stats stream support swap tables
targets tokens trained training cli families""".split()

#: what ``mhsa`` re-exported before the move (``mhsa.__all__`` then)
PUBLIC_BEFORE = """ATTENTION_DTYPES ATTENTION_KINDS Ablation AttentionResult AttentionSinks
CircuitGraph
DEFAULT_MODEL DEVICES EDGE_METHODS ENGINES ENGINE_DESCRIPTIONS ENGINE_LABELS ENGINE_SPECS
EngineSpec FaithfulnessCurve FlowGraph Generation HeadAttribution HeadClusters InputError
LoadedModel LogitLens MAX_NEW_TOKENS MHSAError MIB_PERCENTAGES ModelLoadError
MultiHeadSelfAttention PATCH_POINTS PATCH_TARGETS PathPatch RotaryEmbedding SUPPORTED_FOR_MHSA
Selection TASKS TraceStep TrainConfig TrainResult TrainSnapshot UnsupportedModelError ablate
attend attend_generated attend_layers attention_core attention_rollout attention_sinks
attribution_patching circuit_faithfulness circuit_graph cpu_threads detect_heads
edge_attribution faithfulness_curve find_tokens generate generate_ids get_model
head_attribution head_clusters head_composition head_importance head_label head_map
head_similarity head_stats induction_scores information_flow load_model logit_lens
norms_as_attention parse_head_label patch_heads patch_positions patching_correlation path_patch
pick_device pruning_curve save_model scaled_dot_product_attention sink_value_norms
streamed_head_similarity streamed_head_stats strongest_inputs top_attended top_edges
toy_model_path train""".split()

#: the three modules that became packages of the same name, with the names they exported
SAME_NAME = {
    "mhsa.analysis": ["BLOCK_ELEMS", "as_results", "rows_per_block"],
    "mhsa.circuits": [
        *("EAP_ONE_PASS_MAX", "EDGE_METHODS", "MIB_PERCENTAGES", "CircuitGraph"),
        *("FaithfulnessCurve", "PathPatch", "circuit_faithfulness", "circuit_graph"),
        *("edge_attribution", "edge_attribution_ids", "faithfulness_curve", "path_patch"),
        "top_edges",
    ],
    "mhsa.corpus": [
        *("BATCH_TOKENS", "Corpus", "CorpusStats", "Entry", "Problem", "attend_batched"),
        *("attend_batches", "attend_one_by_one", "batch_attention", "batch_tokens_for"),
        *("corpus_stats", "encode_entries", "length_batches", "read_corpus"),
    ],
}

OLD_FAMILY_MODULES = sorted(
    f"mhsa.families.{m.name}"
    for m in pkgutil.iter_modules([str(ROOT / "mhsa" / "engine" / "families")])
)


def test_every_old_top_level_path_is_accounted_for() -> None:
    """Each module of before either stayed (the shared ones, the subpackages), became a
    package of the same name, or moved (and the finder knows where)."""
    stayed = {"compat", "deprecation", "errors", "examples", "heads", "registry"}
    stayed |= {"plots", "training", "cli"}
    for name in OLD_TOP_LEVEL:
        old = f"mhsa.{name}"
        assert name in stayed or old in SAME_NAME or moved_to(old) is not None, old
    top_level_moves = [old for old in MOVED_MODULES if old.count(".") == 1]
    assert len(top_level_moves) + len(MOVED_PACKAGES) + len(SAME_NAME) + len(stayed) == len(
        OLD_TOP_LEVEL
    )


#: every module of ``mhsa/engine/`` before it was grouped in sub-folders (0.1.0)
OLD_ENGINE = """adapters attention batches block_search cache core encoding extract forward
frozen_norm generation interop layer_files layer_parts limits model_names models norms partial
postnorm_stream query_keys residual result rmsnorm rotary selection seq2seq_stream store
store_entry support swap tokens trained""".split()


def test_every_old_engine_path_is_accounted_for() -> None:
    """Each engine module of 0.1.0 stayed at ``mhsa/engine/``, became a package of the same name
    that exports its names, or moved (and the finder knows where)."""
    here = {m.name for m in pkgutil.iter_modules([str(ROOT / "mhsa" / "engine")])}
    same_name = {"attention": "module", "models": "loading"}
    for name in OLD_ENGINE:
        old = f"mhsa.engine.{name}"
        if name in same_name:
            package = importlib.import_module(old)
            inner = importlib.import_module(f"{old}.{same_name[name]}")
            assert all(getattr(package, n) is getattr(inner, n) for n in inner.__all__), old
        else:
            assert name in here or moved_to(old) is not None, old
    assert len(here - {"attention", "models", "families", "runs", "stream"}) <= 12


@pytest.mark.parametrize("old", [*sorted(MOVED_MODULES), *MOVED_PACKAGES, *OLD_FAMILY_MODULES])
def test_an_old_path_imports_the_moved_module_with_a_warning(old: str) -> None:
    new = moved_to(old)
    assert new is not None and new != old
    real = importlib.import_module(new)
    sys.modules.pop(old, None)  # an earlier import of the old path would not warn again
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated.*use {new} instead"):
        aliased = importlib.import_module(old)
    assert aliased is real
    assert real.__spec__.name == new and real.__name__ == new  # the real module is untouched


def test_from_import_of_an_old_name_warns_in_a_fresh_process() -> None:
    """The way users wrote it (``from mhsa.circuit_runs import ...``, ``from mhsa import
    models``): the warning points at their own line, and the objects are the new homes'."""
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import mhsa\n"
        "try:\n"
        "    from mhsa.circuit_runs import run_circuit\n"
        "except DeprecationWarning as e:\n"
        "    print('warned:', e)\n"
        "warnings.simplefilter('ignore')\n"
        "from mhsa import models\n"
        "from mhsa.families import neox\n"
        "import mhsa.engine.models.loading, mhsa.engine.families.neox\n"
        "print(models is mhsa.engine.models.loading, neox is mhsa.engine.families.neox)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "warned: The module mhsa.circuit_runs is deprecated" in out
    assert "use mhsa.circuits.runs instead" in out
    assert out.strip().endswith("True True")


def test_an_old_path_named_as_a_public_function_keeps_the_function() -> None:
    """``mhsa.circuit_graph`` is an old public name of a function (now
    ``mhsa.circuits.circuit_graph``); its old module path imports, and the old name still gives
    the function (importing a submodule sets an attribute of its package)."""
    function = mhsa.circuits.circuit_graph
    assert callable(function) and not isinstance(function, types.ModuleType)
    sys.modules.pop("mhsa.circuit_graph", None)
    with pytest.warns(DeprecationWarning, match="mhsa.circuits.graph"):
        module = importlib.import_module("mhsa.circuit_graph")
    assert module is importlib.import_module("mhsa.circuits.graph")
    with pytest.warns(DeprecationWarning, match="use mhsa.circuits.circuit_graph instead"):
        assert mhsa.circuit_graph is function
    assert isinstance(mhsa.circuits.graph, types.ModuleType)  # submodules still set as usual


@pytest.mark.parametrize("package", sorted(SAME_NAME))
def test_modules_that_became_packages_keep_their_names(package: str) -> None:
    module = importlib.import_module(package)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in SAME_NAME[package]:
            assert getattr(module, name) is not None, f"{package}.{name}"
    assert set(SAME_NAME[package]) <= set(module.__all__)


def test_mhsa_still_resolves_every_name_it_exported() -> None:
    """Those that left ``mhsa.__all__`` warn (``tests/test_public_api.py``), and resolve."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert all(getattr(mhsa, name, None) is not None for name in PUBLIC_BEFORE)


def _old_paths_imported(path: Path) -> set[str]:
    """The old module paths that ``path`` imports (``import``, ``from ... import``, and
    ``from mhsa import <old module>``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if moved_to(n) is not None}
    return found


def test_the_repository_uses_no_old_path(tmp_path: Path) -> None:
    """Only this file imports the old paths: everything else moved with the modules (so the
    warnings reach users' code only)."""
    files = [
        p
        for folder in ("mhsa", "ui", "pages", "tests", "bench", "scripts")
        for p in (ROOT / folder).rglob("*.py")
        if p != Path(__file__).resolve()
    ] + [ROOT / "app.py"]
    assert len(files) > 100
    assert {str(p.relative_to(ROOT)): h for p in files if (h := _old_paths_imported(p))} == {}
    planted = tmp_path / "planted.py"  # the checker sees each way of writing an old path
    planted.write_text(
        "from mhsa.circuit_runs import x\nfrom mhsa import models, attend\n"
        "def f():\n    import mhsa.families.neox\n"
    )
    found = {"mhsa.circuit_runs", "mhsa.models", "mhsa.families.neox"}
    assert _old_paths_imported(planted) == found

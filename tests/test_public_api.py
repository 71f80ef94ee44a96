"""The public API of 0.2.0: a small ``mhsa.__all__``, every other name at home in its
subpackage's ``__all__``, and every name 0.1 exported still resolving as ``mhsa.<name>`` until
0.3.0, with a ``DeprecationWarning`` naming its new home (``mhsa.compat.MOVED_NAMES``), as do
the old module paths read as attributes (``mhsa.patching``)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

import mhsa
from mhsa.compat import MOVED_NAMES
from mhsa.deprecation import REMOVED_IN

ROOT = Path(__file__).resolve().parents[1]

#: ``mhsa.__all__`` of 0.1.0, written out: each of these still resolves as ``mhsa.<name>``
OLD_ALL = """ATTENTION_DTYPES ATTENTION_KINDS DEFAULT_MODEL DEVICES EDGE_METHODS ENGINES
ENGINE_DESCRIPTIONS ENGINE_LABELS ENGINE_SPECS MAX_NEW_TOKENS MIB_PERCENTAGES PATCH_POINTS
PATCH_TARGETS SUPPORTED_FOR_MHSA TASKS Ablation Atlas AtlasParts AttentionResult
AttentionSinks CircuitGraph EngineSpec FaithfulnessCurve FlowGraph Generation
HeadAttribution HeadClusters InputError LayerSources LoadedModel LogitLens MHSAError
ModelLoadError MultiHeadSelfAttention PathPatch PositionalQK RotaryEmbedding Selection
TraceStep TrainConfig TrainResult TrainSnapshot UnsupportedModelError ablate attend
attend_generated attend_layers attention_core attention_rollout attention_sinks
attribution_patching build_atlas circuit_faithfulness circuit_graph cpu_threads detect_heads
edge_attribution faithfulness_curve find_tokens from_attention generate generate_ids
get_model head_attribution head_clusters head_composition head_importance head_label
head_map head_similarity head_stats induction_scores information_flow layer_sources
load_model logit_lens norms_as_attention open_atlas ov_copying_scores ov_top_tokens
parse_head_label patch_heads patch_positions patching_correlation path_patch pick_device
pruning_curve qk_attribution qk_positional_scores save_model scaled_dot_product_attention
show sink_value_norms streamed_head_similarity streamed_head_stats strongest_inputs
top_attended top_edges toy_model_path train""".split()

SUBPACKAGES = [
    "analysis",
    "atlas",
    "causal",
    "circuits",
    "corpus",
    "engine",
    "explain",
    "plots",
    "training",
]


def _resolve(dotted: str) -> object:
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            value = getattr(value, part)
        return value
    raise AssertionError(dotted)


def test_the_top_level_is_small() -> None:
    assert len(OLD_ALL) == 100 and len(set(OLD_ALL)) == 100
    assert len(mhsa.__all__) <= 25
    assert len(set(mhsa.__all__)) == len(mhsa.__all__)
    assert set(SUBPACKAGES) <= set(mhsa.__all__)
    assert set(mhsa.__all__) - set(SUBPACKAGES) <= set(OLD_ALL)  # nothing new at the top


def test_the_top_level_names_resolve_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert all(getattr(mhsa, name) is not None for name in mhsa.__all__)
        assert set(dir(mhsa)) >= set(mhsa.__all__)
        namespace: dict[str, object] = {}
        exec("from mhsa import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(mhsa.__all__)


@pytest.mark.parametrize("name", sorted(set(OLD_ALL) - set(mhsa.__all__)))
def test_a_name_that_left_the_top_level_warns_and_is_its_new_home(name: str) -> None:
    home = MOVED_NAMES[name]
    subpackage = home.split(".")[1]
    assert home.startswith("mhsa.") and subpackage in SUBPACKAGES
    message = rf"mhsa\.{name} is deprecated .*{REMOVED_IN}.*use {re.escape(home)} instead"
    with pytest.warns(DeprecationWarning, match=message) as record:
        value = getattr(mhsa, name)
    assert [r.filename for r in record] == [__file__]  # the warning names the caller's line
    assert value is _resolve(home)
    if home.count(".") == 2:  # a subpackage's own name (qk_attribution is its module's)
        assert name in importlib.import_module(f"mhsa.{subpackage}").__all__


@pytest.mark.parametrize("name", sorted(set(OLD_ALL) & set(mhsa.__all__)))
def test_a_name_kept_at_the_top_level_does_not_warn(name: str) -> None:
    assert name not in MOVED_NAMES
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert getattr(mhsa, name) is not None


def test_every_old_name_that_moved_is_in_the_table() -> None:
    assert set(MOVED_NAMES) == set(OLD_ALL) - set(mhsa.__all__)


def test_from_import_of_a_moved_name_warns_once_from_the_importing_line() -> None:
    with pytest.warns(DeprecationWarning, match="use mhsa.causal.patch_heads instead") as record:
        from mhsa import patch_heads
    assert patch_heads is mhsa.causal.patch_heads
    assert [r.filename for r in record] == [__file__]


@pytest.mark.parametrize(
    ("module", "name", "new"),
    [
        ("patching", "patching_correlation", "mhsa.causal.patching"),
        ("models", "default_model_path", "mhsa.engine.models.loading"),
        ("families", "neox", "mhsa.engine.families"),
    ],
)
def test_an_old_module_path_resolves_as_an_attribute(
    monkeypatch: pytest.MonkeyPatch, module: str, name: str, new: str
) -> None:
    """Without an import statement: ``import mhsa; mhsa.patching.patching_correlation``."""
    importlib.import_module(f"{new}.{name}" if module == "families" else new)
    monkeypatch.delitem(vars(mhsa), module, raising=False)  # an import of the old path set it
    match = rf"The module mhsa\.{module} is deprecated .*use {re.escape(new)} instead"
    with pytest.warns(DeprecationWarning, match=match):
        value = getattr(getattr(mhsa, module), name)
    assert value is getattr(importlib.import_module(new), name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'patch_everything'"):
        mhsa.patch_everything  # noqa: B018
    with pytest.raises(ImportError):
        from mhsa import patch_everything  # noqa: F401


def test_the_version_is_pyprojects() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert mhsa.__version__ == "0.2.0" == project["version"]
    assert REMOVED_IN == "0.3.0"  # the deprecated names go in the next minor release


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_every_subpackage_exports_what_its_all_names(subpackage: str) -> None:
    module = importlib.import_module(f"mhsa.{subpackage}")
    assert module is getattr(mhsa, subpackage)
    assert module.__all__ and len(set(module.__all__)) == len(module.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        missing = [name for name in module.__all__ if getattr(module, name, None) is None]
    assert missing == []


def test_the_engine_imports_each_name_from_the_module_that_defines_it() -> None:
    exports = mhsa.engine._EXPORTS
    assert set(exports) == set(mhsa.engine.__all__) <= set(dir(mhsa.engine))
    assert all(module.startswith("mhsa.engine.") for module in exports.values())
    for name, module in exports.items():
        assert name in vars(importlib.import_module(module)), f"{module} defines no {name}"
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        mhsa.engine.nothing_here  # noqa: B018


def test_import_mhsa_leaves_plotly_and_the_corpus_jobs_out() -> None:
    """``mhsa.plots`` and ``mhsa.corpus`` import when first asked for."""
    code = (
        "import sys, mhsa\n"
        "print(sorted(m for m in ('plotly', 'mhsa.plots', 'mhsa.corpus') if m in sys.modules))\n"
        "print(mhsa.plots.__name__, mhsa.corpus.__name__, 'plotly' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["[]", "mhsa.plots mhsa.corpus True"]

"""Old public names kept working until mhsa ``REMOVED_IN`` (``mhsa.deprecation``): each warns
with a ``DeprecationWarning`` naming its new name, then does what the new name does. All go in
0.3.0.

- Deprecated in 0.2.0, the names ``mhsa`` exported that now live in its subpackages
  (``mhsa.patch_heads`` is ``mhsa.causal.patch_heads``): ``MOVED_NAMES``, answered by
  ``mhsa.__getattr__``, which also answers an old module path as an attribute
  (``mhsa.patching``, without an import statement: ``MOVED_MODULES``).
- ``MultiHeadSelfAttention.from_bert`` / ``from_distilbert`` / ``from_gpt2`` / ``from_llama``
  (removed when the family registry arrived): ``mhsa.engine.families.bert.load_bert`` ...
  ``mhsa.engine.families.llama.load_llama``, each in its family's module.
- ``attn_mask=`` / ``attention_mask=`` of ``MultiHeadSelfAttention.forward``,
  ``attention_weights`` and ``combine_masks`` (renamed ``mask=`` / ``padding_mask=``): at their
  definitions, ``mhsa.deprecation.renamed_kwargs``.
- Every module path of ``mhsa`` from before the package was grouped by concern
  (``mhsa.circuit_runs``, ``mhsa.models``, ``mhsa.families.neox``...): importing one gives the
  moved module itself (``MOVED_MODULES``, ``MOVED_PACKAGES``) and a ``DeprecationWarning``
  naming its new path, through one import hook (``MovedModuleFinder``, on ``sys.meta_path``).
  ``mhsa.analysis``, ``mhsa.circuits`` and ``mhsa.corpus`` are packages now, and each still
  exports the old module's names.
- Deprecated in 0.2.0, the engine's module paths from before its sub-folders
  (``mhsa.engine.swap`` is ``mhsa.engine.runs.swap``, ``mhsa.engine.adapters``
  ``mhsa.engine.families.registry``...): the same finder and table. ``mhsa.engine.attention``
  and ``mhsa.engine.models`` are packages now that export the old modules' names.

The constructors are set on the class here, not in ``mhsa.engine.attention.module``: they call the
family loaders of ``mhsa.engine.families``, which import ``mhsa.engine.attention.module`` (no
import cycle). ``import mhsa`` imports this module, as does any ``mhsa.<module>`` import (the
package is imported first).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from mhsa.deprecation import deprecated_alias, deprecation_message
from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.families.bert import load_bert
from mhsa.engine.families.distilbert import load_distilbert
from mhsa.engine.families.gpt2 import load_gpt2
from mhsa.engine.families.llama import load_llama

__all__ = [
    "DEPRECATED_CONSTRUCTORS",
    "MOVED_MODULES",
    "MOVED_MODULE_NAMES",
    "MOVED_NAMES",
    "MOVED_PACKAGES",
    "MovedModuleFinder",
    "moved_module_message",
    "moved_to",
]

#: old classmethod of ``MultiHeadSelfAttention`` -> the loader that replaces it
DEPRECATED_CONSTRUCTORS: dict[str, Callable[..., MultiHeadSelfAttention]] = {
    "from_bert": load_bert,
    "from_distilbert": load_distilbert,
    "from_gpt2": load_gpt2,
    "from_llama": load_llama,
}


def _constructor(old: str, load: Callable[..., MultiHeadSelfAttention]) -> classmethod:
    alias = deprecated_alias(
        load,
        f"MultiHeadSelfAttention.{old}",
        f"{load.__module__}.{load.__name__}",
        stacklevel=3,
    )

    def construct(_cls: type, *args: Any, **kwargs: Any) -> MultiHeadSelfAttention:
        return alias(*args, **kwargs)

    construct.__name__ = construct.__qualname__ = old
    construct.__doc__ = alias.__doc__
    return classmethod(construct)


for _old, _load in DEPRECATED_CONSTRUCTORS.items():
    setattr(MultiHeadSelfAttention, _old, _constructor(_old, _load))


#: old module path -> its home since the package was grouped by concern
MOVED_MODULES: dict[str, str] = {
    "mhsa.adapters": "mhsa.engine.families.registry",
    "mhsa.attention": "mhsa.engine.attention.module",
    "mhsa.attribution": "mhsa.causal.attribution",
    "mhsa.block_search": "mhsa.engine.runs.block_search",
    "mhsa.cache": "mhsa.engine.cache",
    "mhsa.circuit_graph": "mhsa.circuits.graph",
    "mhsa.circuit_layers": "mhsa.circuits.layers",
    "mhsa.circuit_pairs": "mhsa.circuits.pairs",
    "mhsa.circuit_postnorm": "mhsa.circuits.postnorm",
    "mhsa.circuit_runs": "mhsa.circuits.runs",
    "mhsa.circuit_taps": "mhsa.circuits.taps",
    "mhsa.classroom": "mhsa.analysis.classroom",
    "mhsa.composition": "mhsa.analysis.composition",
    "mhsa.core": "mhsa.engine.attention.core",
    "mhsa.detection": "mhsa.analysis.detection",
    "mhsa.distributed": "mhsa.corpus.distributed",
    "mhsa.encoding": "mhsa.engine.encoding",
    "mhsa.extract": "mhsa.engine.extract",
    "mhsa.flow": "mhsa.causal.flow",
    "mhsa.forward": "mhsa.engine.runs.forward",
    "mhsa.frozen_norm": "mhsa.engine.stream.frozen_norm",
    "mhsa.generation": "mhsa.engine.runs.generation",
    "mhsa.importance": "mhsa.causal.importance",
    "mhsa.jobs": "mhsa.corpus.jobs",
    "mhsa.layer_files": "mhsa.engine.runs.layer_files",
    "mhsa.layer_parts": "mhsa.engine.families.layout",
    "mhsa.limits": "mhsa.engine.models.limits",
    "mhsa.metrics": "mhsa.causal.metrics",
    "mhsa.model_names": "mhsa.engine.models.names",
    "mhsa.models": "mhsa.engine.models.loading",
    "mhsa.norms": "mhsa.engine.runs.norms",
    "mhsa.partial": "mhsa.engine.runs.partial",
    "mhsa.patch_runs": "mhsa.causal.patch_runs",
    "mhsa.patching": "mhsa.causal.patching",
    "mhsa.pruning": "mhsa.causal.pruning",
    "mhsa.repeats": "mhsa.analysis.repeats",
    "mhsa.residual": "mhsa.engine.stream.residual",
    "mhsa.result": "mhsa.engine.result",
    "mhsa.rmsnorm": "mhsa.engine.attention.rmsnorm",
    "mhsa.roles": "mhsa.analysis.roles",
    "mhsa.rotary": "mhsa.engine.attention.rotary",
    "mhsa.selection": "mhsa.engine.runs.selection",
    "mhsa.similarity": "mhsa.analysis.similarity",
    "mhsa.stats": "mhsa.analysis.stats",
    "mhsa.stream": "mhsa.analysis.stream",
    "mhsa.support": "mhsa.engine.families.support",
    "mhsa.swap": "mhsa.engine.runs.swap",
    "mhsa.tables": "mhsa.analysis.tables",
    "mhsa.targets": "mhsa.causal.targets",
    "mhsa.tokens": "mhsa.engine.tokens",
    "mhsa.trained": "mhsa.engine.models.trained",
    "mhsa.engine.adapters": "mhsa.engine.families.registry",
    "mhsa.engine.batches": "mhsa.engine.runs.batches",
    "mhsa.engine.block_search": "mhsa.engine.runs.block_search",
    "mhsa.engine.core": "mhsa.engine.attention.core",
    "mhsa.engine.forward": "mhsa.engine.runs.forward",
    "mhsa.engine.frozen_norm": "mhsa.engine.stream.frozen_norm",
    "mhsa.engine.generation": "mhsa.engine.runs.generation",
    "mhsa.engine.layer_files": "mhsa.engine.runs.layer_files",
    "mhsa.engine.layer_parts": "mhsa.engine.families.layout",
    "mhsa.engine.limits": "mhsa.engine.models.limits",
    "mhsa.engine.model_names": "mhsa.engine.models.names",
    "mhsa.engine.norms": "mhsa.engine.runs.norms",
    "mhsa.engine.partial": "mhsa.engine.runs.partial",
    "mhsa.engine.postnorm_stream": "mhsa.engine.stream.postnorm",
    "mhsa.engine.query_keys": "mhsa.engine.runs.query_keys",
    "mhsa.engine.residual": "mhsa.engine.stream.residual",
    "mhsa.engine.rmsnorm": "mhsa.engine.attention.rmsnorm",
    "mhsa.engine.rotary": "mhsa.engine.attention.rotary",
    "mhsa.engine.selection": "mhsa.engine.runs.selection",
    "mhsa.engine.seq2seq_stream": "mhsa.engine.stream.seq2seq",
    "mhsa.engine.store": "mhsa.engine.models.store",
    "mhsa.engine.store_entry": "mhsa.engine.models.store_entry",
    "mhsa.engine.support": "mhsa.engine.families.support",
    "mhsa.engine.swap": "mhsa.engine.runs.swap",
    "mhsa.engine.trained": "mhsa.engine.models.trained",
}

#: old package path -> new: the package and every module under it
MOVED_PACKAGES: dict[str, str] = {"mhsa.families": "mhsa.engine.families"}


#: a name ``mhsa`` exported in 0.1 -> its home (``mhsa.__getattr__`` answers the old one).
#: ``qk_attribution`` is also the name of its module, which ``mhsa.analysis`` keeps visible.
MOVED_NAMES: dict[str, str] = {
    "AttentionSinks": "mhsa.analysis.AttentionSinks",
    "HeadClusters": "mhsa.analysis.HeadClusters",
    "LayerSources": "mhsa.analysis.LayerSources",
    "PositionalQK": "mhsa.analysis.PositionalQK",
    "attention_rollout": "mhsa.analysis.attention_rollout",
    "attention_sinks": "mhsa.analysis.attention_sinks",
    "head_clusters": "mhsa.analysis.head_clusters",
    "head_composition": "mhsa.analysis.head_composition",
    "head_map": "mhsa.analysis.head_map",
    "induction_scores": "mhsa.analysis.induction_scores",
    "layer_sources": "mhsa.analysis.layer_sources",
    "ov_copying_scores": "mhsa.analysis.ov_copying_scores",
    "ov_top_tokens": "mhsa.analysis.ov_top_tokens",
    "qk_attribution": "mhsa.analysis.qk_attribution.qk_attribution",
    "qk_positional_scores": "mhsa.analysis.qk_positional_scores",
    "sink_value_norms": "mhsa.analysis.sink_value_norms",
    "streamed_head_similarity": "mhsa.analysis.streamed_head_similarity",
    "streamed_head_stats": "mhsa.analysis.streamed_head_stats",
    "strongest_inputs": "mhsa.analysis.strongest_inputs",
    "top_attended": "mhsa.analysis.top_attended",
    "Atlas": "mhsa.atlas.Atlas",
    "AtlasParts": "mhsa.atlas.AtlasParts",
    "build_atlas": "mhsa.atlas.build_atlas",
    "open_atlas": "mhsa.atlas.open_atlas",
    "PATCH_POINTS": "mhsa.causal.PATCH_POINTS",
    "PATCH_TARGETS": "mhsa.causal.PATCH_TARGETS",
    "Ablation": "mhsa.causal.Ablation",
    "FlowGraph": "mhsa.causal.FlowGraph",
    "HeadAttribution": "mhsa.causal.HeadAttribution",
    "LogitLens": "mhsa.causal.LogitLens",
    "attribution_patching": "mhsa.causal.attribution_patching",
    "head_attribution": "mhsa.causal.head_attribution",
    "head_importance": "mhsa.causal.head_importance",
    "information_flow": "mhsa.causal.information_flow",
    "logit_lens": "mhsa.causal.logit_lens",
    "patch_heads": "mhsa.causal.patch_heads",
    "patch_positions": "mhsa.causal.patch_positions",
    "patching_correlation": "mhsa.causal.patching_correlation",
    "pruning_curve": "mhsa.causal.pruning_curve",
    "EDGE_METHODS": "mhsa.circuits.EDGE_METHODS",
    "MIB_PERCENTAGES": "mhsa.circuits.MIB_PERCENTAGES",
    "CircuitGraph": "mhsa.circuits.CircuitGraph",
    "FaithfulnessCurve": "mhsa.circuits.FaithfulnessCurve",
    "PathPatch": "mhsa.circuits.PathPatch",
    "circuit_faithfulness": "mhsa.circuits.circuit_faithfulness",
    "circuit_graph": "mhsa.circuits.circuit_graph",
    "edge_attribution": "mhsa.circuits.edge_attribution",
    "faithfulness_curve": "mhsa.circuits.faithfulness_curve",
    "path_patch": "mhsa.circuits.path_patch",
    "top_edges": "mhsa.circuits.top_edges",
    "ATTENTION_DTYPES": "mhsa.engine.ATTENTION_DTYPES",
    "ATTENTION_KINDS": "mhsa.engine.ATTENTION_KINDS",
    "DEFAULT_MODEL": "mhsa.engine.DEFAULT_MODEL",
    "DEVICES": "mhsa.engine.DEVICES",
    "ENGINES": "mhsa.engine.ENGINES",
    "ENGINE_DESCRIPTIONS": "mhsa.engine.ENGINE_DESCRIPTIONS",
    "ENGINE_LABELS": "mhsa.engine.ENGINE_LABELS",
    "ENGINE_SPECS": "mhsa.engine.ENGINE_SPECS",
    "MAX_NEW_TOKENS": "mhsa.engine.MAX_NEW_TOKENS",
    "SUPPORTED_FOR_MHSA": "mhsa.engine.SUPPORTED_FOR_MHSA",
    "EngineSpec": "mhsa.engine.EngineSpec",
    "Generation": "mhsa.engine.Generation",
    "LoadedModel": "mhsa.engine.LoadedModel",
    "RotaryEmbedding": "mhsa.engine.RotaryEmbedding",
    "Selection": "mhsa.engine.Selection",
    "TraceStep": "mhsa.engine.TraceStep",
    "attend_generated": "mhsa.engine.attend_generated",
    "attend_layers": "mhsa.engine.attend_layers",
    "attention_core": "mhsa.engine.attention_core",
    "cpu_threads": "mhsa.engine.cpu_threads",
    "find_tokens": "mhsa.engine.find_tokens",
    "generate": "mhsa.engine.generate",
    "generate_ids": "mhsa.engine.generate_ids",
    "get_model": "mhsa.engine.get_model",
    "norms_as_attention": "mhsa.engine.norms_as_attention",
    "pick_device": "mhsa.engine.pick_device",
    "scaled_dot_product_attention": "mhsa.engine.scaled_dot_product_attention",
    "TASKS": "mhsa.training.TASKS",
    "TrainConfig": "mhsa.training.TrainConfig",
    "TrainResult": "mhsa.training.TrainResult",
    "TrainSnapshot": "mhsa.training.TrainSnapshot",
    "save_model": "mhsa.training.save_model",
    "toy_model_path": "mhsa.training.toy_model_path",
    "train": "mhsa.training.train",
}


def moved_to(old: str) -> str | None:
    """The module path that ``old`` moved to, or None when it did not move."""
    if old in MOVED_MODULES:
        return MOVED_MODULES[old]
    for package, new in MOVED_PACKAGES.items():
        if old == package or old.startswith(package + "."):
            return new + old[len(package) :]
    return None


def moved_module_message(old: str, new: str) -> str:
    """The warning of an old module path ``old``, imported or read as an attribute."""
    return deprecation_message(f"The module {old}", new)


class _MovedModuleLoader(importlib.abc.Loader):
    """Gives the moved module itself (one object under both names: a monkeypatch or an
    ``isinstance`` through either path sees the same thing), warning once per process."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            moved_module_message(spec.name, self.new),
            DeprecationWarning,
            stacklevel=2,  # importlib's own frames are skipped: the importing line
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # importlib set the alias's spec on the real module


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """An import hook that answers the old paths of moved modules (and nothing else)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = moved_to(fullname)
        if new is None:
            return None
        is_package = importlib.util.find_spec(new).submodule_search_locations is not None
        return importlib.util.spec_from_loader(
            fullname, _MovedModuleLoader(new), is_package=is_package
        )


class _PublicNamesKept(ModuleType):
    """``mhsa``'s own class: importing a submodule sets it as an attribute of its package, and
    ``import mhsa.circuit_graph`` (an old module path, now ``mhsa.circuits.graph``) would put the
    module where the old public function ``mhsa.circuit_graph`` is answered. A module never
    replaces a name that is not a module, nor an old public name (``MOVED_NAMES``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, ModuleType) and name in MOVED_NAMES:
            return
        current = self.__dict__.get(name)
        if (
            isinstance(value, ModuleType)
            and current is not None
            and not isinstance(current, ModuleType)
        ):
            return
        super().__setattr__(name, value)


sys.modules["mhsa"].__class__ = _PublicNamesKept

if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, MovedModuleFinder())


#: names moved between modules of one subpackage: old module -> {name: new module}
MOVED_MODULE_NAMES: dict[str, dict[str, str]] = {
    "mhsa.circuits.runs": dict.fromkeys(
        ("CircuitPair", "probe_gradients", "run_pair"), "mhsa.circuits.pairs"
    ),
}


def _moved_names_getattr(old: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` answering the names that left ``old`` with a warning naming
    their new module."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            deprecation_message(f"{old}.{name}", f"{names[name]}.{name}"),
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(names[name]), name)

    return __getattr__


for _module, _names in MOVED_MODULE_NAMES.items():
    importlib.import_module(_module).__getattr__ = _moved_names_getattr(_module, _names)

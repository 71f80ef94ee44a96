"""MHSA Explorer's engine: multi-head self-attention, attention extraction, head analysis.

Never imports streamlit; only ``mhsa.plots`` imports plotly.

The top level holds what a first notebook needs (``__all__``); everything else lives in its
subpackage (``mhsa.causal.patch_heads``, ``mhsa.engine.attend_layers``). The names this package
exported in 0.1 still resolve here until 0.3.0, each with a ``DeprecationWarning`` naming its
home (``mhsa.compat.MOVED_NAMES``), as do the module paths of before the package was grouped
by concern (``mhsa.patching``: ``mhsa.compat.MOVED_MODULES``).
"""

import importlib
import sys
import warnings
from typing import Any

from mhsa import (
    analysis,
    atlas,
    causal,
    circuits,
    compat,  # old names and module paths kept for a release (mhsa.deprecation)
    engine,
    explain,
    training,
)
from mhsa.analysis.roles import detect_heads
from mhsa.analysis.similarity import head_similarity
from mhsa.analysis.stats import head_stats
from mhsa.causal.importance import ablate
from mhsa.deprecation import deprecation_message
from mhsa.engine.attention.module import MultiHeadSelfAttention
from mhsa.engine.extract import attend
from mhsa.engine.interop import from_attention
from mhsa.engine.models.loading import load_model
from mhsa.engine.result import AttentionResult, NotebookView, set_html_view
from mhsa.errors import InputError, MHSAError, ModelLoadError, UnsupportedModelError
from mhsa.heads import head_label, parse_head_label

__version__ = "0.2.0"

#: subpackages imported when first asked for: ``mhsa.plots`` imports plotly, ``mhsa.corpus``
#: the corpus jobs
_LAZY_SUBPACKAGES = ("corpus", "plots")


def _notebook_html(result: AttentionResult, view: str = "heads", **options: object) -> str:
    """``mhsa.plots.notebook.result_html``, imported when a view is first drawn (plotly, which
    ``mhsa.plots`` imports, stays out of ``import mhsa``)."""
    from mhsa.plots.notebook import result_html

    return result_html(result, view, **options)  # type: ignore[arg-type]


def _result_html(name: str):
    """``mhsa.plots.notebook_results.<name>``, imported when it first draws."""

    def draw(value: object, **options: object) -> str:
        from mhsa.plots import notebook_results

        return getattr(notebook_results, name)(value, **options)

    return draw


def show(value: object, **options: object) -> NotebookView:
    """Any result as a notebook view (``mhsa.plots.notebook_results.show``): an
    ``AttentionResult``, a patching table (``patch_heads``), scored circuit edges
    (``edge_attribution``, ``top_edges``), a ``PatchingAgreement``, ``PathPatch``,
    ``CircuitGraph``, ``Atlas``, ``AtlasParts`` or ``FaithfulnessCurve``: its table and a
    small figure, self-contained."""
    from mhsa.plots.notebook_results import show as show_result

    return show_result(value, **options)


set_html_view(_notebook_html)
for _kind, _name in {
    "patching agreement": "agreement_html",
    "path patch": "path_patch_html",
    "circuit graph": "graph_html",
    "atlas": "atlas_html",
    "atlas parts": "atlas_parts_html",
    "faithfulness curve": "faithfulness_html",
}.items():
    set_html_view(_result_html(_name), _kind)
del _kind, _name

__all__ = [
    "AttentionResult",
    "InputError",
    "MHSAError",
    "ModelLoadError",
    "MultiHeadSelfAttention",
    "UnsupportedModelError",
    "ablate",
    "analysis",
    "atlas",
    "attend",
    "causal",
    "circuits",
    "corpus",
    "detect_heads",
    "engine",
    "explain",
    "from_attention",
    "head_label",
    "head_similarity",
    "head_stats",
    "load_model",
    "parse_head_label",
    "plots",
    "show",
    "training",
]


def __getattr__(name: str) -> Any:
    """A lazy subpackage (``mhsa.plots``), or an old name: a name of 0.1's ``__all__`` that
    moved to a subpackage (``compat.MOVED_NAMES``) or an old module path read as an attribute
    (``mhsa.patching``: ``compat.moved_to``), each with a ``DeprecationWarning`` naming its
    home."""
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    old = f"{__name__}.{name}"
    if (home := compat.MOVED_NAMES.get(name)) is not None:
        module, _, attribute = home.rpartition(".")
        value = getattr(importlib.import_module(module), attribute)
        message = deprecation_message(old, home)
    elif (moved := compat.moved_to(old)) is not None:
        value, message = importlib.import_module(moved), compat.moved_module_message(old, moved)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # ``from mhsa import x`` asks twice, first from importlib's check of the names it lists:
    # the second ask, from the importing line itself, warns
    if sys._getframe(1).f_globals.get("__name__") != "importlib._bootstrap":
        warnings.warn(message, DeprecationWarning, stacklevel=2)
    return value


def __dir__() -> list[str]:
    """The public names (``__all__``) and the module's dunders: the deprecated names, the
    helpers and the submodules imported along the way are left out."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})

"""Old public names kept working for a release (``mhsa.deprecation``): each warns with a
``DeprecationWarning`` naming its new name, then does what the new name does.

- ``MultiHeadSelfAttention.from_bert`` / ``from_distilbert`` / ``from_gpt2`` / ``from_llama``
  (removed when the family registry arrived): ``mhsa.adapters.load_bert`` ... ``load_llama``.
- ``attn_mask=`` / ``attention_mask=`` of ``MultiHeadSelfAttention.forward``,
  ``attention_weights`` and ``combine_masks`` (renamed ``mask=`` / ``padding_mask=``): at their
  definitions, ``mhsa.deprecation.renamed_kwargs``.

The constructors are set on the class here, not in ``mhsa.attention``: they call the family
loaders of ``mhsa.adapters``, which imports ``mhsa.attention`` (no import cycle). ``import mhsa``
imports this module, as does any ``mhsa.<module>`` import (the package is imported first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mhsa.adapters import load_bert, load_distilbert, load_gpt2, load_llama
from mhsa.attention import MultiHeadSelfAttention
from mhsa.deprecation import deprecated_alias

__all__ = ["DEPRECATED_CONSTRUCTORS"]

#: old classmethod of ``MultiHeadSelfAttention`` -> the loader that replaces it
DEPRECATED_CONSTRUCTORS: dict[str, Callable[..., MultiHeadSelfAttention]] = {
    "from_bert": load_bert,
    "from_distilbert": load_distilbert,
    "from_gpt2": load_gpt2,
    "from_llama": load_llama,
}


def _constructor(old: str, load: Callable[..., MultiHeadSelfAttention]) -> classmethod:
    alias = deprecated_alias(
        load, f"MultiHeadSelfAttention.{old}", f"mhsa.adapters.{load.__name__}", stacklevel=3
    )

    def construct(_cls: type, *args: Any, **kwargs: Any) -> MultiHeadSelfAttention:
        return alias(*args, **kwargs)

    construct.__name__ = construct.__qualname__ = old
    construct.__doc__ = alias.__doc__
    return classmethod(construct)


for _old, _load in DEPRECATED_CONSTRUCTORS.items():
    setattr(MultiHeadSelfAttention, _old, _constructor(_old, _load))

"""Renamed public names keep working until the release ``REMOVED_IN``, with a
``DeprecationWarning`` naming the new one, as transformers deprecates arguments
(``transformers.utils.deprecation.deprecate_kwarg``). Which names: ``mhsa.compat``.

Written here rather than taken from transformers: its helper warns with ``FutureWarning`` (for
end users of an application; these names are a library's, for programmers, which is what
``DeprecationWarning`` is for) and importing it would make ``import mhsa`` load transformers.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["REMOVED_IN", "deprecated_alias", "deprecation_message", "renamed_kwargs"]

#: the release that drops the old names (0.2.0, the release before it, still takes them)
REMOVED_IN = "0.3.0"

Fn = TypeVar("Fn", bound=Callable[..., Any])

#: frames a warning skips to reach the caller: this module's and torch's module-call machinery
#: (``model(x)`` reaches ``forward`` through ``nn.Module.__call__``)
_SKIPPED = (os.path.dirname(__file__) + os.sep + "deprecation.py", f"torch{os.sep}nn{os.sep}")


def deprecation_message(old: str, new: str) -> str:
    """The one wording of every deprecation here: ``old`` goes in ``REMOVED_IN``, use ``new``."""
    return f"{old} is deprecated and will be removed in mhsa {REMOVED_IN}: use {new} instead."


def _caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel (from the wrapper that calls it) of the first frame
    outside this module and ``torch.nn``: the caller's line, which Python's default filters
    show for ``__main__`` (``skip_file_prefixes`` is Python 3.12's)."""
    frame, level = sys._getframe(2), 2  # 2: the wrapper's caller
    while frame is not None and any(part in frame.f_code.co_filename for part in _SKIPPED):
        frame, level = frame.f_back, level + 1
    return level


def renamed_kwargs(**renames: str) -> Callable[[Fn], Fn]:
    """Decorate a function whose keyword arguments were renamed (``old="new"``): an old name
    still works, with a ``DeprecationWarning`` naming the new one.

    Raises:
        TypeError: (from the decorated function) both the old and the new name were given.
    """

    def decorate(fn: Fn) -> Fn:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs and not renames.keys().isdisjoint(kwargs):
                for old, new in renames.items():
                    if old not in kwargs:
                        continue
                    if new in kwargs:
                        raise TypeError(
                            f"{fn.__qualname__}() got both {old!r} and its new name {new!r}: "
                            f"give only {new!r}."
                        )
                    argument = f"{fn.__qualname__}(): the argument {old!r}"
                    warnings.warn(
                        deprecation_message(argument, repr(new)),
                        DeprecationWarning,
                        stacklevel=_caller_stacklevel(),
                    )
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def deprecated_alias(
    new: Callable[..., Any], old_name: str, new_name: str, *, stacklevel: int = 2
) -> Callable[..., Any]:
    """A function under its old name ``old_name`` that warns (``DeprecationWarning``, naming
    ``new_name``) and then calls ``new`` with the same arguments (``stacklevel`` as
    ``warnings.warn``'s, counted from the alias)."""

    @functools.wraps(new)
    def alias(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            deprecation_message(old_name, new_name), DeprecationWarning, stacklevel=stacklevel
        )
        return new(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old_name.rpartition(".")[2]
    alias.__doc__ = f"Deprecated: use ``{new_name}``."
    return alias

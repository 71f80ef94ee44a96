"""Looking a record up by name in one of the registries (engines, targets...), with the error a
user can act on when the name is not there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from mhsa.errors import InputError

__all__ = ["lazy_exports", "lookup"]

Spec = TypeVar("Spec")


def lookup(
    table: Mapping[str, Spec],
    name: object,
    what: str,
    *,
    error: type[Exception] = InputError,
    message: str | None = None,
) -> Spec:
    """``table[name]``.

    Args:
        table: a registry: names -> records.
        name: the name asked for (anything: it may come from a user or a link).
        what: what the records are, for the message ("engine", "target").
        error: the exception to raise (``ValueError`` where a setting is checked).
        message: the message instead of "Unknown {what} ...: choose one of ...".

    Raises:
        InputError: (or ``error``) there is no such name; the message lists the names there are.
    """
    spec = table.get(name) if isinstance(name, str) else None
    if spec is None:
        choices = ", ".join(table)
        raise error(message or f"Unknown {what} {name!r}: choose one of {choices}.")
    return spec


def lazy_exports(package: str, exports: Mapping[str, str]):
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) that import each exported name from
    the module that defines it on first use: ``exports`` maps a name to that module's path.

    Importing a package then costs nothing, and no package's ``__init__`` imports its own
    modules (which would make ``import package.module`` run them all and risk import cycles).
    """
    import importlib

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted(set(exports) | set(vars(importlib.import_module(package))))

    return __getattr__, __dir__

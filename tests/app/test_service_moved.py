"""``ui.service`` was split into ``ui.core``, ``ui.runtime``, ``ui.exports`` and ``ui/views/``:
every old name still resolves for one release, to the very object of its new home, with a
``DeprecationWarning`` that names that home."""

from __future__ import annotations

import importlib

import pytest

from ui import service


@pytest.mark.parametrize("name", sorted(service.MOVED))
def test_each_old_name_warns_and_is_the_new_object(name: str) -> None:
    home = service.MOVED[name]
    with pytest.warns(DeprecationWarning, match=rf"use {home}\.{name} "):
        old = getattr(service, name)
    assert old is getattr(importlib.import_module(home), name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'not_there'"):
        service.not_there  # noqa: B018


def test_old_callers_keep_working() -> None:
    """A caller written against ``ui.service`` (a branch in flight) computes the same value."""
    from ui.exports import file_stem

    with pytest.warns(DeprecationWarning):
        query = service.Query("Hi there.", model="org/My Model", engine="mhsa")
        old = service.file_stem(query)
    assert old == file_stem(query) and old.endswith("-My_Model-mhsa")

"""Exceptions that carry a message a user can act on."""

from __future__ import annotations


class MHSAError(ValueError):
    """Base class: bad input or a model that cannot be used, with a message saying what to do."""


class InputError(MHSAError):
    """The text (or another argument) cannot be processed as given."""


class ModelLoadError(MHSAError):
    """The model cannot be found, loaded or used for attention."""


class UnsupportedModelError(MHSAError):
    """The model loads, but the requested engine cannot handle its architecture."""

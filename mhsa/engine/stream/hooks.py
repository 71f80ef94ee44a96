"""The one place that puts torch hooks on a model's modules: a hook is described by a ``Hook``
(which module, before or after it runs, the function) and ``hooked`` registers a list of them for
the length of a ``with`` block, removing every one however the block ends.

``StopPass`` ends a pass early: a hook raises it once what is wanted is in (the layers above
change nothing observed), and ``hooked(..., stop=True)`` swallows it at the end of the block.
The stream recorder (``mhsa.engine.stream.record``) and every run that observes or replaces a
module's input or output (the runs of ``mhsa.engine.runs``, the circuits' runs) go through here;
``tests/test_layers.py`` checks that no other module registers a hook.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

__all__ = ["Hook", "StopPass", "after", "before", "hooked", "stop_after", "stop_before"]


class StopPass(Exception):
    """Raised by a hook to end a pass once what it wanted is in: the rest of the model changes
    nothing observed."""


@dataclass(frozen=True)
class Hook:
    """One hook: ``fn`` runs before (``"pre"``) or after (``"post"``) ``module``.

    Attributes:
        module: the module hooked.
        when: ``"pre"``: ``fn(module, args)`` (``fn(module, args, kwargs)`` with ``kwargs``)
            before its forward, returning None or replaced inputs as torch's forward pre-hooks
            do; ``"post"``: ``fn(module, args, output)`` (``fn(module, args, kwargs, output)``
            with ``kwargs``) after it, returning None or a replaced output.
        fn: the function.
        kwargs: whether ``fn`` also gets the keyword arguments of the call.
    """

    module: nn.Module
    when: Literal["pre", "post"]
    fn: Callable[..., Any]
    kwargs: bool = False

    def register(self) -> Any:
        """Put the hook on its module; returns torch's handle."""
        if self.when == "pre":
            return self.module.register_forward_pre_hook(self.fn, with_kwargs=self.kwargs)
        return self.module.register_forward_hook(self.fn, with_kwargs=self.kwargs)


def before(module: nn.Module, fn: Callable[..., Any], *, kwargs: bool = False) -> Hook:
    """A hook that runs ``fn`` before ``module``'s forward."""
    return Hook(module, "pre", fn, kwargs)


def after(module: nn.Module, fn: Callable[..., Any], *, kwargs: bool = False) -> Hook:
    """A hook that runs ``fn`` after ``module``'s forward."""
    return Hook(module, "post", fn, kwargs)


def _stop(*_args: Any) -> None:
    raise StopPass


def stop_after(module: nn.Module) -> Hook:
    """A hook that ends the pass once ``module`` has run."""
    return Hook(module, "post", _stop)


def stop_before(module: nn.Module) -> Hook:
    """A hook that ends the pass before ``module`` runs."""
    return Hook(module, "pre", _stop)


@contextmanager
def hooked(hooks: Sequence[Hook], *, stop: bool = False) -> Iterator[None]:
    """Every hook of ``hooks`` on its module inside the block, all removed at its end (also when
    the block raises). ``stop``: a ``StopPass`` raised inside the block ends the block quietly."""
    handles = []
    try:
        for hook in hooks:
            handles.append(hook.register())
        yield
    except StopPass:
        if not stop:
            raise
    finally:
        for handle in handles:
            handle.remove()

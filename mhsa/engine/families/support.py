"""Which tools run on which model families: the README's "Models" table, generated from the
registry (``mhsa.engine.families.registry.FAMILIES``) and the tools below, and the list of tools an
unsupported
model misses.

A tool runs on a family when the family's layout comes in a kind of model (``Family.kinds``:
encoder, decoder, encoder-decoder) the tool covers, unless the tool names the family as one it
leaves out (``Tool.except_families``). ``tests/test_family_tools.py`` runs every
tool on a tiny random model of every family, saved to a folder and opened by path, and checks
that each claimed cell runs and each unclaimed one is refused with a message: the table cannot
claim what does not run.
"""

from __future__ import annotations

from dataclasses import dataclass

from mhsa.engine.families.registry import FAMILIES, Family

__all__ = ["KINDS", "TOOLS", "Tool", "models_table", "runs_on", "tools_needing_our_module"]

#: the kinds of model a family's layout comes in
KINDS = ("encoder", "decoder", "encoder-decoder")


@dataclass(frozen=True)
class Tool:
    """A tool of the app and the library, as the Models table lists it.

    Attributes:
        name: a short key (``"dla"``).
        label: the table's column header.
        kinds: the kinds of model it covers.
        needs_our_module: whether it runs through our module (``mhsa.engine.runs.swap``): models of
        an
            unsupported family cannot use it; the others run on any model.
        except_families: families of those kinds whose layout the tool does not cover
            (``Family.name``).
    """

    name: str
    label: str
    kinds: tuple[str, ...]
    needs_our_module: bool = True
    except_families: tuple[str, ...] = ()


_ALL = KINDS
_SINGLE_STREAM = ("encoder", "decoder")

#: every tool, in the table's column order
TOOLS: tuple[Tool, ...] = (
    Tool("heatmaps", "heatmaps, statistics, rollout (transformers engine)", _ALL, False),
    Tool("roles", "head roles", _ALL, False),
    Tool("engine", "engine mhsa (verified)", _ALL),
    Tool("knock-outs", "knock-outs", _ALL),
    Tool("importance", "importance, pruning", _ALL),
    Tool("value-norms", "value norms", _SINGLE_STREAM),
    Tool("composition", "composition", _SINGLE_STREAM),
    Tool("patching", "patching z/q/k/v/pattern", _SINGLE_STREAM),
    Tool("attribution-patching", "attribution patching", _ALL),
    Tool("dla", "direct logit attribution", ("decoder",)),
    Tool("logit-lens", "logit lens", ("decoder",)),
    Tool("flow", "information flow", ("decoder",)),
    # a pre-norm stream (decoders, ModernBERT), a post-norm encoder's through its frozen norms,
    # an encoder-decoder's self-attention in either layout (its cross-attention refused)
    Tool("qk-attribution", "why here? (QK attribution)", _ALL),
)


def runs_on(tool: Tool, family: Family) -> bool:
    """Whether ``tool`` covers a kind of model ``family``'s layout comes in (and does not leave
    the family out)."""
    if family.name in tool.except_families:
        return False
    return any(kind in tool.kinds for kind in family.kinds)


def tools_needing_our_module() -> tuple[str, ...]:
    """The labels of the tools an unsupported model cannot use."""
    return tuple(t.label for t in TOOLS if t.needs_our_module)


def models_table() -> str:
    """The README's family x tool table (Markdown), one row per registered family."""
    header = ["family", "models", *(t.label for t in TOOLS)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for family in FAMILIES:
        models = family.layout.rsplit(": ", 1)[-1] if ": " in family.layout else family.name
        cells = ["yes" if runs_on(t, family) else "-" for t in TOOLS]
        lines.append("| " + " | ".join([family.name, models, *cells]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m mhsa.engine.families.support: print the table for README.md
    print(models_table(), end="")

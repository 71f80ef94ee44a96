"""The command line, ``python -m mhsa COMMAND ...``: what the pages do, without the browser.

One module per command, named as the command, its parser beside its handler: ``HELP`` (and
``DESCRIPTION``), ``EXAMPLES`` (``--help`` ends with them), ``add_arguments(parser)`` and
``run(args)``; ``common.add_command`` makes the subcommand of each. A new command is a module
here and one entry in ``COMMANDS`` (for example ``circuit``: ``mhsa/cli/circuit.py``). Bad
arguments and every ``MHSAError`` end in one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from mhsa.cli import (
    atlas,
    attend,
    circuit,
    explain,
    flow,
    importance,
    info,
    patch,
    qk,
    roles,
    stats,
    store,
    train,
    weights,
)
from mhsa.cli.common import Parser, add_command, check_outputs
from mhsa.errors import MHSAError

__all__ = ["COMMANDS", "main", "parser"]

#: every command, in the order ``--help`` lists them
COMMANDS = (
    attend,
    info,
    stats,
    importance,
    train,
    roles,
    weights,
    qk,
    patch,
    flow,
    circuit,
    atlas,
    explain,
    store,
)


def parser() -> argparse.ArgumentParser:
    """The command line: each command module adds its subcommand (which names its ``run``)."""
    examples = "".join(f"  {e}\n" for command in COMMANDS for e in command.EXAMPLES)
    top = Parser(
        prog="python -m mhsa",
        description="Multi-head self-attention explorer: per-head attention from real models.",
        epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        add_command(subparsers, command)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one command; 0 on success (errors exit 2 with one line)."""
    cli = parser()
    args = cli.parse_args(argv)
    try:
        check_outputs(args)
        args.run(args)
    except MHSAError as e:
        cli.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())

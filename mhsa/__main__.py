"""``python -m mhsa COMMAND ...``: the command line (``mhsa.cli``, one module per command)."""

from __future__ import annotations

import sys

from mhsa.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())

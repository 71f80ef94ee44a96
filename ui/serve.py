"""Serve the app as a deployment runs it: check the operator's settings, then start Streamlit
with the production settings of ``.streamlit/config.toml`` (no source watcher, no full garbage
collection after each run; see BENCHMARKS.md §8).

    python -m ui.serve [--dev] [Streamlit options, e.g. --server.port=8502]

``--dev`` turns live reload back on (the source watcher and rerun on save) for working on the
code. ``scripts/run-app.sh``, the Docker image and compose start the app through this module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mhsa.jobs import max_heavy_from_env

APP = Path(__file__).resolve().parents[1] / "app.py"
#: what ``--dev`` adds: Streamlit's live reload
DEV_OPTIONS = ("--server.fileWatcherType=auto", "--server.runOnSave=true")


def check_settings() -> list[str]:
    """The operator's settings that stop the server from starting, as messages."""
    problems = []
    try:
        max_heavy_from_env()
    except ValueError as e:
        problems.append(str(e))
    return problems


def main(argv: list[str]) -> int:
    problems = check_settings()
    if problems:
        for problem in problems:
            print(f"MHSA Explorer cannot start: {problem}", file=sys.stderr)
        return 2
    dev = "--dev" in argv
    options = [a for a in argv if a != "--dev"]
    command = [sys.executable, "-m", "streamlit", "run", str(APP)]
    command += [*(DEV_OPTIONS if dev else ()), *options]
    os.chdir(APP.parent)  # Streamlit reads .streamlit/config.toml from the working directory
    os.execv(sys.executable, command)
    return 0  # not reached: the process is Streamlit's now


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Serve the app as a deployment runs it: check the operator's settings, then start Streamlit
with the production settings of ``.streamlit/config.toml`` (no source watcher, no full garbage
collection after each run) and ``PRODUCTION_ENV`` (malloc's arenas); see BENCHMARKS.md §8.

    python -m ui.serve [--dev] [Streamlit options, e.g. --server.port=8502]

``--dev`` turns live reload back on (the source watcher and rerun on save) for working on the
code. ``scripts/run-app.sh``, the Docker image and compose start the app through this module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mhsa.corpus.jobs import max_heavy_from_env
from mhsa.engine.models.store import Store, StoreError

APP = Path(__file__).resolve().parents[1] / "app.py"
#: the process environment a deployment runs with, unless the operator sets these: glibc's
#: malloc keeps at most 2 arenas (its default is 8 per core, each holding on to pages freed by
#: the threads Streamlit starts for page runs until ``ui.runtime.release_freed_memory``; 18 MB
#: lower on 2 cores, more on more cores; BENCHMARKS.md §8)
PRODUCTION_ENV = {"MALLOC_ARENA_MAX": "2"}
#: what ``--dev`` adds: Streamlit's live reload
DEV_OPTIONS = ("--server.fileWatcherType=auto", "--server.runOnSave=true")


def check_settings() -> list[str]:
    """The operator's settings that stop the server from starting, as messages: a bad
    ``MHSA_MAX_HEAVY``; a store (``MHSA_STORE``) that is not writable or a newer version wrote,
    or a bad ``MHSA_STORE_MB``."""
    problems = []
    try:
        max_heavy_from_env()
    except ValueError as e:
        problems.append(str(e))
    try:  # opening the store also removes what writers killed mid-save left behind
        store = Store.from_env()
        if store is not None:
            store.check_writable()
    except StoreError as e:
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
    for name, value in PRODUCTION_ENV.items():
        os.environ.setdefault(name, value)  # read by glibc when the new process image starts
    os.execv(sys.executable, command)
    return 0  # not reached: the process is Streamlit's now


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

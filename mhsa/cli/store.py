"""``store``: list, remove or clean the store of trained models and atlases (``MHSA_STORE``,
``mhsa.engine.models.store``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mhsa.errors import MHSAError

EXAMPLES = (
    "python -m mhsa store list",
    "python -m mhsa store remove trained:0123456789ab",
    "python -m mhsa store clean --store /data",
)
HELP = "list, remove or clean the store of trained models and atlases (MHSA_STORE)"
DESCRIPTION = (
    "The store is the folder MHSA_STORE names (or --store). list: every entry, its size, when it "
    "was made and last used, and one line per damaged entry; remove ID: one entry (trained:<id>, "
    "KIND/ID, or an id); clean: the leftovers of killed writers and the damaged entries."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list", "remove", "clean"])
    parser.add_argument("id", nargs="?", default=None, help="remove: the entry")
    parser.add_argument("--store", type=Path, default=None, help="the folder (default: MHSA_STORE)")


def _open(args: argparse.Namespace):
    from mhsa.engine.models.store import Store, store_mb, store_root

    root = args.store or store_root()
    if root is None:
        raise MHSAError("No store: set MHSA_STORE to its folder, or give --store FOLDER.")
    if not root.is_dir():
        raise MHSAError(f"No store at {str(root)!r}: the folder does not exist.")
    return Store(root, max_mb=store_mb())


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(seconds))


def _entry_of(store, name: str) -> tuple[str, str]:
    """(kind, id) of ``name``: ``trained:<id>``, ``KIND/ID``, or an id of any kind."""
    from mhsa.engine.models.names import TRAINED_PREFIX

    if name.startswith(TRAINED_PREFIX):
        return "trained", name.removeprefix(TRAINED_PREFIX)
    if "/" in name:
        kind, _, entry_id = name.partition("/")
        return kind, entry_id
    kinds = [k for k in store.kinds() if (store.root / k / name).is_dir()]
    if len(kinds) != 1:
        where = f"several kinds ({', '.join(kinds)}): name it KIND/ID" if kinds else "no entry"
        raise MHSAError(f"{name!r} names {where} in the store.")
    return kinds[0], name


def run(args: argparse.Namespace) -> None:
    store = _open(args)
    if args.action == "remove":
        if not args.id:
            raise MHSAError("store remove needs the entry's id (store list shows them).")
        kind, entry_id = _entry_of(store, args.id)
        store.remove(kind, entry_id)
        print(f"removed {kind}/{entry_id}")
    elif args.action == "clean":
        lines = store.clean()
        print("\n".join(lines) if lines else "nothing to clean")
    else:
        _list(store)


def _list(store) -> None:
    import logging

    logging.getLogger("mhsa.store").disabled = True  # its one-line reports: printed here
    entries, problems = store.scan()
    mb = 2**20
    for e in entries:
        settings = " ".join(f"{k}={v}" for k, v in sorted(e.settings.items()))
        created = e.manifest.get("created", "?")
        print(
            f"{e.kind}/{e.id}  {e.bytes / mb:6.2f} MB  made {created}  used {_when(e.used)}  "
            f"{settings}".rstrip()
        )
    for line in problems:
        print(line)
    bound = f" of {store.max_mb} MB (MHSA_STORE_MB)" if store.max_mb else ""
    total = sum(e.bytes for e in entries) / mb
    count = f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
    print(f"{count}, {total:.2f} MB{bound}, in {store.root}")

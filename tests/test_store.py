"""The store (``mhsa.engine.models.store``) with real processes: entries whole or not at all (a
writer
killed with SIGKILL mid-save leaves nothing listed, and its leftovers go at the next open, not
while it lives), two processes building one id build it once, the least recently used go first
under the bound and never a pinned one (pinned by another process too), a write that cannot
fit is refused saying what to raise, bad entries are skipped in one line each; and the command
line that manages it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mhsa.cli import main
from mhsa.engine.models.store import EntryMissingError, Store, StoreError, StoreFullError
from tests.test_jobs import start_server

ROOT = Path(__file__).resolve().parents[1]
KB = 1024


def _spawn(code: str, *args: str) -> subprocess.Popen:
    """Another Python process running ``code`` (``sys.argv[1:]`` are ``args``) in this
    checkout; its stdout is a pipe the test reads lines from."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def _write(store: Store, entry_id: str, size: int, kind: str = "atlas") -> None:
    with store.writing(kind, entry_id, {"size": size}) as folder:
        (folder / "data.bin").write_bytes(b"x" * size)


def _tmp(root: Path) -> list[str]:
    return sorted(p.name for p in (root / ".tmp").iterdir())


def test_an_entry_is_listed_with_its_manifest_once_whole(tmp_path) -> None:
    store = Store(tmp_path / "s")
    with store.writing("trained", "0123456789ab", {"task": "copy", "steps": 30}) as folder:
        (folder / "model").mkdir()
        (folder / "model" / "weights.bin").write_bytes(b"w" * 3000)
        (folder / "model" / "config.json").write_text("{}")
        assert store.entries() == []  # nothing listed while it is written
        assert store.problems() == []
    (entry,) = store.entries()
    on_disk = {
        str(p.relative_to(entry.folder)): p.stat().st_size
        for p in entry.folder.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    manifest = json.loads((entry.folder / "manifest.json").read_text())
    assert (entry.kind, entry.id, entry.folder) == (
        "trained",
        "0123456789ab",
        store.root / "trained" / "0123456789ab",
    )
    assert manifest["files"] == on_disk == {"model/weights.bin": 3000, "model/config.json": 2}
    assert manifest["bytes"] == 3002 and manifest["settings"] == {"task": "copy", "steps": 30}
    assert manifest["versions"]["torch"] and manifest["created"].endswith("+00:00")
    assert _tmp(store.root) == []


def test_an_error_while_writing_leaves_nothing(tmp_path) -> None:
    store = Store(tmp_path)
    with pytest.raises(RuntimeError, match="disk full"), store.writing("atlas", "a") as folder:
        (folder / "half.bin").write_bytes(b"x" * 100)
        raise RuntimeError("disk full")
    assert store.entries() == [] and store.problems() == [] and _tmp(tmp_path) == []


_KILLED_MID_SAVE = """
import sys, time
from mhsa.engine.models.store import Store
store = Store(sys.argv[1])
with store.writing("atlas", "half", {}) as folder:
    (folder / "part-1.bin").write_bytes(b"x" * 1000)
    print("writing", flush=True)
    time.sleep(60)
"""


def test_a_writer_killed_mid_save_leaves_nothing_listed_and_its_leftovers_go_next_start(
    tmp_path,
) -> None:
    _write(Store(tmp_path), "whole", 10)
    writer = _spawn(_KILLED_MID_SAVE, str(tmp_path))
    try:
        assert writer.stdout.readline().strip() == "writing"
        (leftover,) = _tmp(tmp_path)
        assert leftover.startswith("atlas--half--")
        Store(tmp_path)  # another process opens the store: the live writer's folder stays
        assert _tmp(tmp_path) == [leftover]
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    store = Store(tmp_path)  # the next start: its lock is free, its folder goes
    assert _tmp(tmp_path) == []
    assert [e.id for e in store.entries()] == ["whole"] and store.problems() == []
    with pytest.raises(EntryMissingError):
        store.get("atlas", "half")


_BUILDER = """
import sys, time
from pathlib import Path
from mhsa.engine.models.store import Store
store, log = Store(sys.argv[1]), Path(sys.argv[2])
if sys.argv[3] == "0":
    sys.stdin.readline()  # the test says when: once the other holds the lock

def build(folder):
    print("building", flush=True)
    with log.open("a") as fh:
        fh.write("built\\n")
    time.sleep(float(sys.argv[3]))
    (folder / "atlas.bin").write_bytes(b"a" * 500)

entry = store.get_or_build("atlas", "shared", build, {"by": sys.argv[3]})
print("got", entry.manifest["created"], entry.settings["by"], flush=True)
"""


def test_two_processes_building_one_id_build_it_once(tmp_path) -> None:
    store, log = tmp_path / "store", tmp_path / "builds.log"
    first = _spawn(_BUILDER, str(store), str(log), "1.5")
    second = _spawn(_BUILDER, str(store), str(log), "0")
    assert first.stdout.readline().strip() == "building"  # it holds the id's lock now
    second.stdin.write("go\n")
    second.stdin.flush()
    out_first, _ = first.communicate(timeout=60)
    out_second, _ = second.communicate(timeout=60)
    assert log.read_text() == "built\n"  # one build
    assert out_first.split() == out_second.split()[:4] == out_second.split()
    assert out_second.split()[-1] == "1.5"  # the second reuses the first's entry
    assert first.returncode == second.returncode == 0


_PINNER = """
import sys, time
from mhsa.engine.models.store import Store
with Store(sys.argv[1]).pinned("atlas", sys.argv[2]):
    print("pinned", flush=True)
    time.sleep(60)
"""


def test_the_least_recently_used_go_first_never_a_pinned_one(tmp_path) -> None:
    store = Store(tmp_path, max_mb=1)
    for name in ("a", "b", "c"):
        _write(store, name, 300 * KB)
        time.sleep(0.01)
    store.get("atlas", "a")  # used: b is now the oldest
    _write(store, "d", 300 * KB)
    assert [e.id for e in store.entries()] == ["c", "a", "d"]  # least recently used first
    reader = _spawn(_PINNER, str(tmp_path), "c")  # another process reads c
    try:
        assert reader.stdout.readline().strip() == "pinned"
        _write(store, "e", 300 * KB)
        # a went, not the pinned c (which its reader used last: pinning is using)
        assert [e.id for e in store.entries()] == ["d", "c", "e"]
        with (
            store.pinned("atlas", "d"),
            store.pinned("atlas", "e"),
            pytest.raises(StoreFullError) as full,
        ):
            _write(store, "f", 600 * KB)
        with pytest.raises(StoreError, match="in use on a server"):
            store.remove("atlas", "c")
    finally:
        reader.send_signal(signal.SIGKILL)
        reader.wait()
    assert str(full.value) == (
        "The store has no room for this 0.6 MB: it holds at most 1 MB (MHSA_STORE_MB), and "
        "0.9 MB of it are entries in use right now. Raise MHSA_STORE_MB to at least 2, or "
        "remove entries (python -m mhsa store list, then store remove ID)."
    )
    assert [e.id for e in store.entries()] == ["c", "d", "e"] and _tmp(tmp_path) == []
    _write(store, "f", 600 * KB)  # its reader died: its pin went with it
    assert [e.id for e in store.entries()] == ["e", "f"]


def test_bad_entries_are_skipped_in_one_line_each(tmp_path, caplog) -> None:
    store = Store(tmp_path)
    for name in ("good", "garbled", "deleted", "truncated", "newer"):
        _write(store, name, 100)
    (tmp_path / "atlas" / "garbled" / "manifest.json").write_text('{"kind": "atl')
    (tmp_path / "atlas" / "deleted" / "data.bin").unlink()
    (tmp_path / "atlas" / "truncated" / "data.bin").write_bytes(b"x" * 10)
    newer = tmp_path / "atlas" / "newer" / "manifest.json"
    newer.write_text(json.dumps({**json.loads(newer.read_text()), "format": 99}))
    (tmp_path / "atlas" / "bare").mkdir()  # copied in by hand: no manifest
    with caplog.at_level("WARNING", logger="mhsa.store"):
        assert [e.id for e in store.entries()] == ["good"]
    why = {line.split()[2]: line for line in store.problems()}
    assert sorted(why) == [
        "atlas/bare",
        "atlas/deleted",
        "atlas/garbled",
        "atlas/newer",
        "atlas/truncated",
    ]
    assert "no manifest.json" in why["atlas/bare"]
    assert "manifest.json cannot be read (JSONDecodeError" in why["atlas/garbled"]
    assert "its file data.bin is missing" in why["atlas/deleted"]
    assert "data.bin has 10 bytes where the manifest says 100" in why["atlas/truncated"]
    assert "a newer version wrote it (entry format 99" in why["atlas/newer"]
    assert all("\n" not in line for line in why.values())
    assert len(caplog.records) == 5  # reported once each, however often listed
    with pytest.raises(EntryMissingError, match=r"skipped: its file data\.bin is missing"):
        store.get("atlas", "deleted")
    removed = store.clean()
    assert len(removed) == 4 and not any("newer" in line for line in removed)
    assert sorted(p.name for p in (tmp_path / "atlas").iterdir()) == ["good", "newer"]


def test_a_store_a_newer_version_wrote_or_an_unusable_folder_is_refused(tmp_path) -> None:
    (tmp_path / "store.json").write_text('{"format": 7}')
    with pytest.raises(StoreError, match=r"newer version of MHSA Explorer .*format 7"):
        Store(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match=r"'.*file/store' \(MHSA_STORE\) is not writable"):
        Store(tmp_path / "file" / "store")


@pytest.mark.parametrize(
    ("kind", "entry_id"),
    [
        ("atlas", "../x"),
        ("atlas", ".hidden"),
        ("atlas", "a--b"),
        ("atlas", ""),
        ("../t", "a"),
        ("atlas", "a/b"),
    ],
)
def test_names_that_would_leave_the_store_are_refused(tmp_path, kind, entry_id) -> None:
    store = Store(tmp_path)
    with pytest.raises(StoreError, match=r"no (kind of )?store entry"):
        store.path(kind, entry_id)


def test_the_command_line_lists_removes_and_cleans(tmp_path, monkeypatch, capsys) -> None:
    store = Store(tmp_path)
    _write(store, "one", 2 * 2**20)
    _write(store, "0123456789ab", 100, kind="trained")
    (tmp_path / "atlas" / "one" / "data.bin").unlink()
    monkeypatch.setenv("MHSA_STORE", str(tmp_path))
    main(["store", "list"])
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0].startswith("trained/0123456789ab    0.00 MB  made 20") and "size=100" in lines[0]
    )
    assert lines[1].startswith("store entry atlas/one skipped: its file data.bin is missing")
    assert lines[2] == f"1 entry, 0.00 MB of 2048 MB (MHSA_STORE_MB), in {tmp_path}"
    main(["store", "remove", "trained:0123456789ab"])
    main(["store", "clean"])
    assert capsys.readouterr().out.splitlines() == [
        "removed trained/0123456789ab",
        "removed atlas/one: its file data.bin is missing",
    ]
    with pytest.raises(SystemExit):
        main(["store", "remove", "nothing"])
    assert "'nothing' names no entry in the store" in capsys.readouterr().err
    monkeypatch.delenv("MHSA_STORE")
    with pytest.raises(SystemExit):
        main(["store", "list"])
    assert "No store: set MHSA_STORE" in capsys.readouterr().err


def test_the_server_refuses_to_start_on_a_store_it_cannot_use(tmp_path, monkeypatch) -> None:
    """``ui.serve`` checks the store before Streamlit starts: one line, exit code 2."""
    from ui.serve import check_settings

    (tmp_path / "file").write_text("")
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "store.json").write_text('{"format": 2}')
    monkeypatch.setenv("MHSA_STORE", str(newer))
    (problem,) = check_settings()
    assert "written by a newer version of MHSA Explorer (store format 2" in problem
    monkeypatch.setenv("MHSA_STORE", str(tmp_path / "ok"))
    monkeypatch.setenv("MHSA_STORE_MB", "lots")
    assert check_settings() == [
        "MHSA_STORE_MB='lots' is not a whole number of megabytes (1 or more)"
    ]
    monkeypatch.delenv("MHSA_STORE_MB")
    assert check_settings() == [] and (tmp_path / "ok" / "store.json").is_file()
    done = start_server(MHSA_STORE=str(tmp_path / "file" / "store"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"MHSA Explorer cannot start: The store folder '{tmp_path}/file/store' (MHSA_STORE) is "
        "not writable (Not a directory): give a folder the server's user may write, or unset "
        "MHSA_STORE."
    )

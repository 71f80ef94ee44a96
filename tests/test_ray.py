"""The Ray backend on a local Ray instance of 2 CPUs started by the tests: the same numbers as the
local path, also after an actor is killed mid-run, and every bad entry reported."""

from __future__ import annotations

import socket

import numpy as np
import pandas as pd
import pytest
import ray

from mhsa.__main__ import main
from mhsa.corpus.distributed import RayTask, check_reachable, run_on_ray
from mhsa.corpus.stats import corpus_stats
from mhsa.engine.runs.batches import Corpus, Problem
from mhsa.errors import InputError
from tests.test_corpus import MIXED

pytestmark = pytest.mark.slow  # a local Ray instance: its start alone takes seconds


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_equals_the_local_path_after_an_actor_is_killed(local_ray, minilm, tmp_path) -> None:
    entries = Corpus.of([*MIXED, "word " * 600], source="c.txt").entries
    corpus = Corpus(entries, [Problem("c.txt:99", "not UTF-8 text")], "c.txt")
    marker = tmp_path / "killed"
    task = RayTask("stats", "default", {"similarity": "js"}, fail_once=str(marker))
    seen = []
    got = run_on_ray(task, corpus, workers=2, shard_size=5, progress=lambda d, t: seen.append(d))
    assert marker.exists() and int(marker.read_text()) > 0  # an actor really died mid-run
    local = corpus_stats(entries, model=minilm, similarity="js")
    assert got.used == local.used == len(MIXED)
    too_long = f"c.txt:{len(MIXED) + 1}"
    assert sorted(p.where for p in got.problems) == sorted([too_long, "c.txt:99"])
    assert seen[-1] == len(entries)  # progress reached every sentence
    a, b = got.stats.frame(), local.stats.frame()
    numeric = a.select_dtypes("number").columns
    np.testing.assert_allclose(a[numeric], b[numeric], rtol=0, atol=1e-6)
    assert (a["role"] == b["role"]).all()
    np.testing.assert_allclose(got.similarity.frame(), local.similarity.frame(), atol=1e-6)


def test_cli_importance_on_ray_reads_parquet_and_equals_local(local_ray, tmp_path, capsys) -> None:
    path = tmp_path / "corpus.parquet"
    pd.DataFrame({"text": [*MIXED[:5], None]}).to_parquet(path)
    ray_out, local_out = tmp_path / "ray.csv", tmp_path / "local.csv"
    base = ["importance", str(path), "--method", "ablation"]
    assert main([*base, "--out", str(ray_out), "--ray", "--workers", "2", "--shard-size", "2"]) == 0
    printed = capsys.readouterr()
    assert "1 entries not used" in printed.err and "corpus.parquet:row 6" in printed.err
    assert "(5 texts, 72 heads, ablation, embedding)" in printed.out
    assert main([*base, "--out", str(local_out), "--one-by-one"]) == 0
    got = pd.read_csv(ray_out, index_col="name")
    want = pd.read_csv(local_out, index_col="name")
    np.testing.assert_allclose(got["importance"], want["importance"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["std"], want["std"], rtol=0, atol=1e-6)
    assert want["importance"].max() > 1e-3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_cluster_is_a_clear_error_not_a_wait(monkeypatch, tmp_path, capsys) -> None:
    port = _free_port()  # nothing listens there: Ray itself would retry for minutes
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: pytest.fail("ray.init ran for a dead address"))
    path = tmp_path / "c.txt"
    path.write_text("The cat sat on the mat.\n")
    out = tmp_path / "stats.csv"
    with pytest.raises(SystemExit) as exited:
        main(["stats", str(path), "--out", str(out), "--ray", f"127.0.0.1:{port}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # the message alone: no progress bar, no traceback
    assert f"Cannot reach Ray at 127.0.0.1:{port}" in err and "ray start --head" in err
    assert "Traceback" not in err and not out.exists()


def test_cluster_addresses_are_checked_before_ray_waits_on_them(monkeypatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_reachable(f"127.0.0.1:{port}")  # a listening head passes
        check_reachable(f"ray://127.0.0.1:{port}")
    with pytest.raises(InputError, match="Cannot reach Ray"):
        check_reachable(f"ray://127.0.0.1:{port}")  # closed now
    for bad in ["127.0.0.1", "head:port", "head:70000", ":6379"]:
        with pytest.raises(InputError, match="host:port, ray://host:port, auto or local"):
            check_reachable(bad)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # what Ray reads without an address
    with pytest.raises(InputError, match=f"Cannot reach Ray at 127.0.0.1:{port}"):
        check_reachable(None)
    monkeypatch.delenv("RAY_ADDRESS")

    def refuse(*args, **kwargs):
        raise AssertionError("no connection is tried for these")

    monkeypatch.setattr(socket, "create_connection", refuse)
    for address in [None, "", "auto", "local"]:
        check_reachable(address)  # a new local instance, or Ray's own lookup


def test_an_atlas_built_on_ray_equals_the_local_one(local_ray, tmp_path) -> None:
    """The head atlas's shards computed by two Ray actors (on the module's instance) give the
    local build's atlas (``mhsa.atlas``; floats within rounding: other threads)."""
    from mhsa.atlas import build_atlas, open_atlas
    from mhsa.atlas.corpora import task_corpus
    from tests.test_atlas import _same

    texts = task_corpus("induction", count=12, seed=7)
    local = tmp_path / "local"
    build_atlas(texts, local, model="toy:induction", top_k=4, progress=False, shard_texts=3)
    on_ray = tmp_path / "ray"
    atlas = build_atlas(
        texts,
        on_ray,
        model="toy:induction",
        top_k=4,
        progress=False,
        shard_texts=3,
        ray=True,
        workers=2,
    )
    assert atlas.manifest["ray"] is True
    _same(local, on_ray, exact=False)
    mine, theirs = open_atlas(local).top("L1H0", 4), atlas.top("L1H0", 4)
    assert mine[["text_id", "query", "key"]].equals(theirs[["text_id", "query", "key"]])


def test_a_tagged_atlas_built_on_ray_keeps_the_same_tags(
    local_ray, tmp_path, tiny_bert_path
) -> None:
    """The actors receive the corpus's words and tags with its texts: the same tag per token
    as the local build (``tests/test_atlas_tags.py``'s hand-tagged texts)."""
    from mhsa.atlas import build_atlas
    from tests.test_atlas_tags import CORPUS, HAND

    settings = {"model": tiny_bert_path, "top_k": 4, "progress": False, "shard_texts": 2}
    local = build_atlas(CORPUS, tmp_path / "local", **settings)
    on_ray = build_atlas(CORPUS, tmp_path / "ray", ray=True, workers=2, **settings)
    assert on_ray.manifest["ray"] is True and on_ray.has_tags
    for t in range(len(CORPUS)):
        assert on_ray.tags(t) == local.tags(t)
    assert on_ray.tags(4) == HAND[4]

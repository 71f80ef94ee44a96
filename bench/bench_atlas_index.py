"""The atlas index's settings against each other on one built atlas (with its approximate
index): the atlas's own random-projection index re-ranking a given number of candidates a
result, and faiss ``IndexIVFPQ`` (the format-1 index) with a given code size, k-means iterations
and lists probed, trained and filled from the atlas's stored head outputs; training and adding
time, recall@10 against exhaustive search over the same stored values (30 tokens), and query
time with the atlas's re-ranking.

    python -m bench.bench_atlas_index ATLAS proj,100 proj,500 ivfpq,4,6,10,64

A trial is ``proj,RERANK`` or ``ivfpq,BITS,SUB_DIMS,ITERATIONS,PROBES`` (ITERATIONS 25:
faiss's default).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np


def projection_trial(atlas, queries, rerank: int) -> dict:
    """The atlas's own index, ``rerank`` candidates a result."""
    from mhsa.atlas import index as atlas_index

    saved, atlas_index.RERANK = atlas_index.RERANK, rerank
    try:
        recalls, start = [], time.perf_counter()
        for q in queries:
            v = atlas.z.rows(np.array([q]))[0]
            got, _ = atlas_index.search_index(atlas._index, atlas.z, v, 11, int(q))
            got = got[got != q][:10]
            want = atlas_index.exact_neighbours(atlas.z, None, v, 10, int(q))[0]
            recalls.append(len(set(want.tolist()) & set(got.tolist())) / 10)
        query = (time.perf_counter() - start) / len(queries)
    finally:
        atlas_index.RERANK = saved
    return {
        "index": "projection",
        "rerank": rerank,
        "recall_at_10": round(float(np.mean(recalls)), 3),
        "query_ms_with_exact_search": round(query * 1000),
    }


def trial(atlas, queries, bits: int, sub_dims: int, iterations: int, probes: int) -> dict:
    import faiss

    from mhsa.atlas.index import CHUNK, RERANK, exact_neighbours

    z = atlas.z
    n = z.tokens
    dims = z.lo.shape[1] * z.lo.shape[2]
    m = next(m for m in range(max(1, dims // sub_dims), dims + 1) if dims % m == 0)
    lists = int(min(256, max(16, math.sqrt(n))))
    index = faiss.IndexIVFPQ(
        faiss.IndexFlatIP(dims), dims, lists, m, bits, faiss.METRIC_INNER_PRODUCT
    )
    index.cp.niter = index.pq.cp.niter = iterations
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    index.train(z.rows(np.sort(rng.choice(n, size=min(n, 40 * lists), replace=False))))
    train = time.perf_counter() - start
    start = time.perf_counter()
    for s in range(0, n, CHUNK):
        index.add(z.rows(slice(s, min(n, s + CHUNK))))
    add = time.perf_counter() - start
    index.nprobe = probes
    truths = {}
    for q in queries:
        v = z.rows(np.array([q]))[0]
        truths[int(q)] = (v, exact_neighbours(z, None, v, 10, int(q))[0])
    recalls, start = [], time.perf_counter()
    for q, (v, want) in truths.items():
        _, cand = index.search(v[None].astype(np.float32), 10 * RERANK)
        cand = np.unique(cand[0][cand[0] >= 0])
        cand = cand[cand != q]
        got = cand[np.lexsort((cand, -(z.rows(cand) @ v)))[:10]]
        recalls.append(len(set(want.tolist()) & set(got.tolist())) / 10)
    query = (time.perf_counter() - start) / len(queries)
    return {
        "bits": bits,
        "sub_dims": sub_dims,
        "iterations": iterations,
        "probes": probes,
        "train_s": round(train, 1),
        "add_s": round(add, 1),
        "recall_at_10": round(float(np.mean(recalls)), 3),
        "query_ms": round(query * 1000),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("atlas")
    parser.add_argument("trials", nargs="+", help="proj,RERANK or ivfpq,BITS,SUB,ITER,PROBES")
    args = parser.parse_args()
    from mhsa.atlas import open_atlas

    atlas = open_atlas(args.atlas)
    queries = np.random.default_rng(1).choice(atlas.tokens, 30, replace=False)
    for spec in args.trials:
        kind, *values = spec.split(",")
        numbers = [int(x) for x in values]
        if kind == "proj":
            print(projection_trial(atlas, queries, *numbers), flush=True)
        else:
            print(trial(atlas, queries, *numbers), flush=True)


if __name__ == "__main__":
    main()

"""The atlas index's settings against each other on one built atlas: faiss ``IndexIVFPQ`` with
a given code size, k-means iterations and lists probed, each trained and filled from the
atlas's stored head outputs; training and adding time, recall@10 against exhaustive search over
the same stored values (30 tokens), and query time with the atlas's re-ranking.

    python -m bench.bench_atlas_index ATLAS 8,12,25,32 8,12,10,32 8,12,10,64 4,6,10,64 4,4,10,64

Each trial is BITS,SUB_DIMS,ITERATIONS,PROBES (ITERATIONS 25: faiss's default).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np


def trial(atlas, queries, bits: int, sub_dims: int, iterations: int, probes: int) -> dict:
    import faiss

    from mhsa.atlas.index import CHUNK, RERANK, exact_neighbours

    z = atlas.z
    n = z.tokens
    dims = z.codes.shape[0] * z.codes.shape[2] * 2
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
    parser.add_argument("trials", nargs="+", help="BITS,SUB_DIMS,ITERATIONS,PROBES")
    args = parser.parse_args()
    from mhsa.atlas import open_atlas

    atlas = open_atlas(args.atlas)
    queries = np.random.default_rng(1).choice(atlas.tokens, 30, replace=False)
    for spec in args.trials:
        bits, sub_dims, iterations, probes = (int(x) for x in spec.split(","))
        print(trial(atlas, queries, bits, sub_dims, iterations, probes), flush=True)


if __name__ == "__main__":
    main()

"""What a head does over a corpus, gathered batch by batch: the per-head summaries of an atlas
(``mhsa.atlas.build`` runs the batches; ``mhsa.atlas.reader`` reads the result).

Every summary is *mergeable*: a shard of the corpus gives the same kind of summary as the whole,
and merging shards in any order gives the whole's (top lists are kept with a total order, the
random sample is a bottom-m sketch of a hash of the pair, the rest are sums). That is what makes
a build resumable and the same on Ray.

Per head, over every (text, query, key) pair a query may attend to (padding and, for causal
models, later keys left out):

- the ``top_k`` pairs by attention weight, and by norm ``alpha_ij * ||f_h(x_j)||`` (Kobayashi et
  al. 2020, "Attention is Not Only a Weight", as ``attend(norms=True)`` computes it; OpenAI's
  Transformer Debugger ranks a head's pairs by the same "attention write norm"), ties broken by
  (text, query, key). Pairs whose query may attend to one key only (a causal model's first
  token: weight 1 by construction) are left out of the lists, the sample and the weight
  histogram;
- a uniform random sample: the ``sample_size`` pairs with the smallest hash of (text, query,
  key), the same pairs for every head;
- histograms: of the weight (20 bins of 0.05), of the attention mass by offset ``key - query``
  (clipped to +-``MAX_OFFSET``), and the mass on keys of each kind (first, special,
  punctuation, previous token, the query itself);
- sums for the head's corpus-wide scores: entropy and distance per query, and TransformerLens's
  detection scores ("mul": attention on the pattern / total attention, per text;
  ``transformer_lens/head_detector.py``) for previous-token, duplicate-token and induction heads.

Per corpus token and head: the strongest key (its position and weight: what ``Atlas.search``
reads) and the head's output ``z`` at that token (TransformerLens's ``hook_z``: the weighted sum
of the values, before ``W_O``; what ``Atlas.similar`` compares, as exBERT does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mhsa.atlas.kernels import summarise_layer

__all__ = [
    "DETECTORS",
    "KEY_KINDS",
    "MAX_OFFSET",
    "WEIGHT_BINS",
    "BatchLayout",
    "HeadSummaries",
    "TopList",
    "pair_hash",
]

#: weight histogram bins: [0, 0.05), [0.05, 0.1) ... [0.95, 1]
WEIGHT_BINS = 20
#: offsets ``key - query`` beyond this are counted at the edge bins
MAX_OFFSET = 64
#: the kinds of key whose attention mass a head keeps (not exclusive)
KEY_KINDS = ("first", "special", "punctuation", "previous", "self")
#: TransformerLens's detection patterns the atlas scores
DETECTORS = ("previous token", "duplicate token", "induction")
#: the columns of a top list
TOP_FIELDS = ("value", "text", "query", "key", "weight", "norm")
#: the uniform sample's arrays
SAMPLED = (
    "sample_hash",
    "sample_text",
    "sample_query",
    "sample_key",
    "sample_weight",
    "sample_norm",
)
#: the summaries that add up over shards
SUMMED = ("weight_hist", "offset_mass", "kind_mass", "entropy", "distance", "detection")

_MASK64 = (1 << 64) - 1


def pair_hash(text: np.ndarray, query: np.ndarray, key: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each (text, query, key) (splitmix64's finaliser): the random order of
    the uniform sample, the same in every process and shard."""
    x = (text.astype(np.uint64) << np.uint64(32)) | (query.astype(np.uint64) << np.uint64(16))
    x = x | key.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


@dataclass
class TopList:
    """The best pairs of each head by one value, in a total order (value descending, then text,
    query, key ascending). Arrays ``[heads, k]``; unused slots have value -inf and text -1."""

    value: np.ndarray
    text: np.ndarray
    query: np.ndarray
    key: np.ndarray
    weight: np.ndarray
    norm: np.ndarray

    @classmethod
    def empty(cls, heads: int, k: int) -> TopList:
        return cls(
            np.full((heads, k), -np.inf, np.float32),
            np.full((heads, k), -1, np.int64),
            np.zeros((heads, k), np.int32),
            np.zeros((heads, k), np.int32),
            np.zeros((heads, k), np.float32),
            np.zeros((heads, k), np.float32),
        )

    def offer(self, head: int, cand: dict[str, np.ndarray]) -> None:
        """Merge candidate pairs (arrays ``value, text, query, key, weight, norm``) into
        ``head``'s list."""
        k = self.value.shape[1]
        cols = TOP_FIELDS
        merged = {c: np.concatenate([getattr(self, c)[head], cand[c]]) for c in cols}
        real = merged["text"] >= 0
        merged = {c: v[real] for c, v in merged.items()}
        order = np.lexsort((merged["key"], merged["query"], merged["text"], -merged["value"]))
        order = order[:k]
        for c in cols:
            row = getattr(self, c)[head]
            row[: len(order)] = merged[c][order]
            if c == "value":
                row[len(order) :] = -np.inf
            elif c == "text":
                row[len(order) :] = -1

    def merge(self, other: TopList) -> TopList:
        for h in range(self.value.shape[0]):
            self.offer(h, {c: getattr(other, c)[h] for c in TOP_FIELDS})
        return self


@dataclass
class BatchLayout:
    """One padded batch as the collector needs it: per row its text id, its length, where its
    tokens go in the shard's token arrays, and per position its token id and kind."""

    text: np.ndarray  # [B] text ids
    lengths: torch.Tensor  # [B]
    starts: np.ndarray  # [B] offset of the row's first token in the shard's token arrays
    ids: torch.Tensor  # [B, T] token ids (padding: -1)
    special: torch.Tensor  # [B, T] bool
    punctuation: torch.Tensor  # [B, T] bool
    causal: bool

    def __post_init__(self) -> None:
        t = self.ids.shape[1]
        pos = torch.arange(t)
        self.valid_query = pos[None, :] < self.lengths[:, None]  # [B, T]
        pair = self.valid_query[:, :, None] & self.valid_query[:, None, :]
        if self.causal:
            pair = pair & torch.ones(t, t, dtype=torch.bool).tril()
        self.valid_pair = pair  # [B, T, T]
        choices = pair.sum(-1)  # keys each query may attend to
        self.ranked_pair = pair & (choices > 1)[:, :, None]  # [B, T, T]
        self.ranked_count = int(self.ranked_pair.sum())
        # what the compiled pass reads (mhsa.atlas.kernels.summarise_layer)
        self.ids_np = self.ids.numpy().astype(np.int64)
        self.key_flags = torch.stack([self.special, self.punctuation], -1).numpy()  # [B, T, 2]
        # the token arrays' index of every valid (row, position)
        rows, cols = self.valid_query.nonzero(as_tuple=True)
        self.rows, self.cols = rows, cols
        self.token_index = torch.from_numpy(self.starts)[rows] + cols


class _Pairs:
    """One layer's weights ``w [B, Hs, T, T]`` and value norms ``vn [B, Hs, T]`` of a batch: a
    pair's weight and norm where they are looked at, every pair's only where a top list's
    candidates need them all (``full``: the pairs no query may attend to at 0)."""

    def __init__(self, w: torch.Tensor, vn: torch.Tensor, layout: BatchLayout) -> None:
        self.w, self.vn, self.layout = w, vn, layout
        self._full: dict[int, torch.Tensor] = {}

    def at(self, row, head, q, k) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights and norms of the pairs ``(row, head, q, k)``."""
        weight = self.w[row, head, q, k]
        return weight, weight * self.vn[row, head, k]

    def full(self, j: int) -> torch.Tensor:
        """Every pair's weight (``j`` 0) or norm (1), ``[B, Hs, T, T]``."""
        if j not in self._full:
            if 0 not in self._full:
                self._full[0] = self.w.masked_fill(~self.layout.valid_pair[:, None], 0.0)
            if j == 1:
                self._full[1] = self._full[0] * self.vn[:, :, None, :]
        return self._full[j]


@dataclass
class HeadSummaries:
    """The mergeable per-head summaries of ``heads`` heads (see the module docstring)."""

    heads: int
    top_k: int
    sample_size: int
    by_weight: TopList = field(init=False)
    by_norm: TopList = field(init=False)
    sample_hash: np.ndarray = field(init=False)  # [m] uint64, ascending
    sample_text: np.ndarray = field(init=False)
    sample_query: np.ndarray = field(init=False)
    sample_key: np.ndarray = field(init=False)
    sample_weight: np.ndarray = field(init=False)  # [m, heads]
    sample_norm: np.ndarray = field(init=False)
    weight_hist: np.ndarray = field(init=False)  # [heads, WEIGHT_BINS] pairs
    offset_mass: np.ndarray = field(init=False)  # [heads, 2 MAX_OFFSET + 1]
    kind_mass: np.ndarray = field(init=False)  # [heads, len(KEY_KINDS)]
    entropy: np.ndarray = field(init=False)  # [heads] summed over queries
    distance: np.ndarray = field(init=False)  # [heads] summed over queries
    detection: np.ndarray = field(init=False)  # [heads, len(DETECTORS)] summed over texts
    queries: int = 0
    texts: int = 0

    def __post_init__(self) -> None:
        h = self.heads
        self.by_weight = TopList.empty(h, self.top_k)
        self.by_norm = TopList.empty(h, self.top_k)
        self.sample_hash = np.zeros(0, np.uint64)
        self.sample_text = np.zeros(0, np.int64)
        self.sample_query = np.zeros(0, np.int32)
        self.sample_key = np.zeros(0, np.int32)
        self.sample_weight = np.zeros((0, h), np.float32)
        self.sample_norm = np.zeros((0, h), np.float32)
        self.weight_hist = np.zeros((h, WEIGHT_BINS), np.int64)
        self.offset_mass = np.zeros((h, 2 * MAX_OFFSET + 1), np.float64)
        self.kind_mass = np.zeros((h, len(KEY_KINDS)), np.float64)
        self.entropy = np.zeros(h, np.float64)
        self.distance = np.zeros(h, np.float64)
        self.detection = np.zeros((h, len(DETECTORS)), np.float64)

    # --- one batch ---------------------------------------------------------------------------

    def sample_candidates(self, layout: BatchLayout) -> tuple[torch.Tensor, ...]:
        """The batch's pairs that may enter the sample (its ``sample_size`` smallest hashes):
        ``(rows, queries, keys, hashes)``."""
        rows, queries, keys = layout.ranked_pair.nonzero(as_tuple=True)
        text = layout.text[rows.numpy()]
        hashes = pair_hash(text, queries.numpy(), keys.numpy())
        if len(hashes) > self.sample_size:
            keep = np.argpartition(hashes, self.sample_size - 1)[: self.sample_size]
            keep = torch.from_numpy(np.sort(keep))
            rows, queries, keys, hashes = rows[keep], queries[keep], keys[keep], hashes[keep]
        return rows, queries, keys, torch.from_numpy(hashes.view(np.int64))

    def add_layer(
        self,
        first_head: int,
        layout: BatchLayout,
        weights: torch.Tensor,
        value_norms: torch.Tensor,
        sample: tuple[torch.Tensor, ...],
        sampled: dict[str, list[np.ndarray]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Add one layer's selected heads of a batch: ``weights [B, Hs, T, T]`` (float32 on the
        CPU; the pairs no query may attend to are never read), ``value_norms [B, Hs, T]``; the
        summaries of head ``first_head + i`` get head i. The sample's pairs' values go to
        ``sampled`` (merged once the batch is done). Returns each query's strongest key and its
        weight, ``(keys, weights)`` as ``[B, Hs, T]`` (padding: 0). The sums are one
        compiled pass over the weights (``mhsa.atlas.kernels.summarise_layer``); a pair's norm
        is ``weight * value_norms`` (Kobayashi et al.'s), made where it is looked at."""
        hs = weights.shape[1]
        heads = slice(first_head, first_head + hs)
        lists = (self.by_weight, self.by_norm)
        # the candidates the pass keeps for a full list: the pairs at or above its last value
        last = np.stack([top.value[heads, -1] for top in lists])
        limits = np.where(np.isfinite(last).all(1, keepdims=True), last, np.inf)
        w, vn = weights.float(), value_norms.float()
        got = summarise_layer(
            w.numpy(),
            vn.numpy(),
            layout.lengths.numpy(),
            layout.ids_np,
            layout.key_flags,
            layout.causal,
            limits,
            self.top_k,
            WEIGHT_BINS,
            MAX_OFFSET,
        )
        pairs = _Pairs(w, vn, layout)
        for j, top in enumerate(lists):
            self._offer_top(top, first_head, layout, pairs, got, j)
        s_rows, s_q, s_k, _ = sample
        s_w = w[s_rows, :, s_q, s_k]  # [m, Hs]
        sampled["weight"].append(s_w.numpy())
        sampled["norm"].append((s_w * vn[s_rows, :, s_k]).numpy())
        self.weight_hist[heads] += got["hist"].sum(0)
        self.offset_mass[heads] += got["folded"].sum(0)
        self.distance[heads] += got["distance"].sum(0)
        self.kind_mass[heads] += got["kinds"].sum(0)
        self.entropy[heads] += got["entropy"].sum(0)
        self.detection[heads] += got["detection"].sum(0)
        return got["best_key"], got["best_weight"]

    def _offer_top(
        self,
        top: TopList,
        first_head: int,
        layout: BatchLayout,
        pairs: _Pairs,
        got: dict[str, np.ndarray],
        j: int,
    ) -> None:
        """The batch's candidates for list ``j`` (0 by weight, 1 by norm) of each head: those
        the compiled pass kept (``_kept``); else ``_above``; else ``_best_per_text``, both over
        every pair's values (``pairs.full``), offered to it."""
        hs = pairs.w.shape[1]
        if layout.ranked_count == 0:
            return
        last = torch.from_numpy(top.value[first_head : first_head + hs, -1])
        found = None
        if bool(last.isfinite().all()):
            found = self._kept(pairs, got, j) or self._above(pairs.full(j), layout, last)
        if found is None:
            found = self._best_per_text(pairs.full(j), layout, last)
        row, head, q, k = found
        weight, norm = pairs.at(row, head, q, k)
        cand = {
            "value": (weight if j == 0 else norm).numpy(),
            "text": layout.text[row.numpy()],
            "query": q.numpy().astype(np.int32),
            "key": k.numpy().astype(np.int32),
            "weight": weight.numpy(),
            "norm": norm.numpy(),
        }
        head_np = head.numpy()
        for i in np.unique(head_np):  # a head with no candidate keeps its list as it is
            mine = head_np == i
            top.offer(first_head + int(i), {c: v[mine] for c, v in cand.items()})

    def _kept(
        self, pairs: _Pairs, got: dict[str, np.ndarray], j: int
    ) -> tuple[torch.Tensor, ...] | None:
        """The candidates the compiled pass kept for list ``j`` (every ranked pair at or above
        each head's last value, ties kept), as ``_above`` finds them; None when some row and
        head had more than it keeps or the batch more than ``_above`` takes."""
        hits = got["hits"][j]
        cap = got["at"].shape[-1]
        if hits.max(initial=0) > cap or hits.sum() > 8 * self.top_k * pairs.w.shape[1]:
            return None
        row, head = np.nonzero(hits)
        count = hits[row, head]
        at = got["at"][j, row, head][np.arange(cap)[None, :] < count[:, None]]  # row by row
        t = pairs.w.shape[-1]
        row, head = (torch.from_numpy(np.repeat(x, count)) for x in (row, head))
        at = torch.from_numpy(at.astype(np.int64))
        return row, head, at // t, at % t

    def _above(
        self, values: torch.Tensor, layout: BatchLayout, last: torch.Tensor
    ) -> tuple[torch.Tensor, ...] | None:
        """Once every list is full: the ranked pairs at or above each head's last value (all
        that can enter; ties kept, ``TopList.offer`` orders them), found by one comparison
        instead of a top-k per text; None when too many are (the top-k per text then)."""
        hit = values >= last[None, :, None, None]
        hit &= layout.ranked_pair[:, None]
        if int(hit.sum()) > 8 * self.top_k * values.shape[1]:
            return None
        return hit.nonzero(as_tuple=True)

    def _best_per_text(
        self, values: torch.Tensor, layout: BatchLayout, last: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Per text and head its ``top_k + 1`` largest pairs (one more: a text holds at most
        one pair that is not ranked, a causal model's first query), of which the ranked ones
        at or above both the list's current last value and the batch's k-th best ranked
        candidate (ties kept)."""
        b, hs, t = values.shape[0], values.shape[1], values.shape[-1]
        best, at = torch.topk(values.view(b, hs, t * t), min(self.top_k + 1, t * t), dim=-1)
        row = torch.arange(b)[:, None, None].expand_as(at)
        head = torch.arange(hs)[None, :, None].expand_as(at)
        q, k = at // t, at % t
        keep = layout.ranked_pair[row, q, k]
        ranked = best.masked_fill(~keep, -torch.inf).transpose(0, 1).reshape(hs, -1)
        kth = torch.topk(ranked, min(self.top_k, ranked.shape[1]), dim=-1).values[:, -1]
        keep &= best >= torch.maximum(kth, last)[None, :, None]
        return row[keep], head[keep], q[keep], k[keep]

    def finish_batch(
        self, layout: BatchLayout, sample: tuple[torch.Tensor, ...], sampled: dict
    ) -> None:
        """After every layer of a batch: its queries and texts counted, its sample merged."""
        self.queries += int(layout.valid_query.sum())
        self.texts += len(layout.text)
        rows, q, k, hashes = sample
        if not len(rows):
            return
        self._merge_sample(
            hashes.numpy().view(np.uint64),
            layout.text[rows.numpy()],
            q.numpy().astype(np.int32),
            k.numpy().astype(np.int32),
            np.concatenate(sampled["weight"], axis=1),
            np.concatenate(sampled["norm"], axis=1),
        )

    def _merge_sample(self, hashes, text, query, key, weight, norm) -> None:
        hashes = np.concatenate([self.sample_hash, hashes])
        order = np.argsort(hashes, kind="stable")[: self.sample_size]
        self.sample_hash = hashes[order]
        self.sample_text = np.concatenate([self.sample_text, text])[order]
        self.sample_query = np.concatenate([self.sample_query, query])[order]
        self.sample_key = np.concatenate([self.sample_key, key])[order]
        self.sample_weight = np.concatenate([self.sample_weight, weight])[order]
        self.sample_norm = np.concatenate([self.sample_norm, norm])[order]

    # --- shards ------------------------------------------------------------------------------

    def merge(self, other: HeadSummaries) -> HeadSummaries:
        """Add another shard's summaries (any order gives the same result)."""
        self.by_weight.merge(other.by_weight)
        self.by_norm.merge(other.by_norm)
        self._merge_sample(
            other.sample_hash,
            other.sample_text,
            other.sample_query,
            other.sample_key,
            other.sample_weight,
            other.sample_norm,
        )
        for name in SUMMED:
            getattr(self, name).__iadd__(getattr(other, name))
        self.queries += other.queries
        self.texts += other.texts
        return self

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything as named arrays (an ``.npz``'s contents)."""
        out = {
            "top_k": np.array(self.top_k),
            "sample_size": np.array(self.sample_size),
            "queries": np.array(self.queries),
            "texts": np.array(self.texts),
        }
        for prefix, top in (("by_weight", self.by_weight), ("by_norm", self.by_norm)):
            for c in TOP_FIELDS:
                out[f"{prefix}_{c}"] = getattr(top, c)
        for name in SUMMED + SAMPLED:
            out[name] = getattr(self, name)
        return out

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> HeadSummaries:
        heads = a["by_weight_value"].shape[0]
        out = cls(heads, int(a["top_k"]), int(a["sample_size"]))
        out.queries, out.texts = int(a["queries"]), int(a["texts"])
        for prefix in ("by_weight", "by_norm"):
            setattr(out, prefix, TopList(*(np.array(a[f"{prefix}_{c}"]) for c in TOP_FIELDS)))
        for name in SUMMED + SAMPLED:
            setattr(out, name, np.array(a[name]))
        return out

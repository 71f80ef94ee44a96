"""Reading a head atlas: a head's top examples, samples, histograms and corpus-wide scores,
search by token and offset, and similar contexts (``open_atlas``)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mhsa.atlas.build import FORMAT
from mhsa.atlas.collect import DETECTORS, KEY_KINDS, MAX_OFFSET, WEIGHT_BINS
from mhsa.atlas.index import (
    NORM_BITS,
    ZCodes,
    exact_neighbours,
    index_candidates,
    search_index,
)
from mhsa.atlas.tags import NO_TAG, UNIVERSAL_TAGS, check_tag
from mhsa.engine.result import html_view
from mhsa.errors import InputError

__all__ = ["WINDOW", "Atlas", "AtlasParts", "open_atlas"]

#: tokens shown on each side of an example's query and key
WINDOW = 6
EXAMPLE_COLUMNS = ["text_id", "query", "key", "query_token", "key_token", "weight", "norm", "text"]


def open_atlas(out: str | Path) -> Atlas:
    """The atlas in folder ``out``.

    Raises:
        InputError: no such folder, a folder that is not a (finished) atlas, or one written by
            a newer version.
    """
    folder = Path(out)
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        more = (
            " (a build is under way or was stopped: build again to resume)"
            if (folder / ".shards").is_dir()
            else ""
        )
        raise InputError(f"{str(folder)!r} is not an atlas: it has no manifest.json{more}.")
    try:
        manifest = json.loads(manifest_path.read_text())
        kind, version = manifest["kind"], int(manifest["format"])
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"The atlas manifest in {str(folder)!r} is unreadable ({e}).") from e
    if kind != "mhsa-atlas":
        raise InputError(f"{str(folder)!r} holds a {kind!r}, not an atlas.")
    if version > FORMAT:
        raise InputError(
            f"The atlas in {str(folder)!r} was written by a newer MHSA Explorer (format "
            f"{version}; this one reads up to {FORMAT}): upgrade, or build it again."
        )
    if "parts" in manifest:
        try:
            parts = {
                name: open_atlas(folder / p["folder"]) for name, p in manifest["parts"].items()
            }
        except (KeyError, TypeError) as e:
            raise InputError(f"The atlas manifest in {str(folder)!r} is unreadable ({e}).") from e
        return AtlasParts(folder, manifest, parts)
    return Atlas(folder, manifest)


def _no_such_head(head: str, labels: list[str]) -> InputError:
    """The error for a head the atlas lacks, naming some of its heads and how they are written."""
    shown = ", ".join(labels[:4]) + (" ..." if len(labels) > 4 else "")
    form = (
        "L<layer>H<head>"
        if labels[0].startswith("L")
        else "E<layer>H<head> (encoder) or D<layer>H<head> (decoder)"
    )
    return InputError(
        f"The atlas has no head {head!r}: its heads are {shown} ({len(labels)} in all), "
        f"written as {form}."
    )


class Atlas:
    """A built atlas (see ``mhsa.atlas``): every method reads memory-mapped arrays, so opening
    one costs little whatever the corpus's size."""

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        self.folder = folder
        self.manifest = manifest
        self.labels: list[str] = list(manifest["heads"])
        self._head_index = {label: i for i, label in enumerate(self.labels)}
        load = functools.partial(np.load, mmap_mode="r")
        self.token_ids = load(folder / "token_ids.npy")
        self.special = load(folder / "special.npy")
        self.offsets = np.load(folder / "text_offsets.npy")
        self.strongest_key = load(folder / "strongest_key.npy")
        self.strongest_weight = load(folder / "strongest_weight.npy")
        self.tag_ids = self._load_tags(folder, manifest)
        with np.load(folder / "z_ranges.npz") as f:
            bounds = f["bounds"] if "bounds" in f.files else np.zeros(1, np.int64)  # format 1
            bits = 5 if int(manifest["format"]) >= 3 else 4  # formats 3 to 6; 2 and before: 4
            codes = load(folder / f"z{bits}.npy")
            if "edges" in f.files:  # formats 4 to 6: cells placed by the density
                groups = self.special.view(np.uint8)  # formats 5, 6: special tokens apart
                extra = {}
                if "norm_edges" in f.files:  # format 6: directions, and their norms apart
                    extra["norm_codes"] = load(folder / f"znorm{NORM_BITS}.npy")
                    extra["norm_edges"] = f["norm_edges"]
                self.z = ZCodes(
                    codes, bounds=bounds, bits=bits, edges=f["edges"], groups=groups, **extra
                )
            else:
                self.z = ZCodes(codes, f["lo"], f["step"], bounds, bits)
        with np.load(folder / "heads.npz") as f:
            self.summaries = {k: f[k] for k in f.files}
        vocab = json.loads((folder / "vocab.json").read_text())
        self.vocab = {int(k): v for k, v in vocab.items()}
        self._ids_of = {}
        for i, token in self.vocab.items():
            self._ids_of.setdefault(token, []).append(i)

    def __repr__(self) -> str:
        plan = self.manifest["plan"]
        return (
            f"Atlas({plan['model']!r}, {len(self.labels)} heads, {self.tokens} tokens of "
            f"{plan['texts']} texts)"
        )

    def _repr_html_(self) -> str:
        """In a notebook: what the atlas holds, a map of one per-head score (the induction
        score) and every head's corpus-wide scores (``heads``) as a table; no script, no
        request to the network (``mhsa.plots.notebook_results.atlas_html``)."""
        return html_view("atlas")(self)

    @property
    def tokens(self) -> int:
        return int(self.manifest["tokens"])

    @property
    def model(self) -> str:
        return str(self.manifest["plan"]["model"])

    @functools.cached_property
    def _texts(self) -> list[str]:
        with open(self.folder / "texts.jsonl", encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def text(self, text_id: int) -> str:
        """The corpus's text ``text_id`` as it was read."""
        self._check_text(text_id)
        return self._texts[text_id]

    def text_tokens(self, text_id: int, head: str | None = None) -> list[str]:
        """Text ``text_id``'s tokens, as ``mhsa.attend`` shows them (``head``: checked to be
        one of the atlas's; an encoder-decoder's atlas reads it to choose a part)."""
        if head is not None:
            self.head(head)
        self._check_text(text_id)
        a, b = self.offsets[text_id], self.offsets[text_id + 1]
        return [self.vocab[int(i)] for i in self.token_ids[a:b]]

    def head(self, head: str) -> int:
        """The atlas's index of a head label (``"L3H4"``).

        Raises:
            InputError: the atlas has no such head.
        """
        if head not in self._head_index:
            raise _no_such_head(head, self.labels)
        return self._head_index[head]

    # --- examples --------------------------------------------------------------------------

    def top(self, head: str, k: int = 10, by: str = "weight") -> pd.DataFrame:
        """The head's ``k`` strongest (text, query, key) pairs of the corpus by attention
        ``"weight"`` or by ``"norm"`` (``weight * ||f(x_key)||``, Kobayashi et al. 2020),
        strongest first; ``text`` is a window of the text with the query and key marked."""
        if by not in ("weight", "norm"):
            raise InputError(f"by must be 'weight' or 'norm', got {by!r}.")
        i = self.head(head)
        k = self._check_k(k, int(self.summaries["top_k"]))
        s = self.summaries
        cols = {c: s[f"by_{by}_{c}"][i] for c in ("text", "query", "key", "weight", "norm")}
        real = cols["text"] >= 0
        frame = pd.DataFrame({c: v[real][:k] for c, v in cols.items()})
        return self._examples(frame)

    def sample(self, head: str, k: int = 10, decile: int | None = None) -> pd.DataFrame:
        """``k`` pairs of the corpus drawn uniformly at random (the same pairs for every head),
        or from one ``decile`` (0-9) of the head's weight distribution over all pairs (estimated
        from the uniform sample), in the sample's order."""
        i = self.head(head)
        s = self.summaries
        weights = s["sample_weight"][:, i]
        chosen = np.arange(len(weights))
        if decile is not None:
            if not isinstance(decile, int) or not 0 <= decile <= 9:
                raise InputError(f"decile must be a whole number from 0 to 9, got {decile!r}.")
            edges = np.quantile(weights, np.linspace(0, 1, 11)) if len(weights) else np.zeros(11)
            upper = weights <= edges[decile + 1] if decile < 9 else np.ones_like(weights, bool)
            chosen = np.flatnonzero((weights >= edges[decile]) & upper)
        chosen = chosen[: self._check_k(k, len(weights))]
        frame = pd.DataFrame(
            {
                "text": s["sample_text"][chosen],
                "query": s["sample_query"][chosen],
                "key": s["sample_key"][chosen],
                "weight": weights[chosen],
                "norm": s["sample_norm"][chosen, i],
            }
        )
        return self._examples(frame)

    def _examples(self, frame: pd.DataFrame) -> pd.DataFrame:
        rows = []
        for text_id, q, k in zip(frame["text"], frame["query"], frame["key"], strict=True):
            tokens = self.text_tokens(int(text_id))
            rows.append((self._window(tokens, int(q), int(k)), tokens[q], tokens[k]))
        out = pd.DataFrame(
            {
                "text_id": frame["text"].astype(np.int64),
                "query": frame["query"].astype(np.int64),
                "key": frame["key"].astype(np.int64),
                "query_token": [r[1] for r in rows],
                "key_token": [r[2] for r in rows],
                "weight": frame["weight"].astype(np.float64),
                "norm": frame["norm"].astype(np.float64),
                "text": [r[0] for r in rows],
            }
        )
        return out[EXAMPLE_COLUMNS]

    @staticmethod
    def _window(tokens: list[str], q: int, k: int) -> str:
        """The tokens around query and key, the query in [[ ]] and the key in << >> (both
        when they are the same token)."""
        a, b = max(0, min(q, k) - WINDOW), min(len(tokens), max(q, k) + WINDOW + 1)
        shown = []
        for j in range(a, b):
            t = tokens[j]
            if j == q and j == k:
                t = f"[[<<{t}>>]]"
            elif j == q:
                t = f"[[{t}]]"
            elif j == k:
                t = f"<<{t}>>"
            shown.append(t)
        return ("... " if a else "") + " ".join(shown) + (" ..." if b < len(tokens) else "")

    # --- the head over the corpus ----------------------------------------------------------

    def summary(self, head: str) -> dict[str, Any]:
        """The head's histograms (weight: pairs per bin of 0.05; offset ``key - query``:
        attention mass, edges clipped at +-64; key kinds: share of the attention) and its
        corpus-wide scores (see ``heads``)."""
        i = self.head(head)
        s = self.summaries
        offsets = np.arange(-MAX_OFFSET, MAX_OFFSET + 1)
        mass = s["offset_mass"][i]
        return {
            "head": head,
            **self.heads().loc[head].to_dict(),
            "weight_histogram": pd.Series(
                s["weight_hist"][i],
                index=np.round(np.arange(WEIGHT_BINS) / WEIGHT_BINS, 2),
                name="pairs",
            ),
            "offset_histogram": pd.Series(
                mass / max(mass.sum(), 1e-12), index=offsets, name="share"
            ),
            "key_kinds": pd.Series(
                s["kind_mass"][i] / max(int(s["queries"]), 1), index=list(KEY_KINDS), name="share"
            ),
        }

    @functools.cache  # noqa: B019  (one atlas object per folder; a small frame)
    def heads(self) -> pd.DataFrame:
        """Per head over the corpus: mean entropy of a query's attention (nats), mean distance
        ``|query - key|`` weighted by attention, the share of attention on the first token, the
        previous token, special tokens, and TransformerLens's detection scores (``detect_head``,
        "mul", averaged over texts) for previous-token, duplicate-token and induction heads."""
        s = self.summaries
        queries, texts = max(int(s["queries"]), 1), max(int(s["texts"]), 1)
        kinds = s["kind_mass"] / queries
        frame = pd.DataFrame(
            {
                "entropy": s["entropy"] / queries,
                "distance": s["distance"] / queries,
                "first": kinds[:, KEY_KINDS.index("first")],
                "previous": kinds[:, KEY_KINDS.index("previous")],
                "special": kinds[:, KEY_KINDS.index("special")],
                **{f"{d} score": s["detection"][:, j] / texts for j, d in enumerate(DETECTORS)},
            },
            index=pd.Index(self.labels, name="head"),
        )
        return frame

    # --- search ----------------------------------------------------------------------------

    def token_ids_of(self, token: str, what: str = "token") -> list[int]:
        """The ids of a token string as ``mhsa.attend`` shows it (``"the"``, ``"##ing"``,
        ``"Ġcat"``), among the atlas's tokens.

        Raises:
            InputError: no token of the corpus is written so.
        """
        if not isinstance(token, str) or token not in self._ids_of:
            raise InputError(
                f"No {what} {token!r} in this atlas's corpus: write a token as the model's "
                "tokenizer shows it (as in the Heads page's axis), e.g. 'the' or '##ing'."
            )
        return self._ids_of[token]

    def search(
        self,
        head: str,
        query_token: str | None = None,
        key_token: str | None = None,
        offset: int | None = None,
        k: int | None = 20,
        query_tag: str | None = None,
        key_tag: str | None = None,
    ) -> pd.DataFrame:
        """Every corpus token (the query) whose strongest key under ``head`` matches: the
        query is ``query_token``, the strongest key is ``key_token`` and lies at ``offset``
        (``key - query``: -1 is the token before); the query's part of speech is
        ``query_tag`` and the key's ``key_tag`` (Universal tags, ``mhsa.atlas.tags``; exBERT's
        search by tag); any left None is not checked. Strongest first (ties by corpus order);
        ``k`` rows (None: all). Exact.

        Raises:
            InputError: an unknown head, token or tag; a tag on an atlas without tags.
        """
        wanted_tags = self._tag_filter(query_tag, key_tag)
        i = self.head(head)
        if k is not None:
            k = self._check_k(k, self.tokens)
        if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)):
            raise InputError(f"offset must be a whole number (key - query), got {offset!r}.")
        if query_token is not None:
            candidates = np.flatnonzero(
                np.isin(self.token_ids, self.token_ids_of(query_token, "query token"))
            )
        else:
            candidates = np.arange(self.tokens)
        text = np.searchsorted(self.offsets, candidates, side="right") - 1
        query = candidates - self.offsets[text]
        key = self.strongest_key[i][candidates].astype(np.int64)
        keep = np.ones(len(candidates), bool)
        if key_token is not None:
            wanted = self.token_ids_of(key_token, "key token")
            keep &= np.isin(self.token_ids[self.offsets[text] + key], wanted)
        if offset is not None:
            keep &= (key - query) == offset
        if wanted_tags[0] is not None:
            keep &= self.tag_ids[candidates] == wanted_tags[0]
        if wanted_tags[1] is not None:
            keep &= self.tag_ids[self.offsets[text] + key] == wanted_tags[1]
        candidates, text, query, key = candidates[keep], text[keep], query[keep], key[keep]
        weight = self.strongest_weight[i][candidates].astype(np.float32)
        order = np.lexsort((candidates, -weight))[:k]
        frame = pd.DataFrame(
            {
                "text": text[order],
                "query": query[order],
                "key": key[order],
                "weight": weight[order],
                "norm": np.nan,
            }
        )
        return self._examples(frame).drop(columns="norm")

    def similar(
        self,
        text_id: int,
        position: int,
        head: str | list[str] | None = None,
        k: int | None = 10,
        exact: bool = True,
    ) -> pd.DataFrame:
        """The corpus tokens whose head output z is nearest (cosine) the token at ``position``
        of text ``text_id``: under ``head``, the heads of a list, or every head at once
        (None: exBERT's concatenation); the token itself left out, ties by corpus order.

        ``exact`` (the default) ranks by the heads' true outputs: the nearest tokens by the
        stored codes (``mhsa.atlas.exact.candidate_count``; over every head, from the
        approximate index above ``EXACT_UP_TO`` tokens) propose the texts that hold them, the
        model runs on those texts (and on the query's) up to the deepest head asked, and every
        token of them is ranked by its true z (``mhsa.atlas.exact``); ``k`` None: every token
        of the corpus, the model run over it all. ``exact=False``: ranked by the codes alone
        (no model run).

        Raises:
            InputError: no such text, position or head, or a bad ``k``.
        """
        self._check_text(text_id)
        a, b = int(self.offsets[text_id]), int(self.offsets[text_id + 1])
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < b - a:
            raise InputError(
                f"Text {text_id} has {b - a} tokens: position must be from 0 to {b - a - 1}, "
                f"got {position!r}."
            )
        token = a + position
        heads = (
            None
            if head is None
            else [self.head(h) for h in ([head] if isinstance(head, str) else head)]
        )
        if k is not None:
            k = self._check_k(k, self.tokens)
        if exact:
            found, sims = self._similar_exact(text_id, token, heads, k)
        else:
            found, sims = self._similar_coded(
                self.z.rows(np.array([token]), heads)[0], token, heads, k
            )
        text = np.searchsorted(self.offsets, found, side="right") - 1
        return pd.DataFrame(
            {
                "text_id": text.astype(np.int64),
                "position": (found - self.offsets[text]).astype(np.int64),
                "token": [self.vocab[int(i)] for i in self.token_ids[found]],
                "similarity": sims.astype(np.float64),
            }
        )

    def _similar_coded(
        self,
        query: np.ndarray,
        token: int,
        heads: list[int] | None,
        k: int | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest tokens to unit vector ``query`` by the stored codes (every head
        above ``EXACT_UP_TO`` tokens: candidates of the approximate index)."""
        if heads is None and k is not None and self.manifest["index"]["kind"] != "exact":
            found, sims = search_index(self._index, self.z, query, k + 1, token)
            keep = found != token
            return found[keep][:k], sims[keep][:k]
        return exact_neighbours(self.z, heads, query, k, token)

    def _similar_exact(
        self, text_id: int, token: int, heads: list[int] | None, k: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``similar`` ranked by the true outputs of the texts the codes propose
        (``mhsa.atlas.exact.rerank``)."""
        from mhsa.atlas import exact
        from mhsa.atlas.index import RERANK
        from mhsa.engine.models.loading import get_model

        chosen = list(range(len(self.labels))) if heads is None else heads
        lm, plan = get_model(self.model), self.manifest["plan"]

        def recompute(texts: list[int]) -> tuple[np.ndarray, np.ndarray]:
            values = exact.true_outputs(lm, plan, [self._texts[t] for t in texts], chosen)
            rows = [v.transpose(1, 0, 2).reshape(v.shape[1], -1) for v in values]
            spans = [np.arange(self.offsets[t], self.offsets[t + 1]) for t in texts]
            return np.concatenate(spans).astype(np.int64), np.concatenate(rows)

        seed = recompute([text_id])
        query = seed[1][token - int(self.offsets[text_id])]
        if k is None:  # every token: the model over the whole corpus
            every = [t for t in range(len(self.offsets) - 1) if t != text_id]
            tokens, rows = recompute(every) if every else (seed[0][:0], seed[1][:0])
            both = (np.concatenate([seed[0], tokens]), np.concatenate([seed[1], rows]))
            return exact.exact_top(both[1], both[0], query, self.tokens, token)
        unit = query / max(float(np.linalg.norm(query)), 1e-12)
        count = min(exact.candidate_count(k), self.tokens - 1)
        bounds = functools.partial(
            self.z.cosine_bounds, unit, heads=heads, margin=exact.MARGIN, curvature=exact.CURVATURE
        )
        if heads is None and self.manifest["index"]["kind"] != "exact":
            # the index's candidates, each one's coded cosine and bound in one pass over its
            # codes (their codes lie scattered over the memory map: read once, not twice)
            cand = index_candidates(self._index, unit, token, RERANK * 11)
            cand = cand[cand != token]
            coded, margin = bounds(tokens=cand)
            keep = np.lexsort((cand, -coded))[:count]
            near, coded, margin = cand[keep], coded[keep], margin[keep]
        else:
            near, _ = self._similar_coded(unit, token, heads, count)
            coded, margin = bounds(tokens=near)
        return exact.rerank(
            query,
            token,
            k,
            near,
            coded + margin,
            np.searchsorted(self.offsets, near, side="right") - 1,
            recompute,
            seed,
            [text_id],
            exact.text_budget(lm, plan, chosen),
        )

    @functools.cached_property
    def _index(self) -> Any:
        import faiss

        return faiss.read_index(str(self.folder / "index.faiss"))

    # --- part-of-speech tags ---------------------------------------------------------------

    @staticmethod
    def _load_tags(folder: Path, manifest: dict[str, Any]) -> np.ndarray | None:
        """The atlas's tag id per token (``tags.npy``), None for an atlas without tags (an
        untagged corpus, or one built before atlases kept tags)."""
        names = manifest.get("tags")
        if not names or not (folder / "tags.npy").is_file():
            return None
        if list(names) != list(UNIVERSAL_TAGS):
            raise InputError(
                f"The atlas in {str(folder)!r} keeps tags of another tagset ({names!r}): build "
                "it again."
            )
        return np.load(folder / "tags.npy", mmap_mode="r")

    @property
    def has_tags(self) -> bool:
        """Whether the atlas keeps each token's part of speech (a tagged corpus: the Brown
        Corpus's own tags, mapped to the Universal tagset and aligned to the word pieces)."""
        return self.tag_ids is not None

    def _no_tags(self) -> InputError:
        return InputError(
            f"The atlas of {self.model!r} over {self.manifest['plan']['source']!r} has no "
            "part-of-speech tags: its corpus had none (build it on a tagged corpus, such as "
            "the Brown Corpus, for tags)."
        )

    def tags(self, text_id: int, head: str | None = None) -> list[str | None]:
        """Text ``text_id``'s Universal tag per token, one per ``text_tokens(text_id)``: the
        tag of the corpus word that covers the token's first character; None for special
        tokens (``head``: checked, as in ``text_tokens``).

        Raises:
            InputError: an atlas without tags, a text it lacks.
        """
        if head is not None:
            self.head(head)
        if self.tag_ids is None:
            raise self._no_tags()
        self._check_text(text_id)
        a, b = self.offsets[text_id], self.offsets[text_id + 1]
        return [None if t == NO_TAG else UNIVERSAL_TAGS[t] for t in self.tag_ids[a:b].tolist()]

    def _tag_filter(self, query_tag: str | None, key_tag: str | None) -> tuple[int | None, ...]:
        """The tag ids a search asks of the query and of the key (None: any)."""
        if query_tag is None and key_tag is None:
            return (None, None)
        ids = tuple(
            None if t is None else UNIVERSAL_TAGS.index(check_tag(t, what))
            for t, what in ((query_tag, "query tag"), (key_tag, "key tag"))
        )
        if self.tag_ids is None:
            raise self._no_tags()
        return ids

    def tag_histogram(self, frame: pd.DataFrame, head: str | None = None) -> pd.DataFrame:
        """exBERT's histograms (Hoover et al. 2020): how many of a frame's examples (``top``,
        ``sample`` or ``search``: its ``text_id``, ``query`` and ``key`` columns) have a query,
        and a key, of each Universal tag; one row per tag in ``UNIVERSAL_TAGS`` order and a
        last row ``"none"`` for special tokens (``head``: which part's tokens, for an
        encoder-decoder's atlas).

        Raises:
            InputError: an atlas without tags, a frame without those columns or with a token
                the atlas lacks.
        """
        if head is not None:
            self.head(head)
        if self.tag_ids is None:
            raise self._no_tags()
        missing = [c for c in ("text_id", "query", "key") if c not in getattr(frame, "columns", [])]
        if missing:
            raise InputError(
                f"tag_histogram reads a frame of examples with columns text_id, query and key "
                f"(as top, sample and search return), missing {', '.join(missing)}."
            )
        text = frame["text_id"].to_numpy(np.int64)
        texts = len(self.offsets) - 1
        if len(text) and (text.min() < 0 or text.max() >= texts):
            raise InputError(f"The frame names a text the atlas lacks (it has 0 to {texts - 1}).")
        starts, ends = self.offsets[text], self.offsets[text + 1]
        counts = {}
        for column in ("query", "key"):
            position = frame[column].to_numpy(np.int64)
            if len(position) and ((position < 0).any() or (starts + position >= ends).any()):
                raise InputError(f"The frame's {column} column names a token its text lacks.")
            ids = np.asarray(self.tag_ids[starts + position]).astype(np.int64)
            ids[ids == NO_TAG] = len(UNIVERSAL_TAGS)
            counts[column] = np.bincount(ids, minlength=len(UNIVERSAL_TAGS) + 1)
        return pd.DataFrame(counts, index=pd.Index([*UNIVERSAL_TAGS, "none"], name="tag"))

    # --- checks ----------------------------------------------------------------------------

    def _check_text(self, text_id: object) -> None:
        texts = len(self.offsets) - 1
        if (
            isinstance(text_id, bool)
            or not isinstance(text_id, int | np.integer)
            or not (0 <= int(text_id) < texts)
        ):
            raise InputError(
                f"text_id must be a text of the corpus, 0 to {texts - 1}, got {text_id!r}."
            )

    @staticmethod
    def _check_k(k: object, most: int) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"k must be a whole number of at least 1, got {k!r}.")
        return min(k, max(most, 1))


class AtlasParts(Atlas):
    """An encoder-decoder's atlas: its encoder's self-attention (heads ``E{layer}H{head}``) and
    its decoder's (``D{layer}H{head}``; the decoder read each text as its teacher-forced
    target), each an ``Atlas`` of its own tokens, read as one. A method given a head asks that
    head's part; ``text_tokens`` and ``similar`` without a head read the encoder's."""

    def __init__(self, folder: Path, manifest: dict[str, Any], parts: dict[str, Atlas]) -> None:
        self.folder = folder
        self.parts = parts
        self.labels = [label for part in parts.values() for label in part.labels]
        self._part_of = {label: part for part in parts.values() for label in part.labels}
        first = next(iter(parts.values()))
        # what the page and ``Atlas`` read of the whole: the first part's plan and corpus
        self.manifest = {**first.manifest, **manifest, "plan": first.manifest["plan"]}

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{name}: {len(p.labels)} heads, {p.tokens} tokens" for name, p in self.parts.items()
        )
        return f"AtlasParts({self.model!r}, {inner})"

    def _repr_html_(self) -> str:
        """In a notebook: each part's map of one per-head score (the induction score) and its
        heads' corpus-wide scores (``mhsa.plots.notebook_results.atlas_parts_html``)."""
        return html_view("atlas parts")(self)

    @property
    def tokens(self) -> int:
        return next(iter(self.parts.values())).tokens

    def part(self, head: str) -> Atlas:
        """The part that holds ``head``.

        Raises:
            InputError: neither part has such a head.
        """
        if head not in self._part_of:
            raise _no_such_head(head, self.labels)
        return self._part_of[head]

    def head(self, head: str) -> int:
        return self.part(head).head(head)

    def text(self, text_id: int) -> str:
        return next(iter(self.parts.values())).text(text_id)

    def text_tokens(self, text_id: int, head: str | None = None) -> list[str]:
        """Text ``text_id``'s tokens as ``head``'s part read them (None: the encoder's)."""
        atlas = next(iter(self.parts.values())) if head is None else self.part(head)
        return atlas.text_tokens(text_id)

    def top(self, head: str, k: int = 10, by: str = "weight") -> pd.DataFrame:
        return self.part(head).top(head, k, by)

    def sample(self, head: str, k: int = 10, decile: int | None = None) -> pd.DataFrame:
        return self.part(head).sample(head, k, decile)

    def summary(self, head: str) -> dict[str, Any]:
        return self.part(head).summary(head)

    def heads(self) -> pd.DataFrame:
        return pd.concat([p.heads() for p in self.parts.values()])

    def search(
        self,
        head: str,
        query_token: str | None = None,
        key_token: str | None = None,
        offset: int | None = None,
        k: int | None = 20,
        query_tag: str | None = None,
        key_tag: str | None = None,
    ) -> pd.DataFrame:
        return self.part(head).search(
            head, query_token, key_token, offset, k, query_tag=query_tag, key_tag=key_tag
        )

    @property
    def has_tags(self) -> bool:
        """Whether the encoder's part keeps tags (the decoder's reads its teacher-forced
        target, which has no character offsets: never)."""
        return next(iter(self.parts.values())).has_tags

    def tags(self, text_id: int, head: str | None = None) -> list[str | None]:
        """Text ``text_id``'s tag per token of ``head``'s part (None: the encoder's)."""
        atlas = next(iter(self.parts.values())) if head is None else self.part(head)
        return atlas.tags(text_id)

    def tag_histogram(self, frame: pd.DataFrame, head: str | None = None) -> pd.DataFrame:
        """As ``Atlas.tag_histogram`` over ``head``'s part's tokens (None: the encoder's)."""
        atlas = next(iter(self.parts.values())) if head is None else self.part(head)
        return atlas.tag_histogram(frame)

    def similar(
        self,
        text_id: int,
        position: int,
        head: str | list[str] | None = None,
        k: int | None = 10,
        exact: bool = True,
    ) -> pd.DataFrame:
        """As ``Atlas.similar`` within one part: the heads given must be of one part (their
        tokens differ); None: every head of the encoder."""
        if head is None:
            return next(iter(self.parts.values())).similar(text_id, position, None, k, exact)
        labels = [head] if isinstance(head, str) else list(head)
        parts = {id(self.part(h)) for h in labels}
        if len(parts) > 1:
            raise InputError(
                "similar compares heads of one part: the encoder's and the decoder's read "
                "different tokens. Give E... heads or D... heads."
            )
        return self.part(labels[0]).similar(text_id, position, head, k, exact)

    def token_ids_of(self, token: str, what: str = "token") -> list[int]:
        return next(iter(self.parts.values())).token_ids_of(token, what)

"""Building a head atlas: the corpus streamed through the model in shards of texts, each shard's
summaries (``mhsa.atlas.collect``) written to its own file, then merged into the atlas folder.

A shard is a fixed range of text ids, so a build that is killed resumes with the shards not yet
written and ends with the same atlas as an uninterrupted one; on Ray (``ray=True``) actors write
the same shard files. Files appear atomically (written under a temporary name, then renamed),
and the manifest is written last: a folder without one is not an atlas.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mhsa.atlas.collect import BatchLayout, HeadSummaries
from mhsa.atlas.corpora import TaggedText
from mhsa.atlas.index import (
    BITS,
    NORM_BITS,
    PROJECTION_DIMS,
    ZCodes,
    build_index,
    code_bytes,
    projection_matrix,
)
from mhsa.atlas.kernels import store_tokens
from mhsa.atlas.tags import NO_TAG, UNIVERSAL_TAGS, align_tags, check_tag, tag_id
from mhsa.engine.encoding import Encoded, encode, encode_many
from mhsa.engine.models.loading import LoadedModel, get_model
from mhsa.engine.runs.batches import batch_tokens_for, length_batches, pad_inputs
from mhsa.engine.runs.forward import run_until
from mhsa.engine.runs.norms import value_norms
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks
from mhsa.engine.tokens import is_punctuation
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.heads import kind_head_label

__all__ = [
    "FORMAT",
    "PARTS",
    "SAMPLE_SIZE",
    "SHARD_TEXTS",
    "AtlasPlan",
    "build_shard",
    "merge_shards",
    "plan_atlas",
    "read_corpus",
    "read_texts",
    "shard_texts_for",
]

#: the atlas folder's format; a reader refuses a newer one (6: each head output's direction
#: in 5 bits, ``z5.npy``, in cells placed by the values' density, a book of cells for the
#: ordinary tokens and one for the special ones, and its norm in 4 bits, ``znorm4.npy``, their
#: edges in ``z_ranges.npz``; 5: the outputs themselves so coded; 4: one book; 3: in 5 bits,
#: even steps; 2: in 4 bits, coded per shard, the all-heads index a random projection; 1: one
#: range; formats 1 to 5 are still read)
FORMAT = 6
#: books of cells a shard codes its head outputs in: the ordinary tokens' and the special
#: tokens' (every text's ``[CLS]`` has nearly one output on some heads: cells placed among
#: all tokens cannot order them, cells of their own can)
BOOKS = 2
#: texts per shard where the corpus's own size does not set it (the unit of resuming and of
#: Ray's work; by default a build sizes its shards by ``SHARD_BYTES``)
SHARD_TEXTS = 512
#: the head outputs (float16) a shard holds before coding them: shards hold about this much,
#: from the corpus's characters a text (``CHARS_PER_TOKEN``): larger shards pad less (each
#: batch is cut from one shard's texts sorted by length)
SHARD_BYTES = 256 * 2**20
CHARS_PER_TOKEN = 4
#: the largest uniform sample of pairs kept
SAMPLE_SIZE = 4096
#: tokens per text the atlas reads at most (longer texts are cut, and counted)
MAX_TOKENS = 512
#: an encoder-decoder's self-attentions, each an atlas of its own (in a subfolder)
PARTS = ("encoder", "decoder")

Progress = Callable[[int, int, float], None]
#: a text's words and their Universal tags, or None for a text without tags
Tagged = tuple[tuple[str, ...], tuple[str, ...]] | None
Corpus = str | Path | Sequence[str] | Sequence[TaggedText] | Sequence[dict]


def read_corpus(corpus: Corpus) -> tuple[list[str], str, list[Tagged] | None]:
    """``read_texts``, and each text's words and tags where the corpus has them: a list of
    ``TaggedText`` (or of ``{"text", "words", "tags"}`` mappings; plain strings beside them
    have none), or a ``.jsonl`` file of such records, one a line (docs/api.md, "Parts of
    speech"). None when no text has tags.

    Raises:
        InputError: as ``read_texts``; a record without a text, words and tags of different
            lengths, a tag outside the Universal tagset, a word not in its text.
    """
    if isinstance(corpus, str | Path) and Path(corpus).suffix.lower() == ".jsonl":
        texts, source = read_texts(corpus)
        records: list[object] = []
        for n, line in enumerate(texts):
            try:
                records.append(json.loads(line) if line.strip() else "")
            except ValueError as e:
                raise InputError(
                    f"Line {n + 1} of {Path(corpus).name!r} is not JSON ({e}): a .jsonl corpus "
                    'holds one {"text": ..., "words": [...], "tags": [...]} a line.'
                ) from e
    elif isinstance(corpus, str | Path):
        texts, source = read_texts(corpus)
        return texts, source, None
    else:
        records, source = list(corpus), "texts"
    plain: list[str] = []
    tagged: list[Tagged] = []
    for n, record in enumerate(records):
        text, tags = _record(record, n)
        plain.append(text)
        tagged.append(tags)
    texts, _ = read_texts(plain)
    if isinstance(corpus, str | Path):
        source = str(corpus)
    return texts, source, (tagged if any(t is not None for t in tagged) else None)


def _record(record: object, n: int) -> tuple[str, Tagged]:
    """One corpus record's text and its words and tags (checked)."""
    if isinstance(record, str):
        return record, None
    if isinstance(record, TaggedText):
        text, words, tags = record.text, record.words, record.tags
    elif isinstance(record, dict) and isinstance(record.get("text"), str):
        text, words, tags = record["text"], record.get("words"), record.get("tags")
        if words is None and tags is None:
            return text, None
    else:
        raise InputError(
            f"Text {n} of the corpus is neither a string nor a record with a 'text': a tagged "
            'corpus holds {"text": ..., "words": [...], "tags": [...]}.'
        )
    if not isinstance(words, list | tuple) or not isinstance(tags, list | tuple):
        raise InputError(f"Text {n} of the corpus needs both its words and its tags, as lists.")
    try:
        align_tags(text, words, tags, [])  # checks the lengths, the tags, the words
    except InputError as e:
        raise InputError(f"Text {n} of the corpus: {e}") from e
    return text, (tuple(words), tuple(check_tag(t) for t in tags))


def tags_digest(tagged: Sequence[Tagged] | None) -> str | None:
    """The hash of a corpus's words and tags (an atlas's plan keeps it); None: no tags."""
    if tagged is None:
        return None
    body = json.dumps([None if t is None else [list(t[0]), list(t[1])] for t in tagged])
    return hashlib.sha256(body.encode()).hexdigest()


def read_texts(corpus: str | Path | Sequence[str]) -> tuple[list[str], str]:
    """The corpus's texts (one a line of a text file; ``text_id`` is the line's 0-based number,
    blank lines keep their number and hold no tokens) and a description of where they came from.

    Raises:
        InputError: no such file, a binary or non-UTF-8 file, or no text at all.
    """
    if isinstance(corpus, str | Path):
        path = Path(corpus)
        if not path.is_file():
            raise InputError(f"No corpus file at {str(path)!r}: give a text file, one text a line.")
        data = path.read_bytes()
        if b"\x00" in data[:1_000_000]:
            raise InputError(
                f"{path.name!r} is a binary file, not text: an atlas reads a UTF-8 text file, "
                "one text a line."
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(
                f"{path.name!r} is not UTF-8 text (byte {e.start}): an atlas reads a UTF-8 text "
                "file, one text a line."
            ) from e
        texts, source = text.splitlines(), str(path)
    else:
        texts = [t if isinstance(t, str) else None for t in corpus]
        if any(t is None for t in texts):
            raise InputError("The corpus must be a text file or a list of strings.")
        texts, source = [t.replace("\n", " ") for t in texts], "texts"
    if not any(t.strip() for t in texts):
        raise InputError("The corpus holds no text: give at least one line with words.")
    return texts, source


@dataclass(frozen=True)
class AtlasPlan:
    """What a build computes: the model, the heads, the settings, the corpus (by hash)."""

    model: str
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    top_k: int
    sample_size: int
    max_tokens: int
    texts: int
    corpus_sha256: str
    source: str
    d_head: int
    causal: bool
    batch_tokens: int
    shard_texts: int = SHARD_TEXTS
    #: the self-attention the atlas reads: "self" (an encoder's or a decoder's), or an
    #: encoder-decoder's "encoder" or "decoder" (``mhsa.engine.runs.swap.BLOCK_KINDS``)
    part: str = "self"
    #: the hash of the corpus's words and tags (``tags_digest``); None: a corpus without tags
    tags_sha256: str | None = None

    @property
    def tagged(self) -> bool:
        """Whether the atlas keeps a tag per token: a tagged corpus, and tokens with character
        offsets (an encoder-decoder's decoder reads its teacher-forced target: none)."""
        return self.tags_sha256 is not None and self.part != "decoder"

    @property
    def labels(self) -> list[str]:
        return [kind_head_label(self.part, layer, h) for layer in self.layers for h in self.heads]

    @property
    def shards(self) -> int:
        return -(-self.texts // self.shard_texts)

    def json(self) -> dict[str, Any]:
        out = {**self.__dict__, "layers": list(self.layers), "heads": list(self.heads)}
        if self.part == "self":  # a self-attention atlas's plan has no part key
            del out["part"]
        if self.tags_sha256 is None:  # nor an untagged corpus's a tags key
            del out["tags_sha256"]
        return out


def plan_atlas(
    texts: list[str],
    source: str,
    lm: LoadedModel,
    *,
    model: str,
    top_k: int,
    layers: Sequence[int] | int | None,
    heads: Sequence[int] | int | None,
    batch_size: int | None,
    max_tokens: int = MAX_TOKENS,
    sample_size: int = SAMPLE_SIZE,
    shard_texts: int | None = None,
    part: str | None = None,
    tags_sha256: str | None = None,
) -> AtlasPlan:
    """Check the settings against the model and fix what the build will do.

    ``part``: which self-attention of an encoder-decoder (``"encoder"`` or ``"decoder"``; the
    decoder reads each text as its target, teacher-forced, as ``mhsa.attend`` shows it); None
    for an encoder or a decoder.

    Raises:
        InputError: a layer or head the model does not have, a bad ``top_k`` or ``part``.
    """
    kind = _part(lm, part)
    if not isinstance(top_k, int) or not 1 <= top_k <= 10_000:
        raise InputError(f"top_k must be a whole number from 1 to 10000, got {top_k!r}.")
    for name, value in (("sample_size", sample_size), ("shard_texts", shard_texts)):
        if value is None and name == "shard_texts":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be a whole number of at least 1, got {value!r}.")
    with lm.lock:
        blocks = [b for b in our_blocks(lm) if b.kind == kind]
    n_layers, n_heads = len(blocks), blocks[0].ours.num_heads
    chosen_layers = _choose(layers, n_layers, "layer")
    chosen_heads = _choose(heads, n_heads, "head")
    if blocks[0].ours.d_head % 2:
        raise UnsupportedModelError(
            f"{lm.display_name!r} has heads of {blocks[0].ours.d_head} dimensions: an atlas keeps "
            "head outputs two numbers a byte, so it takes models whose heads have an even number."
        )
    if shard_texts is None:
        numbers = len(chosen_layers) * len(chosen_heads) * blocks[0].ours.d_head
        shard_texts = shard_texts_for(texts, numbers)
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    limit = min(max_tokens, lm.max_positions or max_tokens)
    return AtlasPlan(
        model=model,
        layers=tuple(chosen_layers),
        heads=tuple(chosen_heads),
        top_k=top_k,
        sample_size=sample_size,
        max_tokens=limit,
        texts=len(texts),
        corpus_sha256=digest,
        source=source,
        d_head=blocks[0].ours.d_head,
        causal=bool(blocks[0].causal),
        batch_tokens=int(batch_size) if batch_size else batch_tokens_for(lm),
        shard_texts=shard_texts,
        part=kind,
        tags_sha256=tags_sha256,
    )


def shard_texts_for(texts: Sequence[str], numbers: int) -> int:
    """Texts per shard for a corpus whose tokens each keep ``numbers`` head-output numbers:
    about ``SHARD_BYTES`` of them a shard (tokens guessed from characters), 16 to 4,096 texts
    (MiniLM's 72 heads of 32 over Brown sentences: about 1,900)."""
    chars = sum(len(t) for t in texts) / max(1, len(texts))
    tokens = SHARD_BYTES / (2 * numbers)
    return int(min(4096, max(16, tokens * CHARS_PER_TOKEN / max(chars, 1.0))))


def _part(lm: LoadedModel, part: str | None) -> str:
    """The kind of block (``OurBlock.kind``) an atlas of ``lm``'s ``part`` reads."""
    if lm.is_encoder_decoder:
        if part not in PARTS:
            raise InputError(
                f"{lm.display_name!r} is an encoder-decoder model: build the atlas of its "
                f"encoder's or its decoder's self-attention (part 'encoder' or 'decoder'), got "
                f"{part!r}."
            )
        return part
    if part is not None:
        raise InputError(
            f"{lm.display_name!r} has one self-attention: part applies to encoder-decoder "
            f"models only, got {part!r}."
        )
    return "self"


def _choose(value: Sequence[int] | int | None, count: int, what: str) -> list[int]:
    if value is None:
        return list(range(count))
    chosen = [value] if isinstance(value, int) else list(value)
    bad = [v for v in chosen if not isinstance(v, int) or not 0 <= v < count]
    if bad or not chosen:
        raise InputError(
            f"The model has {count} {what}s (0 to {count - 1}): {what}s={value!r} is not among "
            "them."
        )
    return sorted(set(chosen))


# --- one shard ---------------------------------------------------------------------------------


def _encode(lm: LoadedModel, texts: list[str], limit: int) -> list[Encoded | None]:
    """Each text tokenized (None for a blank one), cut to ``limit`` tokens where longer."""
    out: list[Encoded | None] = [None] * len(texts)
    todo = [i for i, t in enumerate(texts) if t.strip()]
    done = encode_many(lm, [texts[i] for i in todo]) if todo else []
    for i, value in zip(todo, done, strict=True):
        if isinstance(value, Encoded) and value.inputs["input_ids"].shape[1] <= limit:
            out[i] = value
        else:  # over the model's or the atlas's limit: cut, and counted
            try:
                out[i] = encode(lm, texts[i], None, limit)
            except InputError:
                out[i] = None
    return out


@dataclass(frozen=True)
class _Stream:
    """The tokens an atlas's part reads of one text: the encoder's (or the one stack's) input,
    or an encoder-decoder's teacher-forced decoder input."""

    ids: torch.Tensor  # [n]
    strings: tuple[str, ...]
    special: tuple[bool, ...]

    @classmethod
    def of(cls, lm: LoadedModel, e: Encoded, part: str) -> _Stream:
        if part != "decoder":
            return cls(e.inputs["input_ids"][0], e.tokens.strings, e.tokens.special)
        specials = set(lm.tokenizer.all_special_tokens)
        strings = tuple(e.decoder_tokens or ())
        return cls(e.inputs["decoder_input_ids"][0], strings, tuple(t in specials for t in strings))


def build_shard(
    lm: LoadedModel,
    plan: AtlasPlan,
    texts: list[str],
    shard: int,
    tagged: Sequence[Tagged] | None = None,
) -> dict:
    """The arrays of one shard of the corpus (text ids ``shard * plan.shard_texts`` on): its
    summaries, its tokens, and per head and token the strongest key and the output z (coded in
    the shard's own cells, placed by its density: ``ZCodes.quantise_cells``), and per token the
    random projection of its unit concatenation of every head's z (``mhsa.atlas.index``); with
    the corpus's words and tags (``tagged``, where ``plan.tagged``), each token's tag id
    (``tag_ids``)."""
    first = shard * plan.shard_texts
    chunk = texts[first : first + plan.shard_texts]
    with lm.lock:
        encoded = _encode(lm, chunk, plan.max_tokens)
        streams = [None if e is None else _Stream.of(lm, e, plan.part) for e in encoded]
    lengths = np.array([0 if s is None else len(s.ids) for s in streams])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    n = int(lengths.sum())
    hs = len(plan.labels)
    token_ids = np.zeros(n, np.int32)
    special = np.zeros(n, bool)
    for i, stream in enumerate(streams):
        if stream is not None:
            token_ids[starts[i] : starts[i] + lengths[i]] = stream.ids.numpy()
            special[starts[i] : starts[i] + lengths[i]] = stream.special
    strongest_key = np.zeros((hs, n), np.uint16)
    strongest_weight = np.zeros((hs, n), np.float16)
    z = torch.zeros((hs, n, plan.d_head), dtype=torch.float16)
    projected = torch.zeros((n, PROJECTION_DIMS))
    squares = torch.zeros(n)
    summaries = HeadSummaries(hs, plan.top_k, plan.sample_size)
    usable = [i for i in range(len(chunk)) if encoded[i] is not None]
    for batch in length_batches([int(lengths[i]) for i in usable], plan.batch_tokens):
        rows = [usable[j] for j in batch]
        _run_batch(
            lm,
            plan,
            [(encoded[i], streams[i]) for i in rows],
            rows,
            first,
            starts,
            summaries,
            (strongest_key, strongest_weight, z, projected, squares),
        )
    codes, edges, norm_codes, norm_edges = ZCodes.quantise_directions(
        z, groups=special, books=BOOKS
    )
    projected /= squares.sqrt_().clamp_(min=1e-12)[:, None]
    truncated = [(first + i, e.truncated) for i, e in enumerate(encoded) if e and e.truncated]
    extra = {}
    if plan.tagged and tagged is not None:
        extra["tag_ids"] = _tag_ids(chunk, tagged[first : first + len(chunk)], encoded, n, starts)
    return {
        **extra,
        **summaries.arrays(),
        "lengths": lengths.astype(np.int32),
        "token_ids": token_ids,
        "special": special,
        "strongest_key": strongest_key,
        "strongest_weight": strongest_weight,
        f"z{BITS}": codes,
        "z_edges": edges,
        f"znorm{NORM_BITS}": norm_codes,
        "z_norm_edges": norm_edges,
        "projected": projected.numpy().astype(np.float16),
        "truncated": np.array(truncated, np.int64).reshape(-1, 2),
    }


def _tag_ids(
    chunk: list[str],
    tagged: Sequence[Tagged],
    encoded: list[Encoded | None],
    n: int,
    starts: np.ndarray,
) -> np.ndarray:
    """Each token's tag id: its word's tag (``align_tags``), ``NO_TAG`` for special tokens and
    for the tokens of a text without tags."""
    out = np.full(n, NO_TAG, np.uint8)
    for i, (text, e) in enumerate(zip(chunk, encoded, strict=True)):
        if e is None or tagged[i] is None:
            continue
        words, tags = tagged[i]
        offsets = [
            None if special else span
            for span, special in zip(e.tokens.offsets, e.tokens.special, strict=True)
        ]
        ids = [tag_id(t) for t in align_tags(text, words, tags, offsets)]
        out[starts[i] : starts[i] + len(ids)] = ids
    return out


def _run_batch(
    lm: LoadedModel,
    plan: AtlasPlan,
    items: list[tuple[Encoded, _Stream]],
    rows: list[int],
    first: int,
    starts: np.ndarray,
    summaries: HeadSummaries,
    per_token: tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """One padded batch through our module: every selected layer's weights, value norms and
    head outputs handed to the summaries as soon as the layer has computed them."""
    strongest_key, strongest_weight, z_out, projected, squares = per_token
    projection = projection_matrix(len(plan.labels) * plan.d_head)
    streams = [s for _, s in items]
    t = max(len(s.ids) for s in streams)
    ids = torch.full((len(items), t), -1, dtype=torch.long)
    special = torch.zeros(len(items), t, dtype=torch.bool)
    punct = torch.zeros(len(items), t, dtype=torch.bool)
    for b, s in enumerate(streams):
        m = len(s.ids)
        ids[b, :m] = s.ids
        special[b, :m] = torch.tensor(s.special)
        punct[b, :m] = torch.tensor(
            [is_punctuation(x) and not sp for x, sp in zip(s.strings, s.special, strict=True)]
        )
    layout = BatchLayout(
        text=np.array([first + r for r in rows], np.int64),
        lengths=torch.tensor([len(s.ids) for s in streams]),
        starts=starts[rows],
        ids=ids,
        special=special,
        punctuation=punct,
        causal=plan.causal,
    )
    sample = summaries.sample_candidates(layout)
    sampled: dict[str, list[np.ndarray]] = {"weight": [], "norm": []}
    heads = list(plan.heads)
    token_index = layout.token_index.numpy()
    rows_np, cols_np = layout.rows.numpy(), layout.cols.numpy()
    tokens = layout.token_index
    seen: dict[int, dict[str, torch.Tensor]] = {}

    def observer(block: OurBlock) -> Callable[[str, torch.Tensor], None]:
        def observe(name: str, tensor: torch.Tensor) -> None:
            if name == "per-head V":
                seen.setdefault(block.layer, {})["norms"] = value_norms(block.ours, tensor)
            elif name == "per-head context":
                seen.setdefault(block.layer, {})["z"] = tensor

        return observe

    def sink(block: OurBlock, first_head: int) -> Callable[[torch.Tensor], None]:
        def take(weights: torch.Tensor) -> None:
            got = seen.pop(block.layer)
            w, norms = _chosen(weights, heads), _chosen(got["norms"], heads)
            best = summaries.add_layer(first_head, layout, w, norms, sample, sampled)
            ctx = _chosen(got["z"], heads).numpy()  # [B, Hs, T, Dh]
            shard = (z_out.numpy(), squares.numpy(), strongest_key, strongest_weight)
            flat = store_tokens(ctx, rows_np, cols_np, token_index, first_head, best, shard)
            dh, last = plan.d_head, first_head + len(heads)
            projected[tokens] += torch.from_numpy(flat) @ projection[first_head * dh : last * dh]

        return take

    with lm.lock, torch.inference_mode():
        blocks = our_blocks(lm)
        part = [b for b in blocks if b.kind == plan.part]
        chosen = [part[layer] for layer in plan.layers]
        our_pass = OurPass(
            need_weights=False,
            sinks={b.layer: sink(b, i * len(heads)) for i, b in enumerate(chosen)},
            observers={b.layer: observer(b) for b in chosen},
        )
        inputs = pad_inputs(lm, [e.inputs for e, _ in items])
        run_until(lm, blocks, our_pass, inputs, chosen[-1])
    summaries.finish_batch(layout, sample, sampled)


def _chosen(tensor: torch.Tensor, heads: list[int]) -> torch.Tensor:
    """``tensor [B, H, ...]``'s ``heads`` as float32 on the CPU, to be read only (no copy only
    where they are every head in order and the tensor is already float32 on the CPU)."""
    if heads != list(range(tensor.shape[1])):
        tensor = tensor[:, heads]
    return tensor.float().cpu()


# --- merging -----------------------------------------------------------------------------------


def shard_path(out: Path, shard: int) -> Path:
    """The folder of one shard's arrays (one ``.npy`` each)."""
    return out / ".shards" / f"shard-{shard:05d}"


def save_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` as the folder ``path``, one ``.npy`` each (read back memory-mapped, with no
    archive to unpack), which appears whole or not at all: written beside it, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, array in arrays.items():
        with open(tmp / f"{name}.npy", "wb") as f:
            np.save(f, np.asarray(array))
            f.flush()
            os.fsync(f.fileno())
    try:
        os.replace(tmp, path)
    except OSError:  # written meanwhile by another worker given the same shard: the same
        if not path.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def load_shard(path: Path) -> dict[str, np.ndarray]:
    """A shard's arrays (``save_atomic``'s folder), memory-mapped."""
    return {f.stem: np.load(f, mmap_mode="r") for f in path.glob("*.npy")}


def merge_shards(
    out: Path,
    plan: AtlasPlan,
    texts: list[str],
    seconds: float,
    extra: dict,
    held: dict[int, dict] | None = None,
) -> None:
    """The shards' files merged into the atlas folder: token arrays in text order (head-major
    per-token arrays, memory-mapped on reading), the summaries, the index, then the manifest.
    ``held``: shards' arrays still in memory (``build_shard``'s), taken instead of files."""
    held = held or {}

    def shard(s: int) -> dict:
        return held[s] if s in held else load_shard(shard_path(out, s))

    merge_start = time.perf_counter()
    work = out / ".merge"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    lengths = []
    for s in range(plan.shards):  # first pass: the texts' lengths (a small array each)
        lengths.append(
            held[s]["lengths"] if s in held else np.load(shard_path(out, s) / "lengths.npy")
        )
    lengths_all = np.concatenate(lengths).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths_all)]).astype(np.int64)
    n, hs = int(offsets[-1]), len(plan.labels)
    if n == 0:
        raise InputError("No text of the corpus has tokens for this model: nothing to index.")
    mm = np.lib.format.open_memmap
    token_ids = mm(work / "token_ids.npy", "w+", np.int32, (n,))
    special = mm(work / "special.npy", "w+", bool, (n,))
    key = mm(work / "strongest_key.npy", "w+", np.uint16, (hs, n))
    weight = mm(work / "strongest_weight.npy", "w+", np.float16, (hs, n))
    z = mm(work / f"z{BITS}.npy", "w+", np.uint8, (hs, n, code_bytes(plan.d_head, BITS)))
    z_norms = mm(work / f"znorm{NORM_BITS}.npy", "w+", np.uint8, (-(-hs // 2), n))
    projected = mm(work / ".projected.npy", "w+", np.float16, (n, PROJECTION_DIMS))
    tag_ids = mm(work / "tags.npy", "w+", np.uint8, (n,)) if plan.tagged else None
    z_edges = np.zeros((plan.shards, BOOKS, hs, plan.d_head, 2**BITS + 1), np.float32)
    norm_edges = np.zeros((plan.shards, BOOKS, hs, 2**NORM_BITS + 1), np.float32)
    summaries: HeadSummaries | None = None
    truncated = []
    bounds = offsets[np.arange(plan.shards) * plan.shard_texts]
    for s in range(plan.shards):  # then each shard's arrays copied into place
        a, b = bounds[s], offsets[min((s + 1) * plan.shard_texts, plan.texts)]
        f = shard(s)
        token_ids[a:b] = f["token_ids"]
        special[a:b] = f["special"]
        key[:, a:b] = f["strongest_key"]
        weight[:, a:b] = f["strongest_weight"]
        z[:, a:b] = f[f"z{BITS}"]  # shards of another format are redone (``run._start``)
        z_edges[s] = f["z_edges"]
        z_norms[:, a:b] = f[f"znorm{NORM_BITS}"]
        norm_edges[s] = f["z_norm_edges"]
        projected[a:b] = f["projected"]
        if tag_ids is not None:
            tag_ids[a:b] = f["tag_ids"]
        truncated.append(f["truncated"])
        part = HeadSummaries.from_arrays(dict(f))
        summaries = part if summaries is None else summaries.merge(part)
    assert summaries is not None
    for array in (token_ids, special, key, weight, z, z_norms, projected):
        array.flush()
    if tag_ids is not None:
        tag_ids.flush()
    del token_ids, special, key, weight, z, z_norms, tag_ids
    np.save(work / "text_offsets.npy", offsets)
    np.savez(work / "z_ranges.npz", edges=z_edges, norm_edges=norm_edges, bounds=bounds)
    np.savez(work / "heads.npz", **summaries.arrays())
    cut = np.concatenate(truncated) if truncated else np.zeros((0, 2), np.int64)
    vocab = _vocabulary(plan, np.load(work / "token_ids.npy", mmap_mode="r"))
    (work / "vocab.json").write_text(json.dumps(vocab))
    with open(work / "texts.jsonl", "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps(text) + "\n")
    chunks = (projected[i : i + 65_536] for i in range(0, n, 65_536))
    index = build_index(chunks, n, hs * plan.d_head, work)
    del projected
    (work / ".projected.npy").unlink()
    manifest = {
        "kind": "mhsa-atlas",
        "format": FORMAT,
        "plan": plan.json(),
        "heads": plan.labels,
        "tokens": n,
        "texts_with_tokens": int((lengths_all > 0).sum()),
        "blank_texts": int((lengths_all == 0).sum()),
        "truncated_texts": len(cut),
        "truncated_tokens": int(cut[:, 1].sum()) if len(cut) else 0,
        "index": index,
        **({"tags": list(UNIVERSAL_TAGS)} if plan.tagged else {}),
        "build_seconds": round(seconds, 3),  # the shards
        "merge_seconds": round(time.perf_counter() - merge_start, 3),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": _versions(),
        **extra,
    }
    for p in work.iterdir():
        os.replace(p, out / p.name)
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / "manifest.json")
    shutil.rmtree(work, ignore_errors=True)


def _vocabulary(plan: AtlasPlan, token_ids: np.ndarray) -> dict[str, str]:
    """Every token id of the atlas with its string as ``mhsa.attend`` shows it."""
    lm = get_model(plan.model)
    ids = np.unique(np.asarray(token_ids)).tolist()
    return dict(zip(map(str, ids), lm.tokenizer.convert_ids_to_tokens(ids), strict=True))


def _versions() -> dict[str, str]:
    import transformers

    from mhsa.deprecation import REMOVED_IN

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "mhsa_removes": REMOVED_IN,
    }

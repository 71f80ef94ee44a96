"""Corpora: reading them, and running them through a model in padded batches.

A corpus is a text file (one sentence per line), a folder of text files or a Parquet column. Each
entry keeps where it came from (``file:line``) so that a bad line or a sentence over the model's
token limit is reported by place, never dropped silently.

Batching: sentences are sorted by token count and grouped so that one batch holds about
``batch_tokens`` padded tokens; each batch is right-padded and run with its attention mask (the
padding keys get exactly zero weight), and each sentence's attention is cut back to its own
tokens. Statistics, similarity and importance then equal the one-by-one numbers within float
rounding (tested to 1e-6).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mhsa.engine.encoding import Encoded, encode_many
from mhsa.engine.extract import EngineSpec, engine_spec
from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.forward import (
    StopPass,
    attention_modules,
    is_causal,
    make_result,
    our_attention,
    require_attentions,
)
from mhsa.engine.runs.generation import Generation
from mhsa.engine.runs.swap import our_blocks
from mhsa.engine.stream.hooks import after, hooked
from mhsa.errors import InputError, UnsupportedModelError

__all__ = [
    "BATCH_TOKENS",
    "Corpus",
    "Entry",
    "Problem",
    "attend_batched",
    "attend_batches",
    "attend_one_by_one",
    "batch_attention",
    "batch_tokens_for",
    "encode_entries",
    "length_batches",
    "read_corpus",
]

#: padded tokens per forward pass (batch size x longest sentence), by device: on a CPU, batches
#: large enough that sentences of equal length share one statistics pass, and no larger (beyond
#: that the padding costs more than the sharing saves; BENCHMARKS.md); a GPU needs large ones
#: to fill it
BATCH_TOKENS = {"cpu": 2048, "cuda": 8192, "mps": 4096}


def batch_tokens_for(lm: LoadedModel, batch_tokens: int | None = None) -> int:
    """``batch_tokens`` when given, else the default for the model's device."""
    if batch_tokens is not None:
        if batch_tokens < 1:
            raise InputError("batch_tokens must be at least 1.")
        return batch_tokens
    return BATCH_TOKENS.get(lm.device.type, 2048)


#: most sentences in one batch, whatever their length
MAX_BATCH = 128
#: Parquet: the column read when none is named
TEXT_COLUMN = "text"

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Entry:
    """One corpus item: ``where`` it came from (``file:line`` or ``file:row``), its text and,
    for sentence pairs, the second sentence. The text may be a ``Generation`` (what a causal LM
    wrote, kept as the ids it chose) where importance and knock-outs take one."""

    where: str
    text: str | Generation
    pair: str | None = None


@dataclass(frozen=True)
class Problem:
    """An entry that was not used, and why (reported, never dropped silently)."""

    where: str
    reason: str


@dataclass
class Corpus:
    """The usable entries of a corpus and the problems found while reading it."""

    entries: list[Entry]
    problems: list[Problem] = field(default_factory=list)
    source: str = ""

    def __len__(self) -> int:
        return len(self.entries)

    @classmethod
    def of(cls, texts: Iterable[str | tuple[str, str]], source: str = "texts") -> Corpus:
        """A corpus from strings (or ``(sentence, sentence)`` pairs) in memory."""
        entries = []
        for i, item in enumerate(texts, start=1):
            if isinstance(item, tuple):
                entries.append(Entry(f"{source}:{i}", item[0], item[1]))
            else:
                entries.append(Entry(f"{source}:{i}", item))
        return cls(entries, [], source)


def _line_entry(where: str, raw: bytes, pairs: bool) -> Entry | Problem | None:
    try:
        line = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return Problem(where, "not UTF-8 text")
    if not line:
        return None  # blank lines separate nothing and are not sentences
    if "\x00" in line:
        return Problem(where, "contains NUL characters (binary data?)")
    if not pairs:
        return Entry(where, line)
    first, tab, second = line.partition("\t")
    if not tab or not first.strip() or not second.strip():
        return Problem(where, "not two tab-separated sentences")
    return Entry(where, first.strip(), second.strip())


def _read_lines(path: Path, pairs: bool, corpus: Corpus) -> None:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"Cannot read {path}: {e.strerror}") from e
    for number, raw in enumerate(data.splitlines(), start=1):
        item = _line_entry(f"{path.name}:{number}", raw, pairs)
        if isinstance(item, Entry):
            corpus.entries.append(item)
        elif isinstance(item, Problem):
            corpus.problems.append(item)


def _read_parquet(path: Path, column: str, pairs: bool, corpus: Corpus) -> None:
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except ImportError as e:
        raise InputError("Reading Parquet needs pyarrow: pip install pyarrow.") from e
    except Exception as e:
        raise InputError(f"Cannot read {path} as Parquet: {e}") from e
    names = column.split(",") if pairs else [column]
    missing = [c for c in names if c not in frame.columns]
    if missing or (pairs and len(names) != 2):
        raise InputError(
            f"{path.name} has no column {', '.join(missing) or column!r} "
            f"(columns: {', '.join(map(str, frame.columns))})"
            + ("; for pairs name two columns as 'first,second'." if pairs else ".")
        )
    for row, values in enumerate(frame[names].itertuples(index=False), start=1):
        where = f"{path.name}:row {row}"
        texts = [v.strip() if isinstance(v, str) else None for v in values]
        if any(t is None for t in texts):
            corpus.problems.append(Problem(where, "not a string (missing or another type)"))
        elif not all(texts):
            corpus.problems.append(Problem(where, "empty text"))
        elif "\x00" in "".join(texts):  # type: ignore[arg-type]
            corpus.problems.append(Problem(where, "contains NUL characters (binary data?)"))
        else:
            corpus.entries.append(Entry(where, texts[0], texts[1] if pairs else None))  # type: ignore[arg-type]


def read_corpus(source: str | Path, *, column: str = TEXT_COLUMN, pairs: bool = False) -> Corpus:
    """Read a corpus: a text file (one sentence per line; with ``pairs``, two tab-separated
    sentences), a folder of ``*.txt`` files (in name order) or a ``.parquet`` file (the column
    ``column``; with ``pairs``, two columns named ``"first,second"``).

    Blank lines are skipped; a line that is not UTF-8, holds NUL characters, or (pairs) is not two
    sentences becomes a ``Problem`` with its place.

    Raises:
        InputError: the source does not exist, cannot be read, or holds no usable entry.
    """
    path = Path(source)
    corpus = Corpus([], [], str(path))
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".txt" and p.is_file())
        parquet = sorted(p for p in path.iterdir() if p.suffix == ".parquet" and p.is_file())
        if not files and not parquet:
            raise InputError(f"The folder {path} holds no .txt or .parquet files.")
        for f in files:
            _read_lines(f, pairs, corpus)
        for f in parquet:
            _read_parquet(f, column, pairs, corpus)
    elif path.suffix == ".parquet":
        if not path.is_file():
            raise InputError(f"Cannot read {path}: no such file.")
        _read_parquet(path, column, pairs, corpus)
    else:
        _read_lines(path, pairs, corpus)
    if not corpus.entries:
        found = f" ({len(corpus.problems)} bad)" if corpus.problems else ""
        raise InputError(f"{path} holds no usable sentences{found}.")
    return corpus


# --- batching ---------------------------------------------------------------------------------


def encode_entries(
    lm: LoadedModel, entries: Sequence[Entry], max_tokens: int | None
) -> tuple[list[tuple[int, Encoded]], list[Problem]]:
    """Each entry's first sentence tokenized, with its index; entries the model cannot take (over
    its token limit without ``max_tokens``, no tokens) become problems. Caller holds the lock."""
    encoded, problems = [], []
    done = encode_many(lm, [entry.text for entry in entries], max_tokens)
    for index, (entry, value) in enumerate(zip(entries, done, strict=True)):
        if isinstance(value, InputError):
            problems.append(Problem(entry.where, str(value)))
        else:
            encoded.append((index, value))
    return encoded, problems


def length_batches(
    lengths: Sequence[int], batch_tokens: int = 512, max_batch: int = MAX_BATCH
) -> list[list[int]]:
    """Positions into ``lengths`` grouped into batches of similar length: sorted by length, each
    batch as large as ``batch_tokens`` padded tokens (rows x longest) and ``max_batch`` allow."""
    if batch_tokens < 1 or max_batch < 1:
        raise InputError("batch_tokens and max_batch must be at least 1.")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[i]  # ascending order: the newest sentence is the batch's longest
        if current and (len(current) >= max_batch or (len(current) + 1) * longest > batch_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def pad_inputs(
    lm: LoadedModel, inputs: Sequence[dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """Encoded sentences (batch 1 each) as one right-padded batch with an attention mask. Each
    input is padded to its own longest row: an encoder-decoder's ``decoder_input_ids`` (with
    the padding token, like ``input_ids``) to the longest decoder input, whose causal mask keeps
    every real query off the padding after it."""
    tok = lm.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    keys = set(inputs[0]) | {"attention_mask"}
    out = {}
    for key in sorted(keys):
        rows = []
        for x in inputs:
            value = x.get(key)
            if value is None:  # a tokenizer that gives no attention mask: every token counts
                value = torch.ones_like(x["input_ids"])
            rows.append(value)
        n = max(r.shape[1] for r in rows)
        fill = pad if key in ("input_ids", "decoder_input_ids") else 0
        out[key] = torch.cat([F.pad(r, (0, n - r.shape[1]), value=fill) for r in rows])
    return out


def _attentions_until_the_last(
    lm: LoadedModel, inputs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, ...] | None:
    """Every layer's attention weights of a padded batch through the model's own attention,
    stopping right after the last layer's: its value path, feed-forward block and any head on
    top change no weight, so the statistics pass skips their work. Hooks read the same
    outputs transformers records as ``attentions``; None when the model does not name its
    attention modules (the caller then runs all of it)."""
    modules = attention_modules(lm.model)
    layers = lm.facts()["layers"]
    if not modules or (layers and len(modules) != layers):
        return None
    weights: list[torch.Tensor] = []

    def keep(_module, _args, output) -> None:
        value = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if value is None:
            raise StopPass  # no weights (not eager): weights stays short, caller checks
        weights.append(value)
        if len(weights) == len(modules):
            raise StopPass

    with hooked([after(m, keep) for m in modules], stop=True):
        lm.model(**inputs, output_attentions=True, return_dict=True)
    return tuple(weights) if len(weights) == len(modules) else None


def batch_attention(
    lm: LoadedModel, spec: EngineSpec, inputs: dict[str, torch.Tensor], seed: int
) -> tuple[Sequence[torch.Tensor], bool]:
    """Each layer's ``[B, H, T, T]`` attention of a padded batch (inputs on the model's device,
    with an attention mask) through ``spec``'s engine, and whether the model is causal. The
    caller holds ``lm.lock``."""
    if not spec.our_module:
        attentions = _attentions_until_the_last(lm, inputs)
        if attentions is None:  # a model whose attention modules cannot be found: all of it
            outputs = lm.model(**inputs, output_attentions=True, return_dict=True)
            attentions = getattr(outputs, "attentions", None)
        attentions = require_attentions(attentions, "self", lm.display_name)
        n0 = int(inputs["attention_mask"][0].sum())
        first = tuple(a[:1, :, :n0, :n0] for a in attentions[:1])
        return attentions, is_causal(first)
    blocks = our_blocks(lm, seed if spec.seeded else None)
    sink, _ = our_attention(lm, blocks, inputs, whole=False)  # weights are all it needs
    return sink, blocks[0].causal


def attend_batched(
    entries: Sequence[Entry],
    lm: LoadedModel,
    **kwargs: Any,
) -> Iterator[tuple[int, AttentionResult]]:
    """``(index into entries, AttentionResult)`` for every usable entry, computed in padded
    batches of similar length (in length order, not corpus order); see ``attend_batches``."""
    for batch in attend_batches(entries, lm, **kwargs):
        yield from batch


def attend_batches(
    entries: Sequence[Entry],
    lm: LoadedModel,
    *,
    engine: str = "transformers",
    max_tokens: int | None = None,
    seed: int = 0,
    batch_tokens: int | None = None,
    max_batch: int = MAX_BATCH,
    problems: list[Problem] | None = None,
) -> Iterator[list[tuple[int, AttentionResult]]]:
    """Per padded batch, ``(index into entries, AttentionResult)`` of its sentences: every
    usable entry, in batches of similar length (in length order, not corpus order). Entries the
    model cannot take are appended to ``problems`` (when given) instead.

    The results equal ``attend(text, ...)`` one by one within float rounding: each sentence's
    attention is cut to its own tokens, and padding keys get zero weight.
    """
    spec = engine_spec(engine)
    if lm.is_encoder_decoder:
        raise UnsupportedModelError(
            "Batched corpus runs take encoder or decoder models; encoder-decoder models run one "
            "sentence at a time (batched=False)."
        )
    with lm.lock:
        encoded, bad = encode_entries(lm, entries, max_tokens)
    if problems is not None:
        problems.extend(bad)
    lengths = [e.inputs["input_ids"].shape[1] for _, e in encoded]
    for batch in length_batches(lengths, batch_tokens_for(lm, batch_tokens), max_batch):
        yield _attend_batch(lm, spec, entries, [encoded[i] for i in batch], seed)


def _attend_batch(
    lm: LoadedModel,
    spec: EngineSpec,
    entries: Sequence[Entry],
    items: Sequence[tuple[int, Encoded]],
    seed: int,
) -> list[tuple[int, AttentionResult]]:
    """One padded batch of encoded entries through the engine: ``(index, AttentionResult)`` per
    sentence, each cut back to its own tokens."""
    with lm.lock, torch.inference_mode():
        inputs = pad_inputs(lm, [e.inputs for _, e in items])
        inputs = {k: v.to(lm.device) for k, v in inputs.items()}
        start = time.perf_counter()
        attention, causal = batch_attention(lm, spec, inputs, seed)
        seconds = (time.perf_counter() - start) / len(items)
        layers = [a.float().cpu().numpy() for a in attention]  # L x (B, H, T, T)
    done = []
    for row, (index, enc) in enumerate(items):
        n = enc.inputs["input_ids"].shape[1]
        result = make_result(
            lm,
            enc,
            entries[index].text,
            # each sentence copied once, straight into its own [L, H, n, n]
            np.stack([layer[row, :, :n, :n] for layer in layers]),
            engine=spec.name,
            timings={"load": lm.load_seconds, "forward": seconds},
            causal=causal,
            seed=seed if spec.seeded else None,
        )
        done.append((index, result))
    return done


def attend_one_by_one(
    entries: Sequence[Entry],
    lm: LoadedModel,
    *,
    engine: str = "transformers",
    max_tokens: int | None = None,
    seed: int = 0,
    problems: list[Problem] | None = None,
) -> Iterator[tuple[int, AttentionResult]]:
    """``attend`` for each entry in corpus order (the reference the batched path must equal, and
    the path for encoder-decoder models); the same problems as ``attend_batched``."""
    from mhsa.engine.extract import attend

    for index, entry in enumerate(entries):
        try:
            yield (
                index,
                attend(entry.text, model=lm, engine=engine, max_tokens=max_tokens, seed=seed),
            )
        except InputError as e:
            if problems is None:
                raise
            problems.append(Problem(entry.where, str(e)))

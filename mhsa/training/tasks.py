"""Toy tasks for training small transformers: seeded sequence generators, their word-level
vocabulary and tokenizer, and the positions each task scores.

Every sequence of a causal task is ``[BOS] s_1 .. s_L [SEP]? t_1 .. t_L`` where ``s`` are
distinct random symbols and ``t`` is a function of them (the same symbols, reversed, sorted).
Next-token accuracy is measured on the predictions of ``t_2 .. t_L`` (induction: the first
repeated symbol cannot be foreseen) or ``t_1 .. t_L`` (after a separator, the output is
determined by the input).

A long task (``LONG_TASKS``: ``induction-long``) draws its symbols with replacement (a thousand
symbols cannot be distinct among 60); ``scripts/train_toy_long.py`` trains it (the Train heads
page and ``python -m mhsa train`` take ``TASKS``, sequences of a few dozen tokens).

An encoder-decoder task (``TaskSpec.encoder_decoder``) splits the two: the encoder reads
``[BOS] s_1 .. s_L`` and the decoder ``[BOS] t_1 .. t_L`` (``[BOS]`` is the decoder's start
token), each as the toy tokenizer writes a text; decoder position ``k`` predicts ``t_{k+1}``,
and all L of them are scored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from mhsa.registry import lookup

__all__ = [
    "BOS",
    "IGNORE",
    "LONG_TASKS",
    "PAD",
    "SEP",
    "SPECIAL_TOKENS",
    "SYMBOLS",
    "TASKS",
    "VOCAB",
    "Example",
    "TaskBatch",
    "TaskSpec",
    "make_tokenizer",
    "probe",
    "probe_batch",
    "sample",
    "task_examples",
    "task_spec",
    "task_vocab",
]

PAD, UNK, BOS, SEP = "[PAD]", "[UNK]", "[BOS]", "[SEP]"
SPECIAL_TOKENS = (PAD, UNK, BOS, SEP)
#: consonant-vowel syllables ("ba", "be", ...): readable, one token each, sorted as written
SYMBOLS: tuple[str, ...] = tuple(c + v for c in "bdfgklmnprst" for v in "aeiou")
#: token -> id: the special tokens first, then the symbols in their sorted order
VOCAB: Mapping[str, int] = MappingProxyType(
    {t: i for i, t in enumerate((*SPECIAL_TOKENS, *SYMBOLS))}
)
PAD_ID, BOS_ID, SEP_ID = VOCAB[PAD], VOCAB[BOS], VOCAB[SEP]
FIRST_SYMBOL = len(SPECIAL_TOKENS)
#: the target of a position that is not scored (``torch.nn.functional.cross_entropy``'s default)
IGNORE = -100


@dataclass(frozen=True)
class TaskSpec:
    """One toy task.

    Attributes:
        name: what ``TrainConfig.task``, the command line and ``toy:<name>`` take.
        description: the task for people.
        lengths: ``(shortest, longest)`` number L of input symbols, drawn uniformly.
        separator: a ``[SEP]`` token stands between the input and the output.
        output: the output symbols as a function of the input symbols.
        scored: which predictions the accuracy counts, for people.
        encoder_decoder: the input goes to an encoder, the output to a decoder (module
            docstring); trained in an encoder-decoder family.
        symbols: the symbols drawn (``SYMBOLS``).
        distinct: the input symbols are distinct (else drawn with replacement).
    """

    name: str
    description: str
    lengths: tuple[int, int]
    separator: bool
    output: Callable[[Sequence[int]], list[int]]
    scored: str
    encoder_decoder: bool = False
    symbols: tuple[str, ...] = SYMBOLS
    distinct: bool = True

    @property
    def vocab(self) -> Mapping[str, int]:
        """Token -> id of this task's vocabulary: the special tokens, then its symbols."""
        return task_vocab(self)

    @property
    def max_tokens(self) -> int:
        """Length of the longest sequence: BOS, input, separator, output (encoder-decoder: of
        the longest encoder or decoder input, BOS and L symbols)."""
        if self.encoder_decoder:
            return 1 + self.lengths[1]
        return 1 + 2 * self.lengths[1] + int(self.separator)

    def sequence(self, symbols: Sequence[int]) -> list[int]:
        """Token ids of the whole sequence for these input symbol ids."""
        middle = [SEP_ID] if self.separator else []
        return [BOS_ID, *symbols, *middle, *self.output(symbols)]

    def first_scored(self, length: int) -> int:
        """Index of the first token whose prediction is scored, for an input of ``length``
        symbols: the second output token after a plain repeat (its first token cannot be
        foreseen), the first output token after a separator."""
        return 2 + length


TASKS: Mapping[str, TaskSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            TaskSpec(
                "induction",
                "[BOS], then L distinct random symbols (L from 8 to 24), then the same L symbols "
                "again: continuing the repeat needs an induction head",
                (8, 24),
                separator=False,
                output=list,
                scored="the repeated half (its first symbol cannot be foreseen)",
            ),
            TaskSpec(
                "copy",
                "[BOS], L distinct random symbols (L from 4 to 12), [SEP], the same symbols",
                (4, 12),
                separator=True,
                output=list,
                scored="the output after [SEP]",
            ),
            TaskSpec(
                "reverse",
                "[BOS], L distinct random symbols (L from 4 to 12), [SEP], the symbols reversed",
                (4, 12),
                separator=True,
                output=lambda s: list(reversed(s)),
                scored="the output after [SEP]",
            ),
            TaskSpec(
                "sort",
                "[BOS], L distinct random symbols (L from 4 to 12), [SEP], the symbols sorted "
                "alphabetically",
                (4, 12),
                separator=True,
                output=sorted,
                scored="the output after [SEP]",
            ),
            TaskSpec(
                "reverse-seq2seq",
                "the encoder reads [BOS] and L distinct random symbols (L from 4 to 12), the "
                "decoder writes them reversed after its start token [BOS]",
                (4, 12),
                separator=False,
                output=lambda s: list(reversed(s)),
                scored="the decoder's output (every reversed symbol)",
                encoder_decoder=True,
            ),
        )
    }
)


#: tasks whose sequences run to thousands of tokens: trained by ``scripts/train_toy_long.py``
#: (one input length a batch, logits only where scored), not by ``python -m mhsa train``
LONG_TASKS: Mapping[str, TaskSpec] = MappingProxyType(
    {
        "induction-long": TaskSpec(
            "induction-long",
            "[BOS], then L random symbols drawn with replacement (L from 8 to 1023), then the "
            "same L symbols again: continuing the repeat over up to 2,047 tokens needs an "
            "induction head that finds the earlier occurrences however far back",
            (8, 1023),
            separator=False,
            output=list,
            scored="the repeated half (its first symbol cannot be foreseen)",
            distinct=False,
        )
    }
)


def task_spec(name: str) -> TaskSpec:
    """The task called ``name`` (``TASKS`` or ``LONG_TASKS``).

    Raises:
        ValueError: no such task; the message lists them.
    """
    return lookup({**TASKS, **LONG_TASKS}, name, "task", error=ValueError)


_VOCABS: dict[tuple[str, ...], Mapping[str, int]] = {SYMBOLS: VOCAB}


def task_vocab(task: TaskSpec) -> Mapping[str, int]:
    """Token -> id of ``task``'s vocabulary: the special tokens first (the same ids in every
    task), then its symbols in their sorted order (``VOCAB`` for the 60 syllables)."""
    if task.symbols not in _VOCABS:
        tokens = (*SPECIAL_TOKENS, *task.symbols)
        _VOCABS[task.symbols] = MappingProxyType({t: i for i, t in enumerate(tokens)})
    return _VOCABS[task.symbols]


@dataclass(frozen=True)
class TaskBatch:
    """Sequences of one task, right-padded with ``[PAD]`` (a causal model: padding after a
    sequence changes nothing before it, so no attention mask is needed; an encoder-decoder
    model: the encoder's ``attention_mask`` hides it).

    Attributes:
        ids: token ids ``[B, T]`` (int64): the whole sequence, or the encoder's input.
        targets: ``[B, T]`` (encoder-decoder: ``[B, T_dec]``): the next token where that
            prediction is scored, ``IGNORE`` elsewhere.
        lengths: the input length L of each sequence ``[B]``.
        decoder_ids: encoder-decoder tasks: the decoder's input ``[B, T_dec]``, else None.
    """

    ids: np.ndarray
    targets: np.ndarray
    lengths: np.ndarray
    decoder_ids: np.ndarray | None = None

    @property
    def attention_mask(self) -> np.ndarray:
        """``[B, T]``: 1 on a token of ``ids``, 0 on padding."""
        return (self.ids != PAD_ID).astype(np.int64)


def _symbols(rng: np.random.Generator, length: int, task: TaskSpec | None = None) -> list[int]:
    """``length`` symbol ids of ``task`` (default: the 60 syllables, distinct)."""
    pool, distinct = (SYMBOLS, True) if task is None else (task.symbols, task.distinct)
    chosen = rng.choice(len(pool), size=length, replace=not distinct)
    return (chosen + FIRST_SYMBOL).tolist()


def sample(
    task: TaskSpec, rng: np.random.Generator, batch: int, *, length: int | None = None
) -> TaskBatch:
    """``batch`` sequences of ``task`` drawn from ``rng``.

    Args:
        task: the task.
        rng: the random generator (seeded by the caller: the same state gives the same batch).
        batch: how many sequences.
        length: every sequence with this input length (default: uniform over ``task.lengths``).
    """
    lo, hi = task.lengths
    lengths = np.full(batch, length) if length is not None else rng.integers(lo, hi + 1, batch)
    if task.encoder_decoder:
        return _sample_encoder_decoder(task, rng, lengths)
    seqs = [task.sequence(_symbols(rng, int(n), task)) for n in lengths]
    width = max(len(s) for s in seqs)
    ids = np.full((batch, width), PAD_ID, dtype=np.int64)
    targets = np.full((batch, width), IGNORE, dtype=np.int64)
    for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
        ids[row, : len(seq)] = seq
        first = task.first_scored(int(n))
        targets[row, first - 1 : len(seq) - 1] = seq[first:]  # position p predicts token p + 1
    return TaskBatch(ids, targets, lengths.astype(np.int64))


def _sample_encoder_decoder(
    task: TaskSpec, rng: np.random.Generator, lengths: np.ndarray
) -> TaskBatch:
    """Encoder input ``[BOS] s_1 .. s_L``, decoder input ``[BOS] t_1 .. t_L``; decoder position
    k < L predicts ``t_{k+1}`` (the last position, after ``t_L``, is not scored)."""
    sources = [_symbols(rng, int(n), task) for n in lengths]
    width = 1 + int(lengths.max())
    ids = np.full((len(lengths), width), PAD_ID, dtype=np.int64)
    decoder = np.full_like(ids, PAD_ID)
    targets = np.full_like(ids, IGNORE)
    for row, source in enumerate(sources):
        output = task.output(source)
        ids[row, : 1 + len(source)] = [BOS_ID, *source]
        decoder[row, : 1 + len(output)] = [BOS_ID, *output]
        targets[row, : len(output)] = output
    return TaskBatch(ids, targets, lengths.astype(np.int64), decoder)


#: the probe's input length and seed: one fixed, mid-length sequence per task
_PROBE_LENGTH = {"induction": 10}
_PROBE_SEED = 20220308  # Olsson et al.'s induction-heads paper, March 2022


def probe_batch(task: TaskSpec) -> TaskBatch:
    """The task's fixed probe as a batch of one sequence (``probe``)."""
    length = _PROBE_LENGTH.get(task.name, sum(task.lengths) // 2)
    return sample(task, np.random.default_rng(_PROBE_SEED), 1, length=length)


def probe(task: TaskSpec) -> list[int]:
    """The task's fixed probe sequence (token ids), the one whose attention a page draws while
    it trains (induction: a repeated sequence; encoder-decoder: the encoder's input)."""
    return probe_batch(task).ids[0].tolist()


def make_tokenizer(task: TaskSpec | None = None) -> Any:
    """A transformers tokenizer for ``VOCAB`` (or ``task``'s vocabulary, ``task_vocab``):
    whitespace-separated words, one token each, ``[BOS]`` put in front of every text; unknown
    words become ``[UNK]``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = VOCAB if task is None else task_vocab(task)
    longest = max(t.max_tokens for t in TASKS.values()) if task is None else task.max_tokens
    core = Tokenizer(models.WordLevel(vocab=dict(vocab), unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {SEP} $B", special_tokens=[(BOS, BOS_ID), (SEP, SEP_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        sep_token=SEP,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=longest,
    )


@dataclass(frozen=True)
class Example:
    """One example input of a model.

    Attributes:
        text: the sentence (an encoder-decoder's source).
        target: an encoder-decoder's target (its decoder's text), else None.
        about: what the example shows, in one line.
    """

    text: str
    target: str | None = None
    about: str = ""


#: examples per toy task, and the input lengths they use
_EXAMPLE_COUNT = 3
_EXAMPLE_SEED = 2026


def task_examples(task: str) -> tuple[Example, ...]:
    """Examples of the toy task ``task`` as its tokenizer reads a text (the ``[BOS]`` it adds
    left out): sequences the task's own generator draws (``mhsa.training.tasks.sample``) from a
    fixed seed, of a short, a middle and the longest trained length.

    Raises:
        ValueError: no such task.
    """
    spec = task_spec(task)
    words = {i: t for t, i in spec.vocab.items()}
    low, high = spec.lengths
    lengths = sorted({low + (high - low) // 3, (low + high) // 2, high})[:_EXAMPLE_COUNT]

    def text(ids: np.ndarray) -> str:
        return " ".join(words[int(i)] for i in ids if i not in (PAD_ID, BOS_ID))

    out = []
    for k, length in enumerate(lengths):
        batch = sample(spec, np.random.default_rng(_EXAMPLE_SEED + k), 1, length=length)
        about = f"{length} symbols: {spec.description}"
        if spec.encoder_decoder and batch.decoder_ids is not None:
            out.append(Example(text(batch.ids[0]), text(batch.decoder_ids[0]), about))
        else:
            out.append(Example(text(batch.ids[0]), None, about))
    return tuple(out)

"""Per-head statistics over a corpus (``corpus_stats``): the corpus read and run in padded
batches by ``mhsa.engine.runs.batches``, each batch's results added to running sums
(``mhsa.analysis.stats``, ``mhsa.analysis.similarity``), so memory does not grow with the corpus;
shards merge (``mhsa.corpus.distributed`` runs them on Ray)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mhsa.analysis.similarity import HeadSimilarityAccumulator
from mhsa.analysis.stats import HeadStatsAccumulator
from mhsa.engine.models.loading import LoadedModel, get_model
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.batches import Entry, Problem, Progress, attend_batches, attend_one_by_one

__all__ = ["CorpusStats", "corpus_stats"]


@dataclass
class CorpusStats:
    """Statistics (and the similarity matrix) of a corpus or of one shard of it, mergeable.

    Attributes:
        stats: per-head statistics (``.frame()`` is ``head_stats``'s table).
        similarity: heads x heads running mean, when asked for.
        problems: entries that were not used, with their places and reasons.
        used: sentences that reached the accumulators.
        seconds: time spent (summed over shards when merged).
    """

    stats: HeadStatsAccumulator
    similarity: HeadSimilarityAccumulator | None = None
    problems: list[Problem] = field(default_factory=list)
    used: int = 0
    seconds: float = 0.0

    def merge(self, other: CorpusStats) -> CorpusStats:
        """Add a shard's results; returns self (order-independent up to float rounding)."""
        self.stats.merge(other.stats)
        if (self.similarity is None) != (other.similarity is None):
            raise ValueError("Cannot merge a shard with a similarity matrix into one without.")
        if self.similarity is not None and other.similarity is not None:
            self.similarity.merge(other.similarity)
        self.problems.extend(other.problems)
        self.used += other.used
        self.seconds += other.seconds
        return self


def corpus_stats(
    entries: Sequence[Entry],
    *,
    model: str | LoadedModel,
    engine: str = "transformers",
    word_level: bool = False,
    similarity: str | None = None,
    max_tokens: int | None = None,
    batched: bool = True,
    batch_tokens: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> CorpusStats:
    """Per-head statistics (and, with ``similarity="js"`` or ``"cosine"``, the heads x heads
    matrix) over ``entries``, in padded batches (``batched``) or one sentence at a time; both
    give the same numbers within float rounding. Only running sums are kept: memory does not
    grow with the corpus. ``progress(done, total)`` after each batch (sentences)."""
    lm = model if isinstance(model, LoadedModel) else get_model(model)
    out = CorpusStats(
        HeadStatsAccumulator(word_level=word_level),
        HeadSimilarityAccumulator(similarity) if similarity else None,
    )
    start = time.perf_counter()
    problems: list[Problem] = []
    total = len(entries)
    groups = _result_groups(
        entries,
        lm,
        batched=batched,
        engine=engine,
        max_tokens=max_tokens,
        seed=seed,
        batch_tokens=batch_tokens,
        problems=problems,
    )
    for group in groups:
        results = [r for _, r in group]
        out.stats.add_many(results)
        if out.similarity is not None:
            for result in results:
                out.similarity.add(result.to_words() if word_level else result)
        out.used += len(results)
        if progress is not None:
            progress(out.used + len(problems), total)
    out.problems = problems
    out.seconds = time.perf_counter() - start
    return out


def _result_groups(
    entries: Sequence[Entry],
    lm: LoadedModel,
    *,
    batched: bool,
    engine: str,
    max_tokens: int | None,
    seed: int,
    batch_tokens: int | None,
    problems: list[Problem],
) -> Iterable[list[tuple[int, AttentionResult]]]:
    """The entries' results in padded batches (``batched``, for models that take them), else
    one by one as groups of one."""
    if batched and not lm.is_encoder_decoder:
        return attend_batches(
            entries,
            lm,
            engine=engine,
            max_tokens=max_tokens,
            seed=seed,
            batch_tokens=batch_tokens,
            problems=problems,
        )
    return (
        [pair]
        for pair in attend_one_by_one(
            entries, lm, engine=engine, max_tokens=max_tokens, seed=seed, problems=problems
        )
    )

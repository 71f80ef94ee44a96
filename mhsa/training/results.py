"""What a run gives back: a snapshot at each evaluation (``TrainSnapshot``), the finished run
(``TrainResult``: the history table, the phase-change step, the trained model) and the
held-out evaluation of a model (``Evaluation``)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from mhsa.heads import head_label
from mhsa.training.scores import HeadScores

if TYPE_CHECKING:
    from mhsa.training.config import TrainConfig

__all__ = [
    "PHASE_CHANGE_SCORE",
    "Evaluation",
    "PhaseChange",
    "TrainResult",
    "TrainSnapshot",
    "best_anti_diagonal",
    "best_scores",
    "history",
    "phase_change",
    "phase_change_step",
]

#: the induction score a head must reach for the phase change to count as happened
PHASE_CHANGE_SCORE = 0.5


@dataclass(frozen=True)
class TrainSnapshot:
    """The state of a training run at one step: what a page draws while it trains.

    Attributes:
        step: optimizer steps done.
        loss: cross-entropy on the scored positions of a fixed evaluation batch (the same
            sequences at every snapshot, drawn apart from the training data).
        accuracy: next-token accuracy on the same positions.
        elapsed: seconds since training began.
        probe_tokens: the task's fixed probe sequence (``tasks.probe``), as tokens (an
            encoder-decoder task: the decoder's input).
        probe_attention: float32 ``[layers, heads, n, n]`` on the probe (an encoder-decoder
            task: the cross attention ``[layers, heads, n_dec, n_enc]``).
        previous_token_scores: ``[layers, heads]`` on the probe (``scores`` module; an
            encoder-decoder task: of the decoder's self attention).
        induction_scores: ``[layers, heads]`` on the probe.
        anti_diagonal_scores: an encoder-decoder task: ``[layers, heads]`` of the cross
            attention on the probe (``scores.anti_diagonal_scores``), else None.
        probe_source_tokens: an encoder-decoder task: the encoder's input, as tokens (the
            columns of ``probe_attention``), else None.
        k_edge_scores: the induction task: ``[layers, heads, layers, heads]`` the EAP score of
            each head's edge into each later head's key on a fixed probe pair
            (``circuit_probe.k_edge_scores``; NaN where there is no edge), else None.
    """

    step: int
    loss: float
    accuracy: float
    elapsed: float
    probe_tokens: list[str]
    probe_attention: np.ndarray
    previous_token_scores: np.ndarray
    induction_scores: np.ndarray
    anti_diagonal_scores: np.ndarray | None = None
    probe_source_tokens: list[str] | None = None
    k_edge_scores: np.ndarray | None = None

    @property
    def scores(self) -> HeadScores:
        """The snapshot's head scores."""
        return HeadScores(
            self.previous_token_scores, self.induction_scores, self.anti_diagonal_scores
        )


@dataclass(frozen=True)
class TrainResult:
    """A finished (or stopped) run.

    Attributes:
        config: the settings.
        history: one row per snapshot: ``step``, ``loss``, ``accuracy``, ``previous_token``
            (best head of layer 0), ``induction`` (best head above layer 0; of layer 0 for
            one-layer models), then ``previous_token L0H0``... and ``induction L0H0``... per head
            (an encoder-decoder task: ``anti_diagonal``, the best cross-attention head, then
            ``anti_diagonal L0H0``... per head, in place of both).
        snapshots: every snapshot, in order.
        phase_change_step: the step where the phase change starts (``phase_change``: the
            steepest rise of the accuracy, once a head above layer 0 reached an induction
            score of ``PHASE_CHANGE_SCORE`` on the probe; None: never).
        accuracy: final next-token accuracy on held-out sequences (``evaluate``), through the
            model's own attention after the write-back.
        seconds: training time, from building the model to writing the weights back.
        cpu_seconds: the CPU time of the training thread in that time (with one thread and a
            busy machine, what the run costs where ``seconds`` says how long it waited).
        stopped_early: ``should_stop`` ended the run before ``config.steps``.
        model: the trained transformers model (``LlamaForCausalLM`` / ``GPT2LMHeadModel`` /
            ``BartForConditionalGeneration``), in eval mode, on the training device.
        tokenizer: its tokenizer (``tasks.make_tokenizer``).
        final: the held-out evaluation behind ``accuracy`` (scores pooled over its sequences).
    """

    config: TrainConfig
    history: pd.DataFrame
    snapshots: list[TrainSnapshot]
    phase_change_step: int | None
    accuracy: float
    seconds: float
    stopped_early: bool
    model: Any
    tokenizer: Any
    final: Evaluation | None = field(default=None, repr=False)
    cpu_seconds: float = 0.0

    @property
    def steps_done(self) -> int:
        return self.snapshots[-1].step if self.snapshots else 0


@dataclass(frozen=True)
class Evaluation:
    """Accuracy and head scores of a model on held-out sequences of a task.

    Attributes:
        accuracy: next-token accuracy on the scored positions.
        scores: previous-token and induction scores pooled over the sequences.
        sequences: how many sequences.
    """

    accuracy: float
    scores: HeadScores
    sequences: int

    def best(self) -> tuple[float, float]:
        """``(best previous-token score in layer 0, best induction score above layer 0)``."""
        return best_scores(self.scores)

    def best_anti_diagonal(self) -> tuple[str, float] | None:
        """``(head label, score)`` of the cross-attention head with the highest anti-diagonal
        score (an encoder-decoder task), else None."""
        return best_anti_diagonal(self.scores)


def best_scores(scores: HeadScores) -> tuple[float, float]:
    """``(best previous-token score in layer 0, best induction score above layer 0)`` (a
    one-layer model: of layer 0)."""
    above = scores.induction[1:] if scores.induction.shape[0] > 1 else scores.induction
    return float(scores.previous_token[0].max()), float(above.max())


def best_anti_diagonal(scores: HeadScores) -> tuple[str, float] | None:
    """``(head label, score)`` of the head with the highest anti-diagonal score, else None."""
    if scores.anti_diagonal is None:
        return None
    a = scores.anti_diagonal
    layer, head = divmod(int(a.argmax()), a.shape[1])
    return head_label(layer, head), float(a[layer, head])


def history(snapshots: Sequence[TrainSnapshot]) -> pd.DataFrame:
    """``TrainResult.history`` of ``snapshots``: one row per snapshot."""
    rows = []
    for s in snapshots:
        scores = s.scores
        row: dict[str, Any] = {"step": s.step, "loss": s.loss, "accuracy": s.accuracy}
        if scores.anti_diagonal is None:
            row["previous_token"], row["induction"] = best_scores(scores)
            per_head = {"previous_token": scores.previous_token, "induction": scores.induction}
        else:
            row["anti_diagonal"] = float(scores.anti_diagonal.max())
            per_head = {"anti_diagonal": scores.anti_diagonal}
        for what, array in per_head.items():
            for (layer, head), value in np.ndenumerate(array):
                row[f"{what} {head_label(layer, head)}"] = float(value)
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class PhaseChange:
    """The induction phase change of a run (Olsson et al. 2022, "In-context Learning and
    Induction Heads", §3: in a narrow window of training the model's in-context learning jumps
    while its induction heads form).

    Attributes:
        step: the snapshot where the steepest rise of the held-out accuracy on the scored
            (repeated) positions starts: the start of the jump.
        end: the next snapshot, where that steepest interval ends.
        before: the accuracy at ``step``.
        after: the accuracy at ``end``.
        score: the best induction score above layer 0 at the last snapshot seen, at least
            ``PHASE_CHANGE_SCORE`` (the head that formed).
    """

    step: int
    end: int
    before: float
    after: float
    score: float


def phase_change(snapshots: Sequence[TrainSnapshot]) -> PhaseChange | None:
    """The phase change among ``snapshots`` (see ``PhaseChange``): the interval between two
    snapshots where the accuracy rises fastest per step, once a head above layer 0 has reached
    ``PHASE_CHANGE_SCORE`` on the probe (before that, or for a cross-attention task: None).

    The accuracy marks it, not the induction score: the score on the probe lags the accuracy's
    jump (a run's score first passes 0.5 when the accuracy is already above 0.9), so the step
    where the score crosses a threshold marks the jump's end."""
    own = [s for s in snapshots if s.anti_diagonal_scores is None]
    if len(own) < 2 or best_scores(own[-1].scores)[1] < PHASE_CHANGE_SCORE:
        return None
    slopes = [
        (b.accuracy - a.accuracy) / max(b.step - a.step, 1) for a, b in itertools.pairwise(own)
    ]
    i = int(np.argmax(slopes))
    return PhaseChange(
        own[i].step,
        own[i + 1].step,
        own[i].accuracy,
        own[i + 1].accuracy,
        best_scores(own[-1].scores)[1],
    )


def phase_change_step(snapshots: Sequence[TrainSnapshot]) -> int | None:
    """The step where the phase change starts (``phase_change``), or None."""
    change = phase_change(snapshots)
    return None if change is None else change.step

"""Measuring a model while it trains and after: a forward pass with (optionally) every head's
attention, through our blocks or the model's own; the snapshot a run takes every interval (the
loss and accuracy on a fixed evaluation batch, the attention and head scores on the task's
probe); and ``evaluate``, a model's accuracy and head scores on held-out sequences."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from mhsa.engine.runs.swap import OurBlock, OurPass
from mhsa.errors import InputError
from mhsa.training.circuit_probe import induction_edge_probe, k_edge_scores
from mhsa.training.results import Evaluation, TrainSnapshot
from mhsa.training.scores import HeadScores, anti_diagonal_scores, head_scores
from mhsa.training.tasks import (
    SYMBOLS,
    VOCAB,
    TaskBatch,
    TaskSpec,
    make_tokenizer,
    probe_batch,
    sample,
    task_spec,
)

if TYPE_CHECKING:
    from mhsa.training.config import TrainConfig

__all__ = [
    "AttentionWeights",
    "Probe",
    "batch_scores",
    "correct",
    "evaluate",
    "forward",
    "model_inputs",
    "scored_loss",
]


def model_inputs(
    batch: TaskBatch, device: torch.device
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The model's inputs for ``batch`` (encoder-decoder: with the encoder's attention mask and
    the decoder's input), and the targets."""
    inputs = {"input_ids": torch.from_numpy(batch.ids).to(device)}
    if batch.decoder_ids is not None:
        inputs["attention_mask"] = torch.from_numpy(batch.attention_mask).to(device)
        inputs["decoder_input_ids"] = torch.from_numpy(batch.decoder_ids).to(device)
    return inputs, torch.from_numpy(batch.targets).to(device)


def scored_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the scored positions."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # ignore_index=IGNORE


def correct(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """``(right next-token predictions, scored positions)``."""
    scored = targets != -100
    hits = (logits.argmax(-1) == targets) & scored
    return int(hits.sum()), int(scored.sum())


@dataclass(frozen=True)
class AttentionWeights:
    """Attention of one forward pass as numpy: ``attention`` ``[B, layers, heads, T, T]`` (an
    encoder-decoder: the decoder's self attention), ``cross`` ``[B, layers, heads, T_dec,
    T_enc]`` (an encoder-decoder, else None)."""

    attention: np.ndarray
    cross: np.ndarray | None = None


def _stacked(attention: Any) -> np.ndarray:
    return torch.stack(list(attention), 1).float().cpu().numpy()  # (B, L, H, T, S)


def forward(
    model: Any,
    inputs: dict[str, torch.Tensor],
    ours: tuple[list[OurBlock], OurPass] | None,
    *,
    weights: bool,
) -> tuple[torch.Tensor, AttentionWeights | None]:
    """Logits ``[B, T, V]`` and (``weights``) the attention: through our blocks when ``ours``
    holds them and their pass, else through the model's own eager attention."""
    seq2seq = "decoder_input_ids" in inputs
    if ours is None:
        out = model(**inputs, output_attentions=weights)
        if not weights:
            return out.logits, None
        if seq2seq:
            return out.logits, AttentionWeights(
                _stacked(out.decoder_attentions), _stacked(out.cross_attentions)
            )
        return out.logits, AttentionWeights(_stacked(out.attentions))
    blocks, run = ours
    run.need_weights = weights
    out = model(**inputs)
    run.need_weights = False
    if not weights:
        return out.logits, None
    if seq2seq:  # our blocks: the encoder's, the decoder's self-attention, the cross-attention

        def of(kind: str) -> np.ndarray:
            return _stacked(run.weights[b.layer] for b in blocks if b.kind == kind)

        return out.logits, AttentionWeights(of("decoder"), of("cross"))
    return out.logits, AttentionWeights(_stacked(run.weights[i] for i in sorted(run.weights)))


def batch_scores(weights: AttentionWeights, batch: TaskBatch) -> HeadScores:
    """The head scores of a batch: previous-token and induction on the (decoder's) self
    attention, and with cross attention the anti-diagonal score."""
    ids = batch.ids if batch.decoder_ids is None else batch.decoder_ids
    scores = head_scores(weights.attention, ids)
    if weights.cross is None:
        return scores
    return HeadScores(
        scores.previous_token, scores.induction, anti_diagonal_scores(weights.cross, batch.lengths)
    )


@torch.no_grad()
def evaluate(model: Any, task: str, *, sequences: int = 512, seed: int = 0) -> Evaluation:
    """Accuracy and head scores of a model on held-out sequences of ``task``, drawn from
    ``seed`` (lengths uniform over the task's range), through the model's own attention.

    Args:
        model: a transformers model with its LM head and the toy vocabulary (``toy:<task>``, a
            result's): a causal LM, or for an encoder-decoder task a
            ``BartForConditionalGeneration``.
        task: a name in ``TASKS``.
        sequences: how many sequences (in batches of 128).
        seed: the sequences' seed.
    """
    spec = task_spec(task)
    device = next(model.parameters()).device
    rng = np.random.default_rng([seed, 2])
    hits = total = 0
    pooled: list[tuple[HeadScores, int]] = []
    for start in range(0, sequences, 128):
        batch = sample(spec, rng, min(128, sequences - start))
        inputs, targets = model_inputs(batch, device)
        logits, weights = forward(model, inputs, None, weights=True)
        assert weights is not None
        h, n = correct(logits, targets)
        hits, total = hits + h, total + n
        pooled.append((batch_scores(weights, batch), _repeats(batch)))
    weight = sum(n for _, n in pooled)
    first = pooled[0][0]
    scores = HeadScores(
        sum(s.previous_token * n for s, n in pooled) / weight,
        sum(s.induction * n for s, n in pooled) / weight,
        None
        if first.anti_diagonal is None
        else sum(s.anti_diagonal * n for s, n in pooled) / weight,
    )
    return Evaluation(hits / max(total, 1), scores, sequences)


def _repeats(batch: TaskBatch) -> int:
    """Positions repeating an earlier symbol: every output symbol (the input's are distinct);
    an encoder-decoder task: its scored decoder positions, as many."""
    return int(batch.lengths.sum())


class Probe:
    """The task's probe, and the fixed evaluation batch, measured at each snapshot."""

    def __init__(self, spec: TaskSpec, config: TrainConfig, device: torch.device) -> None:
        self.batch = probe_batch(spec)
        to_tokens = make_tokenizer().convert_ids_to_tokens
        decoder = self.batch.decoder_ids
        self.tokens = to_tokens((self.batch.ids if decoder is None else decoder)[0].tolist())
        self.source_tokens = None if decoder is None else to_tokens(self.batch.ids[0].tolist())
        self.eval_batch = sample(spec, np.random.default_rng([config.seed, 1]), 128)
        self.device = device
        # the induction task's fixed pair for its circuit's K-composition edges
        self.edge_probe = None
        if spec.name == "induction" and decoder is None:
            symbols = [VOCAB[s] for s in SYMBOLS]
            self.edge_probe = induction_edge_probe(self.batch.ids[0].tolist(), symbols)

    @torch.no_grad()
    def snapshot(
        self, model: Any, ours: tuple[list[OurBlock], OurPass], step: int, start: float
    ) -> TrainSnapshot:
        """The run's state after ``step`` steps (``start``: the run's ``perf_counter``)."""
        inputs, targets = model_inputs(self.eval_batch, self.device)
        logits, _ = forward(model, inputs, ours, weights=False)
        loss = float(scored_loss(logits, targets))
        hits, total = correct(logits, targets)
        probe_inputs, _ = model_inputs(self.batch, self.device)
        _, weights = forward(model, probe_inputs, ours, weights=True)
        assert weights is not None
        scores = batch_scores(weights, self.batch)
        shown = weights.attention if weights.cross is None else weights.cross
        return TrainSnapshot(
            step=step,
            loss=loss,
            accuracy=hits / max(total, 1),
            elapsed=time.perf_counter() - start,
            probe_tokens=self.tokens,
            probe_attention=shown[0].astype(np.float32),
            previous_token_scores=scores.previous_token,
            induction_scores=scores.induction,
            anti_diagonal_scores=scores.anti_diagonal,
            probe_source_tokens=self.source_tokens,
            k_edge_scores=self._k_edges(model, ours),
        )

    def _k_edges(self, model: Any, ours: tuple[list[OurBlock], OurPass]) -> np.ndarray | None:
        """The induction task's K-composition edge scores on its probe pair."""
        if self.edge_probe is None:
            return None
        try:
            return k_edge_scores(model, ours, self.edge_probe, self.device)
        except InputError:  # the pair gives the same metric (an untrained model may)
            return None

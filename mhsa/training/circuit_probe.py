"""The induction circuit forming during training: at each snapshot, every head's
K-composition edge into every later head's key (``mhsa.circuits``, edge attribution patching)
on a fixed probe pair, so a class can watch the previous-token head's edge into the induction
head appear.

The pair comes from the induction task's probe ``[BOS] x1 .. xL x1 .. xL``: the clean input is
all of it but the last symbol (the model should continue with ``xL``); the corrupted input has
the first occurrence of its last symbol ``x(L-1)`` replaced by a symbol absent from the probe,
so the token after that occurrence no longer follows it (an induction head's key there stops
matching). The metric is logit(xL) - logit(the replacement).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mhsa.engine.runs.swap import OurBlock, OurPass
from mhsa.heads import head_label, parse_head_label

__all__ = [
    "EdgeProbe",
    "induction_edge_probe",
    "k_composition_series",
    "k_edge_scores",
    "strongest_k_edges",
]


@dataclass(frozen=True)
class EdgeProbe:
    """A fixed clean/corrupted pair of token ids ``[1, T]`` and the metric's answer ids."""

    clean: torch.Tensor
    corrupted: torch.Tensor
    answer: int
    wrong: int


def induction_edge_probe(ids: Sequence[int], symbols: Sequence[int]) -> EdgeProbe | None:
    """The pair built from an induction probe ``ids`` (see the module's docstring), with the
    replacement the first of ``symbols`` absent from the probe; None when ``ids`` is no repeat
    (other tasks)."""
    ids = [int(i) for i in ids]
    half = (len(ids) - 1) // 2
    if half < 3 or ids[1 : 1 + half] != ids[1 + half : 1 + 2 * half]:
        return None
    clean = ids[:-1]
    first = clean.index(clean[-1])  # the first occurrence of the last symbol
    spare = next((s for s in symbols if s not in ids), None)
    if spare is None or first == len(clean) - 1:
        return None
    corrupted = [*clean[:first], spare, *clean[first + 1 :]]
    return EdgeProbe(torch.tensor([clean]), torch.tensor([corrupted]), ids[-1], spare)


def k_edge_scores(
    model: Any, ours: tuple[list[OurBlock], OurPass], probe: EdgeProbe, device: torch.device
) -> np.ndarray:
    """``[layers, heads, layers, heads]``: the EAP score of each head's edge into each later
    head's key input (NaN where there is none), on the model while a training run holds it
    (its blocks ``ours`` already standing in)."""
    from mhsa.circuits import edge_attribution_ids
    from mhsa.engine.models.loading import LoadedModel

    lm = LoadedModel(
        name="training",
        display_name="training",
        model=model.base_model,
        tokenizer=None,
        device=device,
        num_parameters=0,
        load_seconds=0.0,
        head_model=model,
        lm_head="causal",
    )
    blocks, running = ours
    layers, heads = len(blocks), blocks[0].ours.num_heads
    out = np.full((layers, heads, layers, heads), np.nan)
    clean, corrupted = probe.clean.to(device), probe.corrupted.to(device)
    frame = edge_attribution_ids(
        lm, clean, corrupted, probe.answer, probe.wrong, blocks=blocks, running=running
    )
    keys = frame[(frame["input"] == "k") & frame["source"].str.startswith("L")]
    for source, target, score in zip(keys["source"], keys["target"], keys["score"], strict=True):
        out[(*parse_head_label(source), *parse_head_label(target))] = score
    return out


def k_composition_series(
    snapshots: Sequence[Any],
) -> tuple[str, str, list[int], list[float]] | None:
    """The K-composition edge of the last snapshot's previous-token head (the best in layer 0)
    into its induction head (the best above layer 0), and that edge's score at every snapshot
    (``step``, ``k_edge_scores``, ``previous_token_scores``, ``induction_scores``); None
    without edge scores."""
    with_scores = [s for s in snapshots if getattr(s, "k_edge_scores", None) is not None]
    if not with_scores:
        return None
    last = with_scores[-1]
    previous = int(np.argmax(last.previous_token_scores[0]))
    upper = last.induction_scores[1:]
    layer, head = np.unravel_index(int(np.argmax(upper)), upper.shape)
    sender, receiver = (0, previous), (int(layer) + 1, int(head))
    steps = [int(s.step) for s in with_scores]
    values = [float(s.k_edge_scores[(*sender, *receiver)]) for s in with_scores]
    return head_label(*sender), head_label(*receiver), steps, values


def strongest_k_edges(
    snapshots: Sequence[Any],
) -> tuple[list[int], list[str], list[float]] | None:
    """At each snapshot with edge scores, the K-composition edge that carries the right answer
    most: the largest **support** ``-score`` (an EAP score below 0 is an edge whose corruption
    lowers the logit difference), as ``(steps, edges "L0H3 → L1H3", supports)``; None without
    edge scores. Unlike ``k_composition_series`` (the last snapshot's heads, which change while
    a run goes on), each point says which edge it is, so a live curve never relabels itself."""
    with_scores = [s for s in snapshots if getattr(s, "k_edge_scores", None) is not None]
    if not with_scores:
        return None
    steps, edges, supports = [], [], []
    for snapshot in with_scores:
        support = -np.asarray(snapshot.k_edge_scores, dtype=np.float64)
        if np.isnan(support).all():
            continue
        index = np.unravel_index(int(np.nanargmax(support)), support.shape)
        steps.append(int(snapshot.step))
        edges.append(f"{head_label(*index[:2])} → {head_label(*index[2:])}")
        supports.append(float(support[index]))
    return (steps, edges, supports) if steps else None

"""The runs behind activation and attribution patching (``mhsa.causal.patching``): the clean and the
corrupted text encoded with the metric (``PatchSetup``), observers that replace one head's
activation at an observation point of the attention core, and batched patched runs.

Exact patching is batched as leave-one-out is (``mhsa.causal.importance``): the corrupted run
records
every layer's output; a pass over a batch of cells ``(layer, head, position)`` replays the layers
below their lowest layer from it and fans the hidden states entering that layer out into one row
per cell, each row patching its own head at its own layer. Small models run the clean, the
corrupted and every patched row in one forward pass (``patched_in_one_pass``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from mhsa.causal.metrics import PatchMetric, embedding_of, patch_metric
from mhsa.engine.attention.core import Observer
from mhsa.engine.encoding import Encoded, check_text, encode, encode_clean_corrupted
from mhsa.engine.models.loading import LoadedModel, resolve_model
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks, run_with_our_blocks
from mhsa.errors import InputError
from mhsa.heads import head_label

__all__ = [
    "Cell",
    "PatchPoint",
    "PatchSetup",
    "activation_gradients",
    "check_batch_size",
    "check_difference",
    "clean_and_corrupted",
    "effect_of",
    "head_frame",
    "patched_in_one_pass",
    "patched_runs",
    "setup_patch",
    "table_attrs",
]


@dataclass(frozen=True)
class PatchPoint:
    """One activation that can be patched per head.

    Attributes:
        name: what ``what=`` takes (TransformerLens's hook name without ``hook_``).
        label: its name for people.
        point: the observation point of the attention core
        (``mhsa.engine.attention.core.OBSERVATION_POINTS``).
        all_pos: the TransformerLens function patching it per head at every position.
        by_pos: the TransformerLens function patching it per head and position (or what is done
            instead).
        kv: patched per key/value head (grouped-query models have fewer of those).
    """

    name: str
    label: str
    point: str
    all_pos: str
    by_pos: str
    kv: bool = False


Progress = Callable[[int, int], None]

#: one patch: ``(layer, head, position)``, position None for every position
Cell = tuple[int, int, int | None]


@dataclass(frozen=True)
class PatchSetup:
    """Both inputs encoded, the metric, our modules, and the clean and corrupted runs."""

    lm: LoadedModel
    point: PatchPoint
    clean: Encoded
    corrupted: Encoded
    metric: PatchMetric
    blocks: list[OurBlock]

    @property
    def layers(self) -> int:
        return len(self.blocks)

    def _outputs(self, our_pass: OurPass, inputs: Mapping[str, torch.Tensor]) -> Any:
        """The model's outputs doing ``our_pass`` (a logit metric: the last position's
        logits only, all it reads)."""
        head = self.metric.with_head
        return run_with_our_blocks(
            self.lm, self.blocks, our_pass, inputs, with_head=head, last_logits=True
        )

    def run(
        self,
        inputs: Mapping[str, torch.Tensor],
        observers: Mapping[int, Any] | None = None,
        *,
        rows: int = 1,
        layer: int = 0,
        replay: Mapping[int, Any] | None = None,
        record: dict[int, Any] | None = None,
    ) -> torch.Tensor:
        """``[rows]``: the metric of one run (rows fanned out at ``layer``, the layers below it
        replayed). Caller holds the lock."""
        our_pass = OurPass(
            need_weights=False,
            observers=observers or {},
            fan_out=(layer, rows) if rows > 1 else None,
            replay={k: v for k, v in (replay or {}).items() if k < layer},
            record=record,
        )
        return self.metric(self._outputs(our_pass, inputs), inputs)

    def activations(
        self, inputs: Mapping[str, torch.Tensor], record: dict[int, Any] | None = None
    ) -> tuple[list[torch.Tensor], Any]:
        """Every layer's activation at the patch point in the batch's first row (``[1, heads,
        ...]``, detached) and the run's outputs (``record``: every layer's output)."""
        acts: list[torch.Tensor] = [torch.empty(0)] * self.layers

        def keeper(layer: int) -> Callable[[str, torch.Tensor], None]:
            def observe(name: str, tensor: torch.Tensor) -> None:
                if name == self.point.point:
                    acts[layer] = tensor[:1].detach().clone()

            return observe

        our_pass = OurPass(
            need_weights=False,
            observers={i: keeper(i) for i in range(self.layers)},
            record=record,
        )
        return acts, self._outputs(our_pass, inputs)


def _row(value: Any, row: int) -> Any:
    """One row of a layer's output recorded for a batch of two (tensors and tuples of them)."""
    if isinstance(value, torch.Tensor):
        return value[row : row + 1] if value.dim() and value.shape[0] == 2 else value
    if isinstance(value, tuple | list):
        return type(value)(_row(v, row) for v in value)
    return value


def setup_patch(
    clean: str,
    corrupted: str,
    model: str | LoadedModel,
    point: PatchPoint,
    answer: object,
    wrong: object,
    target: str | None,
    text_pair: str | None,
    max_tokens: int | None,
) -> PatchSetup:
    """The arguments checked and encoded; the caller holds ``lm.lock``.

    Raises:
        InputError: see ``patch_heads``.
    """
    lm = resolve_model(model)
    metric = patch_metric(lm, answer, wrong, target, text_pair)
    clean_enc, corrupted_enc = encode_clean_corrupted(
        lm, clean, corrupted, max_tokens, "patching replaces activations"
    )
    blocks = our_blocks(lm, None)
    if not metric.with_head:
        pair = None if text_pair is None else check_text(text_pair, "second sentence")
        reference = clean_enc if pair is None else encode(lm, pair, None, max_tokens)
        metric = metric.with_reference(embedding_of(lm, blocks, reference.inputs))
    return PatchSetup(lm, point, clean_enc, corrupted_enc, metric, blocks)


def table_attrs(setup: PatchSetup, m_clean: float, m_corrupted: float) -> dict[str, Any]:
    """What every table of this module carries in ``.attrs``."""
    return {
        "what": setup.point.name,
        "metric": setup.metric.description,
        "clean": m_clean,
        "corrupted": m_corrupted,
        "clean_tokens": list(setup.clean.tokens.strings),
        "corrupted_tokens": list(setup.corrupted.tokens.strings),
        "model": setup.lm.display_name,
        "kv_heads": setup.point.kv and setup.blocks[0].ours.groups > 1,
    }


def effect_of(patched: np.ndarray, m_clean: float, m_corrupted: float) -> np.ndarray:
    """``(patched - m_corrupted) / (m_clean - m_corrupted)``."""
    return (patched - m_corrupted) / (m_clean - m_corrupted)


def check_difference(m_clean: float, m_corrupted: float, metric: str) -> None:
    if abs(m_clean - m_corrupted) <= 1e-6 * max(1.0, abs(m_clean)):
        raise InputError(
            f"The clean and the corrupted text give the same metric ({metric}: {m_clean:.6g}), "
            "so there is no difference for a patch to restore: change the corrupted text where "
            "it matters for the metric."
        )


def _patcher(point: str, clean: torch.Tensor | None, cells: Sequence[tuple[int, Cell]]) -> Observer:
    """An observer for one layer that gives each row ``r`` of ``cells`` (``(r, cell)``) that
    cell's head's clean activation (at its position only, when it has one): from ``clean``
    (recorded earlier), or with None from the pass's own first row (the clean text run in the
    same batch); the other rows pass unchanged."""
    rows = torch.as_tensor([r for r, _ in cells])
    heads = torch.as_tensor([c[1] for _, c in cells])
    whole = cells[0][1][2] is None
    where = None if whole else torch.as_tensor([c[2] for _, c in cells])

    def observe(name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        if name != point:
            return None
        source = tensor[:1] if clean is None else clean
        out = tensor.clone()
        if where is None:
            out[rows, heads] = source[0, heads].to(out.dtype)
        else:
            out[rows, heads, where] = source[0, heads, where].to(out.dtype)
        return out

    return observe


def patched_runs(
    setup: PatchSetup,
    clean: Sequence[torch.Tensor],
    cells: Sequence[Cell],
    records: dict[int, Any],
    batch_size: int,
    tick: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """The metric with each cell patched, one row per cell, ``batch_size`` rows per forward
    pass. A pass fans out at the lowest layer of its cells (the layers below are replayed from
    the corrupted run) and patches each row at its own layer: cells of several layers share a
    pass, which saves passes where a pass's fixed cost outweighs a few rows (small models)."""
    out = []
    inputs = setup.corrupted.inputs
    chunks = [cells[i : i + batch_size] for i in range(0, len(cells), batch_size)]
    for done, chunk in enumerate(chunks, start=1):
        by_layer: dict[int, list[tuple[int, Cell]]] = {}
        for r, cell in enumerate(chunk):
            by_layer.setdefault(cell[0], []).append((r, cell))
        observers = {
            layer: _patcher(setup.point.point, clean[layer], rows)
            for layer, rows in by_layer.items()
        }
        low = min(by_layer)
        values = setup.run(inputs, observers, rows=len(chunk), layer=low, replay=records)
        out.append(values.double().cpu().numpy())
        if tick is not None:
            tick(done, len(chunks))
    return np.concatenate(out)


def patched_in_one_pass(
    setup: PatchSetup, cells: Sequence[Cell]
) -> tuple[float, float, np.ndarray]:
    """``m_clean``, ``m_corrupted`` and the metric with each cell patched, all in one forward
    pass when they fit one batch (small models, where a pass's fixed cost dominates): row 0 is
    the clean text, row 1 the corrupted one, and one corrupted row per cell takes its head's
    activation from row 0 at the same layer as the pass reaches it."""
    clean, corrupted = setup.clean.inputs, setup.corrupted.inputs
    n = len(cells)
    inputs = {
        k: torch.cat([clean[k], corrupted[k].expand(n + 1, -1)])
        for k in clean.keys() & corrupted.keys()
    }
    by_layer: dict[int, list[tuple[int, Cell]]] = {}
    for r, cell in enumerate(cells, start=2):
        by_layer.setdefault(cell[0], []).append((r, cell))
    observers = {layer: _patcher(setup.point.point, None, rows) for layer, rows in by_layer.items()}
    values = setup.run(inputs, observers).double().cpu().numpy()
    m_clean, m_corrupted = float(values[0]), float(values[1])
    check_difference(m_clean, m_corrupted, setup.metric.description)
    return m_clean, m_corrupted, values[2:]


def check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError("batch_size must be a whole number of at least 1.")


def head_frame(values: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """``[L, H]`` arrays as one row per head, index ``L{l}H{h}`` (built in one step: for a small
    model, building the table costs as much as a forward pass)."""
    layers, heads = next(iter(values.values())).shape
    columns = {
        "layer": np.repeat(np.arange(layers), heads),
        "head": np.tile(np.arange(heads), layers),
        **{k: v.reshape(-1) for k, v in values.items()},
    }
    labels = [head_label(li, h) for li in range(layers) for h in range(heads)]
    return pd.DataFrame(columns, index=pd.Index(labels, dtype=object))


def clean_and_corrupted(
    setup: PatchSetup,
) -> tuple[list[torch.Tensor], float, dict[int, Any], float]:
    """The clean run's activations and metric; the corrupted run's layer outputs (to replay)
    and metric. One pass: the two texts side by side as a batch of two (same length)."""
    clean, corrupted = setup.clean.inputs, setup.corrupted.inputs
    both = {k: torch.cat([clean[k], corrupted[k]]) for k in clean.keys() & corrupted.keys()}
    record: dict[int, Any] = {}
    clean_acts, outputs = setup.activations(both, record)
    m_clean, m_corrupted = (float(v) for v in setup.metric(outputs, both))
    check_difference(m_clean, m_corrupted, setup.metric.description)
    records = {layer: _row(output, 1) for layer, output in record.items()}
    return clean_acts, m_clean, records, m_corrupted


def activation_gradients(setup: PatchSetup) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """The metric's gradient with respect to every layer's activation at the patch point, on
    the corrupted run; those activations; and the metric. One forward, one backward."""
    deltas: list[torch.Tensor] = [torch.empty(0)] * setup.layers
    acts: list[torch.Tensor] = [torch.empty(0)] * setup.layers

    def shifter(layer: int) -> Callable[[str, torch.Tensor], torch.Tensor | None]:
        def observe(name: str, tensor: torch.Tensor) -> torch.Tensor | None:
            if name != setup.point.point:
                return None
            acts[layer] = tensor.detach().clone()
            # a zero added here: its gradient is the metric's gradient w.r.t. the activation
            deltas[layer] = torch.zeros_like(tensor, requires_grad=True)
            return tensor + deltas[layer]

        return observe

    observers = {i: shifter(i) for i in range(setup.layers)}
    value = setup.run(setup.corrupted.inputs, observers)[0]
    grads = torch.autograd.grad(value, deltas)
    return [g.detach() for g in grads], acts, float(value.detach())

"""Activation patching and attribution patching per head: which heads carry the difference
between a clean and a corrupted input.

Activation patching (Meng et al. 2022, "ROME"; Wang et al. 2022, "IOI"), with TransformerLens's
conventions (``transformer_lens.patching``): run the *corrupted* input, replace one head's
activation with the one the *clean* input gave at the same layer (and position), recompute the
layers above, and measure a metric. ``effect = (m_patched - m_corrupted) / (m_clean -
m_corrupted)``: 1 when that head alone restores the clean behaviour, 0 when it changes nothing.

Attribution patching (Nanda 2023, "Attribution Patching: Activation Patching At Industrial
Scale") is its first-order estimate: ``m_patched - m_corrupted ~ sum over positions of
grad(m at the corrupted run) . (clean - corrupted)``, for every head from one forward and one
backward pass on the corrupted input and one forward pass on the clean one.

Everything runs through our module (``mhsa.swap``) with the model's own weights: an activation is
replaced by an observer at the named observation point of the attention core (``mhsa.core``).
Exact patching is batched as leave-one-out is (``mhsa.importance``): the corrupted run records
every layer's output; a pass over a batch of heads replays the layers below their lowest layer
from it and fans the hidden states entering that layer out into one row per head, each row
patching its own head at its own layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from mhsa.core import Observer
from mhsa.encoding import Encoded, check_text, encode
from mhsa.errors import InputError
from mhsa.heads import head_label
from mhsa.metrics import PATCH_TARGETS, PatchMetric, patch_metric, sentence_embedding
from mhsa.models import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.registry import lookup
from mhsa.swap import OurBlock, OurPass, our_blocks, run_with_our_blocks

__all__ = [
    "PATCH_POINTS",
    "PATCH_TARGETS",
    "PatchPoint",
    "attribution_effect",
    "attribution_patching",
    "patch_heads",
    "patch_positions",
    "patching_correlation",
]

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class PatchPoint:
    """One activation that can be patched per head.

    Attributes:
        name: what ``what=`` takes (TransformerLens's hook name without ``hook_``).
        label: its name for people.
        point: the observation point of the attention core (``mhsa.core.OBSERVATION_POINTS``).
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


#: The activations ``patch_heads`` patches, by name, in the order pickers list them.
PATCH_POINTS: Mapping[str, PatchPoint] = {
    p.name: p
    for p in (
        PatchPoint(
            "z",
            "head output (context, before W_O)",
            "per-head context",
            "get_act_patch_attn_head_out_all_pos",
            "get_act_patch_attn_head_out_by_pos",
        ),
        PatchPoint(
            "q",
            "queries",
            "per-head Q",
            "get_act_patch_attn_head_q_all_pos",
            "get_act_patch_attn_head_q_by_pos",
        ),
        PatchPoint(
            "k",
            "keys",
            "per-head K",
            "get_act_patch_attn_head_k_all_pos",
            "get_act_patch_attn_head_k_by_pos",
            kv=True,
        ),
        PatchPoint(
            "v",
            "values",
            "per-head V",
            "get_act_patch_attn_head_v_all_pos",
            "get_act_patch_attn_head_v_by_pos",
            kv=True,
        ),
        PatchPoint(
            "pattern",
            "attention pattern",
            "probabilities",
            "get_act_patch_attn_head_pattern_all_pos",
            "none in TransformerLens: here a position is the pattern's query (destination) row",
        ),
    )
}

# --- runs through our module ------------------------------------------------------------------


@dataclass(frozen=True)
class _Setup:
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
        outputs = run_with_our_blocks(
            self.lm, self.blocks, our_pass, inputs, with_head=self.metric.with_head
        )
        return self.metric(outputs, inputs)

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
        outputs = run_with_our_blocks(
            self.lm, self.blocks, our_pass, inputs, with_head=self.metric.with_head
        )
        return acts, outputs


def _row(value: Any, row: int) -> Any:
    """One row of a layer's output recorded for a batch of two (tensors and tuples of them)."""
    if isinstance(value, torch.Tensor):
        return value[row : row + 1] if value.dim() and value.shape[0] == 2 else value
    if isinstance(value, tuple | list):
        return type(value)(_row(v, row) for v in value)
    return value


def _setup(
    clean: str,
    corrupted: str,
    model: str | LoadedModel,
    what: str,
    answer: object,
    wrong: object,
    target: str | None,
    text_pair: str | None,
    max_tokens: int | None,
) -> _Setup:
    """The arguments checked and encoded; the caller holds ``lm.lock``.

    Raises:
        InputError: see ``patch_heads``.
    """
    lm = resolve_model(model)
    point = lookup(PATCH_POINTS, what, "activation")
    metric = patch_metric(lm, answer, wrong, target, text_pair)
    clean_enc = encode(lm, check_text(clean, "clean text"), None, max_tokens)
    corrupted_enc = encode(lm, check_text(corrupted, "corrupted text"), None, max_tokens)
    n_clean, n_corrupted = (e.inputs["input_ids"].shape[1] for e in (clean_enc, corrupted_enc))
    if n_clean != n_corrupted:
        raise InputError(
            f"The clean text has {n_clean} tokens and the corrupted text {n_corrupted}: patching "
            "replaces activations position by position, so both need the same number of tokens "
            f"(clean: {list(clean_enc.tokens.strings)!r}; corrupted: "
            f"{list(corrupted_enc.tokens.strings)!r})."
        )
    blocks = our_blocks(lm, None)
    if not metric.with_head:
        pair = None if text_pair is None else check_text(text_pair, "second sentence")
        reference = clean_enc if pair is None else encode(lm, pair, None, max_tokens)
        with torch.inference_mode():
            outputs = run_with_our_blocks(lm, blocks, OurPass(need_weights=False), reference.inputs)
            metric = metric.with_reference(sentence_embedding(outputs, reference.inputs)[0])
    return _Setup(lm, point, clean_enc, corrupted_enc, metric, blocks)


def _attrs(setup: _Setup, m_clean: float, m_corrupted: float) -> dict[str, Any]:
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


def _effect(patched: np.ndarray, m_clean: float, m_corrupted: float) -> np.ndarray:
    """``(patched - m_corrupted) / (m_clean - m_corrupted)``."""
    return (patched - m_corrupted) / (m_clean - m_corrupted)


def _check_difference(m_clean: float, m_corrupted: float, metric: str) -> None:
    if abs(m_clean - m_corrupted) <= 1e-6 * max(1.0, abs(m_clean)):
        raise InputError(
            f"The clean and the corrupted text give the same metric ({metric}: {m_clean:.6g}), "
            "so there is no difference for a patch to restore: change the corrupted text where "
            "it matters for the metric."
        )


#: one patch: ``(layer, head, position)``, position None for every position
Cell = tuple[int, int, int | None]


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


def _patched(
    setup: _Setup,
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


def _patched_in_one_pass(setup: _Setup, cells: Sequence[Cell]) -> tuple[float, float, np.ndarray]:
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
    _check_difference(m_clean, m_corrupted, setup.metric.description)
    return m_clean, m_corrupted, values[2:]


def _check_batch(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError("batch_size must be a whole number of at least 1.")


def _head_frame(values: Mapping[str, np.ndarray]) -> pd.DataFrame:
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


def _clean_and_corrupted(setup: _Setup) -> tuple[list[torch.Tensor], float, dict[int, Any], float]:
    """The clean run's activations and metric; the corrupted run's layer outputs (to replay)
    and metric. One pass: the two texts side by side as a batch of two (same length)."""
    clean, corrupted = setup.clean.inputs, setup.corrupted.inputs
    both = {k: torch.cat([clean[k], corrupted[k]]) for k in clean.keys() & corrupted.keys()}
    record: dict[int, Any] = {}
    clean_acts, outputs = setup.activations(both, record)
    m_clean, m_corrupted = (float(v) for v in setup.metric(outputs, both))
    _check_difference(m_clean, m_corrupted, setup.metric.description)
    records = {layer: _row(output, 1) for layer, output in record.items()}
    return clean_acts, m_clean, records, m_corrupted


def patch_heads(
    clean: str,
    corrupted: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    target: str | None = None,
    text_pair: str | None = None,
    what: str = "z",
    max_tokens: int | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Activation patching per head, at every position: clean into corrupted.

    One head at a time, its activation (``what``) at every position is taken from the clean run
    into the corrupted run, at the same layer; the layers above are recomputed. As
    TransformerLens's ``patching.get_act_patch_attn_head_out_all_pos`` (``what="z"``: the
    head's context, ``hook_z``, before W_O) and ``get_act_patch_attn_head_{q,k,v,pattern}_all_pos``
    (``hook_q``/``hook_k`` before rotary positions, ``hook_v``, ``hook_pattern``): corrupted
    run, clean activation. With grouped-query attention, keys and values are patched per
    key/value head (each serves several query heads): the table then has that many heads per
    layer and ``attrs["kv_heads"]`` is True.

    The metric m: for causal language models ``logit(answer) - logit(wrong)`` at the last input
    position (the logit difference of the IOI work). For models without a next-token head
    (encoders), ``target="embedding"`` (default): the cosine similarity of the run's sentence
    embedding (mean-pooled last hidden state, as the head-importance targets) to the clean
    run's: 1 for the clean run, lower for the corrupted one, so a patch that restores the clean
    representation moves it back towards 1; the embedding-change target of head importance
    (1 - cos with the intact run) measured against the clean run instead. ``target=
    "similarity"``: the cosine similarity to ``text_pair``'s embedding (the similarity target).

    Args:
        clean: the text whose activations are patched in.
        corrupted: the text run; it must have as many tokens as ``clean``.
        model: ``"default"``, ``"toy:induction"``, a model id or folder, or a ``LoadedModel``.
        answer, wrong: causal LMs: words that are each exactly one token after a space.
        target: encoders: ``"embedding"`` or ``"similarity"`` (``PATCH_TARGETS``).
        text_pair: the second sentence of ``target="similarity"``.
        what: ``"z"``, ``"q"``, ``"k"``, ``"v"`` or ``"pattern"`` (``PATCH_POINTS``).
        max_tokens: truncate both texts to this many tokens.
        batch_size: heads patched side by side in one forward pass.
        progress: ``progress(done, total)`` after each forward pass; raising from it stops.

    Returns:
        One row per head, index ``L{layer}H{head}``: ``layer``, ``head``, ``patched`` (m of the
        patched run) and ``effect`` = (m_patched - m_corrupted) / (m_clean - m_corrupted).
        ``attrs``: ``what``, ``metric`` (its description), ``clean`` and ``corrupted`` (m of the
        two runs), ``clean_tokens``, ``corrupted_tokens``, ``model``, ``kv_heads``.

    Raises:
        InputError: texts of different token counts (both named), an answer or wrong answer that
            is not one token (its tokens named), answer == wrong, answer/wrong for a model
            without a next-token head, an unknown activation or target, or texts that give the
            same metric.
    """
    _check_batch(batch_size)
    lm = resolve_model(model)
    with lm.lock:
        setup = _setup(clean, corrupted, lm, what, answer, wrong, target, text_pair, max_tokens)
        ours = setup.blocks[0].ours
        heads = ours.num_kv_heads if setup.point.kv else ours.num_heads
        cells = [(layer, h, None) for layer in range(setup.layers) for h in range(heads)]
        with torch.inference_mode():
            if len(cells) <= batch_size:
                m_clean, m_corrupted, values = _patched_in_one_pass(setup, cells)
                if progress is not None:
                    progress(1, 1)
            else:
                clean_acts, m_clean, records, m_corrupted = _clean_and_corrupted(setup)
                values = _patched(setup, clean_acts, cells, records, batch_size, progress)
    patched = values.reshape(setup.layers, heads)
    frame = _head_frame({"patched": patched, "effect": _effect(patched, m_clean, m_corrupted)})
    frame.attrs.update(_attrs(setup, m_clean, m_corrupted))
    return frame


def patch_positions(
    clean: str,
    corrupted: str,
    layer: int,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    target: str | None = None,
    text_pair: str | None = None,
    what: str = "z",
    max_tokens: int | None = None,
    batch_size: int = 32,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Activation patching per head and position, for one layer: clean into corrupted.

    As TransformerLens's ``patching.get_act_patch_attn_head_out_by_pos`` (``what="z"``) and
    ``get_act_patch_attn_head_{q,k,v}_by_pos``, for the heads of ``layer``: one head's
    activation at one position taken from the clean run. For ``what="pattern"`` a position is
    the pattern's query (destination) row (TransformerLens has no by-position pattern patch).
    The metric and arguments are ``patch_heads``'s.

    Returns:
        One row per (head, position), tidy: ``layer``, ``head``, ``position``, ``token`` (the
        clean token there), ``corrupted_token``, ``patched``, ``effect``; ``attrs`` as
        ``patch_heads``.

    Raises:
        InputError: as ``patch_heads``, and a layer the model does not have.
    """
    _check_batch(batch_size)
    lm = resolve_model(model)
    with lm.lock:
        setup = _setup(clean, corrupted, lm, what, answer, wrong, target, text_pair, max_tokens)
        if not isinstance(layer, int | np.integer) or not 0 <= layer < setup.layers:
            raise InputError(
                f"There is no layer {layer!r}: the model has layers 0 to {setup.layers - 1}."
            )
        layer = int(layer)
        with torch.inference_mode():
            clean_acts, m_clean, records, m_corrupted = _clean_and_corrupted(setup)
            heads, positions = clean_acts[layer].shape[1:3]
            cells = [(layer, h, p) for h in range(heads) for p in range(positions)]
            patched = _patched(setup, clean_acts, cells, records, batch_size, progress)
    clean_tokens = list(setup.clean.tokens.strings)
    corrupted_tokens = list(setup.corrupted.tokens.strings)
    frame = pd.DataFrame(
        {
            "layer": layer,
            "head": [c[1] for c in cells],
            "position": [c[2] for c in cells],
            "token": [clean_tokens[c[2]] for c in cells],  # type: ignore[index]
            "corrupted_token": [corrupted_tokens[c[2]] for c in cells],  # type: ignore[index]
            "patched": patched,
            "effect": _effect(patched, m_clean, m_corrupted),
        }
    )
    frame.attrs.update(_attrs(setup, m_clean, m_corrupted))
    return frame


def attribution_patching(
    clean: str,
    corrupted: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    target: str | None = None,
    text_pair: str | None = None,
    what: str = "z",
    max_tokens: int | None = None,
) -> pd.DataFrame:
    """Attribution patching (Nanda 2023): the first-order estimate of ``patch_heads``.

    For each head, ``sum over positions (and d_head) of grad_m(corrupted activation) *
    (clean activation - corrupted activation)``: the linear approximation of m_patched -
    m_corrupted around the corrupted run, as in Neel Nanda's attribution-patching demo for
    TransformerLens (the gradient of the metric at the corrupted run's cache, times the clean
    minus the corrupted cache, summed per head). Costs one clean forward pass and one forward
    and backward pass on the corrupted input, for every head of every layer. Arguments and
    metric as ``patch_heads``; for ``what="pattern"`` the sum runs over query and key positions.

    Returns:
        One row per head, index ``L{layer}H{head}``: ``layer``, ``head``, ``attribution`` (the
        estimate of m_patched - m_corrupted) and ``effect`` (it divided by m_clean -
        m_corrupted, comparable with ``patch_heads``'s ``effect``); ``attrs`` as there.

    Raises:
        InputError: as ``patch_heads``.
    """
    lm = resolve_model(model)
    with lm.lock:
        setup = _setup(clean, corrupted, lm, what, answer, wrong, target, text_pair, max_tokens)
        with torch.inference_mode():
            clean_acts, outputs = setup.activations(setup.clean.inputs)
            m_clean = float(setup.metric(outputs, setup.clean.inputs)[0])
        with torch.inference_mode(False), torch.enable_grad():
            grads, corrupted_acts, m = _gradients(setup)
    m_corrupted = float(m)
    _check_difference(m_clean, m_corrupted, setup.metric.description)
    attribution = np.stack(
        [
            (g * (c - k)).flatten(2).sum(-1)[0].double().cpu().numpy()  # (heads,)
            for g, c, k in zip(grads, clean_acts, corrupted_acts, strict=True)
        ]
    )
    frame = _head_frame(
        {"attribution": attribution, "effect": attribution / (m_clean - m_corrupted)}
    )
    frame.attrs.update(_attrs(setup, m_clean, m_corrupted))
    return frame


def _gradients(setup: _Setup) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
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


def attribution_effect(attribution: pd.DataFrame) -> pd.DataFrame:
    """Attribution patching's ``effect`` as the column ``effect_attribution``, to join beside
    exact patching's ``effect``."""
    return attribution[["effect"]].rename(columns={"effect": "effect_attribution"})


def patching_correlation(exact: pd.DataFrame, attribution: pd.DataFrame) -> float:
    """Pearson's correlation between exact patching's ``effect`` and attribution patching's,
    over the heads both tables have; NaN when undefined (fewer than 3 heads, or a constant)."""
    joined = exact[["effect"]].join(attribution_effect(attribution)).dropna()
    x, y = joined["effect"].to_numpy(float), joined["effect_attribution"].to_numpy(float)
    if len(joined) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])

"""Which heads matter: knock-outs and head importance (pruning curves: ``mhsa.causal.pruning``;
what a
knock-out's change measures: ``mhsa.causal.targets``).

A head is switched off by its gate in our module (its context multiplied by 0 before the output
projection), for every model our engine runs; transformers 5 has no ``head_mask`` any more.

- Michel, Levy and Neubig 2019, "Are Sixteen Heads Really Better than One?" (NeurIPS): head
  importance as the loss's sensitivity to a head gate, I_h = E_x |dL(x)/d xi_h| at xi = 1, with
  an optional per-layer l2 normalisation, and pruning curves (heads removed in order of
  importance, against a random order).
- Voita, Talbot, Moiseev, Sennrich and Titov 2019, "Analyzing Multi-Head Self-Attention:
  Specialized Heads Do the Heavy Lifting, the Rest Can Be Pruned" (ACL): confident and positional
  heads (``mhsa.head_stats``: ``confidence``, ``positional_*``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import torch

from mhsa.causal.targets import (
    EncodedEntry,
    Head,
    Item,
    Measure,
    TargetSpec,
    batch_item,
    block_names,
    encode_entry,
    gated_heads,
    gates_rows,
    prepare,
    resolve_target,
)
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.batches import Entry, Problem, batch_tokens_for, length_batches
from mhsa.engine.runs.forward import make_result, our_attention, our_seq2seq_forward
from mhsa.engine.runs.generation import Generation
from mhsa.engine.runs.swap import our_blocks
from mhsa.errors import InputError
from mhsa.heads import KIND_LETTERS, check_heads, parse_head

__all__ = [
    "METHODS",
    "Ablation",
    "ImportanceAccumulator",
    "ablate",
    "as_entries",
    "corpus_importance",
    "head_importance",
    "pair_target",
    "parse_head",
    "rank_correlation",
    "resolve_model",
    "target_value",
]

#: How head importance is measured, for people.
METHODS = {
    "ablation": "leave-one-out: the target's change when that head alone is switched off",
    "gradient": "Michel et al. 2019: |d target / d gate| at every gate = 1, one backward pass",
}

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Ablation:
    """A sentence through our module with heads switched off, beside the intact model.

    Attributes:
        heads: the ``(layer, head)`` pairs switched off.
        target: what ``change`` measures (see ``TARGET_SPECS``).
        change: the target's change (``TARGET_SPECS``).
        intact_value, ablated_value: the target's own value (``lm-loss``: the loss;
            ``similarity``: the cosine similarity; ``embedding``: 0 and ``change``).
        intact, ablated: every layer's attention of the (first) sentence; a knock-out changes
            every layer above it.
    """

    heads: tuple[Head, ...]
    target: str
    change: float
    intact_value: float
    ablated_value: float
    intact: AttentionResult
    ablated: AttentionResult


def as_entries(texts: str | Iterable[object]) -> list[Entry]:
    """Texts as entries: strings, ``Generation``s (attention and knock-outs over the ids the
    model chose), ``(text, pair)`` for similarity, or entries as they are.

    Raises:
        InputError: an item that is none of these, or no item at all.
    """
    items = [texts] if isinstance(texts, str | Generation) else list(texts)
    out: list[Entry] = []
    for i, item in enumerate(items, start=1):
        if isinstance(item, Entry):
            out.append(item)
        elif isinstance(item, str | Generation):
            out.append(Entry(f"texts:{i}", item))
        elif isinstance(item, tuple | list) and len(item) == 2:
            out.append(Entry(f"texts:{i}", str(item[0]), str(item[1])))
        else:
            raise InputError(f"{item!r} is neither a sentence nor a (sentence, sentence) pair.")
    if not out:
        raise InputError("No sentences given.")
    return out


def pair_target(lm: LoadedModel, entries: Sequence[Entry], target: str | None) -> TargetSpec:
    """The target of a run over ``entries`` (see ``resolve_target``): a target that compares
    two sentences needs every entry to be a pair.

    Raises:
        InputError: as ``resolve_target``, or an entry without its second sentence.
    """
    pairs = [e.pair is not None for e in entries]
    spec = resolve_target(lm, target, all(pairs))
    if spec.needs_pair and not all(pairs):
        raise InputError(
            f"The target {spec.name!r} needs every item as a (sentence, sentence) pair."
        )
    return spec


# --- one knock-out ----------------------------------------------------------------------------


def ablate(
    text: str | Generation,
    heads: Iterable[object],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    target: str | None = None,
    text_pair: str | None = None,
    max_tokens: int | None = None,
) -> Ablation:
    """Run ``text`` through our module with the listed heads switched off, beside the intact
    model.

    Args:
        text: the sentence, or a ``Generation`` (``mhsa.engine.generate_ids``): then the ids the
            model chose, as ``attend_generated`` shows them, not its text tokenized again.
        heads: ``(layer, head)`` pairs or labels ``"L{layer}H{head}"``; encoder-decoders:
            ``"E{layer}H{head}"``, ``"D{layer}H{head}"``, ``"C{layer}H{head}"`` (encoder,
            decoder and cross-attention; pairs then number the blocks in that order).
        model: ``"default"``, a model id or folder, or a ``LoadedModel``.
        target: ``"embedding"``, ``"similarity"`` or ``"lm-loss"`` (``TARGET_SPECS``); by default
            ``lm-loss`` when the checkpoint has a language-model head, ``similarity`` with
            ``text_pair``, else ``embedding``. Encoder-decoders: ``lm-loss`` only.
        text_pair: the second sentence of ``similarity``; encoder-decoders: the target text
            whose loss the decoder gives (the text itself when None).
        max_tokens: truncate to this many tokens.

    Raises:
        InputError, UnsupportedModelError: with a message saying what to do.
    """
    lm = resolve_model(model)
    spec = resolve_target(lm, target, text_pair is not None)
    with lm.lock, torch.inference_mode():
        measure = Measure(lm, spec)
        off = check_heads(heads, measure.names, measure.heads)
        item = prepare(lm, Entry("text", text, text_pair), spec, max_tokens)
        shown_text = text.text if isinstance(text, Generation) else text
        shown = [_attention_with(measure, item, shown_text, g) for g in ({}, measure.gates(off))]
        intact = measure.raw(item, {})
        ablated = measure.raw(item, measure.gates(off))
        change = float(measure.change(ablated, intact)[0])
    values = (0.0, change) if spec.value_is_change else (float(intact[0]), float(ablated[0]))
    return Ablation(off, spec.name, change, values[0], values[1], shown[0], shown[1])


def _attention_with(
    measure: Measure, item: Item, text: str, gates: dict[int, torch.Tensor]
) -> AttentionResult:
    """Every layer's attention of the item's first sentence with ``gates`` on our module
    (encoder-decoders: the encoder's, the decoder's and the cross attention)."""
    lm = measure.lm
    if lm.is_encoder_decoder:
        forward = our_seq2seq_forward(lm, item.encoded.inputs_on(lm.device), measure.blocks, gates)
        attention, causal = forward.attention.float().cpu().numpy(), False
        fields = {**forward.extra, "decoder_tokens": item.encoded.decoder_tokens}
    else:
        sink, _ = our_attention(lm, measure.blocks, item.encoded.inputs, gates, whole=False)
        attention, causal, fields = sink[:, 0].float().cpu().numpy(), measure.blocks[0].causal, {}
    return make_result(
        lm,
        item.encoded,
        text,
        attention,
        engine="mhsa",
        timings={"load": lm.load_seconds},
        causal=causal,
        **fields,
    )


def target_value(
    text: str,
    gates: dict[int, Sequence[float]] | None = None,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    target: str | None = None,
    text_pair: str | None = None,
    max_tokens: int | None = None,
) -> float:
    """The target's value with head gates set to any values (``{layer: [gate per head]}``;
    layers left out: all 1): the loss (``lm-loss``), the similarity (``similarity``) or the
    embedding's change from the intact model (``embedding``). What the gradient differentiates."""
    lm = resolve_model(model)
    spec = resolve_target(lm, target, text_pair is not None)
    with lm.lock, torch.inference_mode():
        measure = Measure(lm, spec)
        item = prepare(lm, Entry("text", text, text_pair), spec, max_tokens)
        tensors = {
            int(k): torch.as_tensor(v, dtype=torch.float32, device=lm.device)
            for k, v in (gates or {}).items()
        }
        raw = measure.raw(item, tensors)
        intact = measure.raw(item, {}) if spec.value_is_change else raw
        return float(measure.value(raw, intact)[0])


# --- importance -------------------------------------------------------------------------------


def _leave_one_out(
    measure: Measure, item: Item, batch_size: int, tick: Callable[[], None]
) -> np.ndarray:
    """``[B, L, H]``: the target's change with each head alone off, per sentence of the item.
    One intact pass records every layer's output; for each layer, the layers below are replayed
    from it and the heads of the layer run side by side as copies of the batch (``batch_size``
    copies at most)."""
    records: list[dict[int, Any]] = [{} for _ in item.scored]
    intact = measure.raw(item, {}, record=records)
    b = item.rows
    out = np.zeros((b, measure.layers, measure.heads))
    for layer in range(measure.layers):
        for start in range(0, measure.heads, batch_size):
            heads = list(range(start, min(start + batch_size, measure.heads)))
            configs = [[(layer, h)] for h in heads]
            rows = [c for c in configs for _ in range(b)]  # row r * B + s: sentence s, config r
            gates = gates_rows(rows, measure.layers, measure.heads, measure.lm.device)
            raw = measure.raw(item, gates, rows=len(configs), layer=layer, replay=records)
            change = measure.change(raw, intact).double().cpu().numpy()
            out[:, layer, heads] = change.reshape(len(configs), b).T
        tick()
    return out


def _gradient(measure: Measure, item: Item) -> np.ndarray:
    """``[B, L, H]``: d target / d gate at every gate = 1, per sentence of the item (one forward
    and one backward pass; a row's target depends on its own row of gates only)."""
    with torch.inference_mode(False), torch.enable_grad():
        shape = (item.rows, measure.heads) if item.rows > 1 else (measure.heads,)
        gates = {
            layer: torch.ones(shape, device=measure.lm.device, requires_grad=True)
            for layer in range(measure.layers)
        }
        value = measure.raw(item, gates).sum()
        grads = torch.autograd.grad(value, [gates[i] for i in range(measure.layers)])
    stacked = torch.stack(grads).double().cpu().numpy()  # (L, B, H) or (L, H)
    return stacked[None] if item.rows == 1 else stacked.transpose(1, 0, 2)


def _frame(
    values: np.ndarray, columns: dict[str, np.ndarray], names: Sequence[str] | None = None
) -> pd.DataFrame:
    """One row per head, indexed by its label; ``layer`` is the block's number (``names``:
    how labels name each block, ``L{layer}`` by default). Encoder-decoders get a ``kind``
    column (encoder, decoder, cross)."""
    layers, heads = values.shape[-2:]
    names = [f"L{i}" for i in range(layers)] if names is None else list(names)
    frame = pd.DataFrame({k: v.reshape(-1) for k, v in columns.items()})
    frame.insert(0, "head", np.tile(np.arange(heads), layers))
    frame.insert(0, "layer", np.repeat(np.arange(layers), heads))
    if not all(n.startswith("L") for n in names):
        letters = {letter: kind for kind, letter in KIND_LETTERS.items()}
        frame.insert(0, "kind", [letters[names[li][0]] for li in frame["layer"]])
    frame.index = [f"{names[li]}H{h}" for li, h in zip(frame["layer"], frame["head"], strict=True)]
    return frame


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise InputError(f"Unknown method {method!r}: choose one of {', '.join(METHODS)}.")


def _check_importance(
    lm: LoadedModel, entries: Sequence[Entry], method: str, target: str | None, batch_size: int
) -> TargetSpec:
    """The arguments of an importance run checked; returns the resolved target."""
    _check_method(method)
    if batch_size < 1:
        raise InputError("batch_size must be at least 1.")
    spec = pair_target(lm, entries, target)
    if method == "gradient" and spec.no_gradient:
        raise InputError(spec.no_gradient)
    return spec


class ImportanceAccumulator:
    """Per-head importance over a corpus as running moments, mergeable across shards.

    ``add`` takes one text's ``[L, H]`` values (or a batch ``[B, L, H]``): changes (ablation) or
    signed gradients (gradient). Keeps the count, the mean, the sum of squared deviations (Chan
    et al.'s parallel update, for the standard deviation) and the mean absolute value, so that
    ``merge`` is associative and order-independent (up to float rounding).
    """

    def __init__(self, method: str, target: str, names: Sequence[str] | None = None) -> None:
        """
        Args:
            method: ``"ablation"`` or ``"gradient"``.
            target: the target's name.
            names: how head labels name each block (``Measure.names``); ``L{layer}`` when None.
        """
        _check_method(method)
        self.method = method
        self.target = target
        self.names = None if names is None else tuple(names)
        self.count = 0
        self._mean: np.ndarray | None = None
        self._m2: np.ndarray | None = None
        self._abs: np.ndarray | None = None  # mean of |value|

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        batch = values if values.ndim == 3 else values[None]
        other = ImportanceAccumulator(self.method, self.target, self.names)
        other.count = len(batch)
        other._mean = batch.mean(0)
        other._m2 = ((batch - other._mean) ** 2).sum(0)
        other._abs = np.abs(batch).mean(0)
        self.merge(other)

    def merge(self, other: ImportanceAccumulator) -> ImportanceAccumulator:
        """Add another accumulator's texts (a shard computed elsewhere); returns self."""
        if not isinstance(other, ImportanceAccumulator):
            raise TypeError(f"Cannot merge {type(other).__name__} into ImportanceAccumulator.")
        if (other.method, other.target) != (self.method, self.target):
            raise ValueError(
                f"Cannot merge {other.method}/{other.target} importance into "
                f"{self.method}/{self.target}."
            )
        if other.names != self.names:
            raise ValueError("Cannot merge importance of blocks named differently.")
        if other.count == 0 or other._mean is None or other._m2 is None or other._abs is None:
            return self
        if self._mean is None or self._m2 is None or self._abs is None:
            self.count = other.count
            self._mean, self._m2, self._abs = (
                other._mean.copy(),
                other._m2.copy(),
                other._abs.copy(),
            )
            return self
        if other._mean.shape != self._mean.shape:
            raise ValueError("All shards must come from models with the same layers x heads.")
        n_a, n_b = self.count, other.count
        n = n_a + n_b
        delta = other._mean - self._mean
        self._mean = self._mean + delta * (n_b / n)
        self._m2 = self._m2 + other._m2 + delta**2 * (n_a * n_b / n)
        self._abs = (self._abs * n_a + other._abs * n_b) / n
        self.count = n
        return self

    def frame(self, *, normalize: bool = False) -> pd.DataFrame:
        """The table ``head_importance`` returns (see there)."""
        if self.count == 0 or self._mean is None or self._m2 is None or self._abs is None:
            raise ValueError("No texts were added.")
        if self.method == "ablation":
            columns = {"importance": self._mean, "std": np.sqrt(self._m2 / self.count)}
        else:
            columns = {"importance": self._abs, "gradient": self._mean}
        if normalize:
            raw = columns["importance"]
            norm = np.linalg.norm(raw, axis=1, keepdims=True)
            columns = {
                "importance": np.divide(raw, norm, out=np.zeros_like(raw), where=norm > 0),
                "importance_raw": raw,
                **{k: v for k, v in columns.items() if k != "importance"},
            }
        frame = _frame(self._mean, columns, self.names)
        frame.attrs.update(
            method=self.method, target=self.target, texts=self.count, normalized=normalize
        )
        return frame


def _nothing(*_: object) -> None:
    """No progress to report."""


def _accumulate(
    lm: LoadedModel,
    spec: TargetSpec,
    method: str,
    units: Iterable[Callable[[], Item]],
    *,
    batch_size: int,
    tick: Callable[[], None] = _nothing,
    after: Callable[[Item], None] = _nothing,
) -> ImportanceAccumulator:
    """The one path of head importance: each unit of work (one text, or a padded batch of
    texts) built into an item under the lock and measured by leave-one-out or the gradient.
    ``tick()`` follows each layer of leave-one-out and each gradient, ``after(item)`` each unit;
    both run between forward passes, so a cancel raised from them leaves nothing swapped."""
    acc = ImportanceAccumulator(method, spec.name, _block_names(lm))
    for build in units:
        # the gradient's inputs must be ordinary tensors (autograd saves them)
        with lm.lock, torch.inference_mode(method == "ablation"):
            measure = Measure(lm, spec)
            item = build()
            if method == "ablation":
                acc.add(_leave_one_out(measure, item, batch_size, tick))
            else:
                acc.add(_gradient(measure, item))
                tick()
        after(item)
    return acc


def _layers_and_heads(lm: LoadedModel) -> tuple[int, int]:
    with lm.lock:
        blocks = our_blocks(lm, None)
    return len(blocks), gated_heads(blocks)


def _block_names(lm: LoadedModel) -> list[str] | None:
    """How labels name the blocks of an encoder-decoder (``E0``, ``D0``, ``C0``); None for
    encoders and decoders (``L{layer}``)."""
    if not lm.is_encoder_decoder:
        return None
    with lm.lock:
        return block_names(our_blocks(lm, None))


def head_importance(
    texts: str | Iterable[object],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    method: str = "ablation",
    target: str | None = None,
    normalize: bool = False,
    max_tokens: int | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """How much each head matters, averaged over ``texts``: one row per head, index
    ``L{layer}H{head}``, like ``head_stats``.

    Args:
        texts: sentences (or ``Generation``s: over the ids the model chose); for
            ``target="similarity"``, ``(sentence, sentence)`` pairs.
        method: ``"ablation"``: the target's change with that head alone switched off
            (leave-one-out; columns ``importance`` (mean change), ``std``). ``"gradient"``:
            Michel et al.'s ``|d target / d gate|`` at every gate = 1 (columns ``importance``,
            the mean of the absolute gradient, and ``gradient``, the mean signed one).
        target: see ``ablate``.
        normalize: Michel et al.'s per-layer normalisation: each layer's importances divided by
            their l2 norm (the raw mean stays in ``importance_raw``).
        batch_size: most knock-outs run side by side in one batch (ablation).
        progress: called as ``progress(done, total)`` after each unit of work; raising from it
            stops the computation (the app's cancel).

    Leave-one-out costs one intact pass plus, per layer, the layers from it upwards on a batch
    of that layer's heads: the layers below are replayed from the intact pass, not recomputed.

    Raises:
        InputError: unknown method or target, a target the model cannot measure, or the gradient
            of the embedding distance, which is zero at the intact model.
    """
    lm = resolve_model(model)
    entries = as_entries(texts)
    spec = _check_importance(lm, entries, method, target, batch_size)
    layers, _ = _layers_and_heads(lm)
    total = len(entries) * (layers if method == "ablation" else 1)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    units = (partial(prepare, lm, entry, spec, max_tokens) for entry in entries)
    acc = _accumulate(lm, spec, method, units, batch_size=batch_size, tick=tick)
    return acc.frame(normalize=normalize)


def _encode_entries(
    lm: LoadedModel,
    entries: Sequence[Entry],
    spec: TargetSpec,
    max_tokens: int | None,
    problems: list[Problem] | None,
) -> list[EncodedEntry]:
    """Every entry encoded for the target; one it cannot take goes to ``problems`` (raised
    when there is no such list)."""
    encoded = []
    with lm.lock:
        for entry in entries:
            try:
                encoded.append(encode_entry(lm, entry, spec, max_tokens))
            except InputError as e:
                if problems is None:
                    raise
                problems.append(Problem(entry.where, str(e)))
    return encoded


def corpus_importance(
    entries: Sequence[Entry],
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    method: str = "ablation",
    target: str | None = None,
    max_tokens: int | None = None,
    batch_tokens: int | None = None,
    batch_size: int = 16,
    problems: list[Problem] | None = None,
    progress: Progress | None = None,
) -> ImportanceAccumulator:
    """``head_importance`` over a corpus in padded batches of sentences of similar length:
    the same values as one by one (within float rounding), returned as a mergeable
    ``ImportanceAccumulator`` (``.frame()`` is the table). Entries the model cannot take (too
    long, too short for the loss, a missing second sentence) go to ``problems``.

    ``batch_tokens`` bounds the padded tokens of one forward pass: sentences x the heads run
    side by side (``batch_size`` at most) x the longest sentence.
    """
    lm = resolve_model(model)
    if not entries:
        raise InputError("No sentences given.")
    spec = _check_importance(lm, entries, method, target, batch_size)
    _, heads = _layers_and_heads(lm)
    encoded = _encode_entries(lm, entries, spec, max_tokens, problems)
    copies = min(batch_size, heads) if method == "ablation" else 1
    budget = max(1, batch_tokens_for(lm, batch_tokens) // copies)
    batches = length_batches([e.length for e in encoded], budget)
    if lm.is_encoder_decoder:  # an encoder's and a decoder's lengths: one entry at a time
        batches = [[i] for batch in batches for i in batch]
    units = (partial(batch_item, lm, [encoded[i] for i in batch], spec) for batch in batches)
    done = 0

    def after(item: Item) -> None:
        nonlocal done
        done += item.rows
        if progress is not None:
            progress(done, len(encoded))

    return _accumulate(lm, spec, method, units, batch_size=batch_size, after=after)


def rank_correlation(importance: pd.DataFrame, stats: pd.DataFrame, column: str) -> float:
    """Spearman's rank correlation between the heads' importance and a ``head_stats`` column
    (Voita et al.: the important heads are the confident ones), NaN when undefined."""
    from scipy.stats import spearmanr

    joined = importance[["importance"]].join(stats[[column]]).dropna().astype(float)
    if len(joined) < 3 or joined.nunique().min() < 2:
        return float("nan")
    return float(spearmanr(joined["importance"], joined[column]).statistic)

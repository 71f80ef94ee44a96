"""Faithfulness of an explanation: the model run with a head's attention replaced by the
program's pattern, against the same head made structure-free.

Hayes, Li and Andreas 2026 ("Explaining Attention with Program Synthesis") test an explanation
by replacing heads' patterns with their programs' in the real forward pass and measuring how
much the model's loss rises. Here the rise is put on a scale of its own, against the same heads
made **uniform** over the keys each query may see (the causal mask for decoders, every key for
encoders: attention with no structure at all)::

    faithfulness = 1 - (m_program - m_clean) / (m_uniform - m_clean)

1 when the program's pattern does the head's job as well as its own pattern, 0 when it does no
better than no structure, below 0 when it does worse. ``m`` is the model's loss on the
positions it is scored on (``mhsa.causal.metrics``, as head importance measures a head):

- a toy model trained on a repeat (``REPEAT_TASKS``): the next-token cross-entropy over the
  tokens an induction head can predict (``repeat-loss``: its task's scored positions);
- a toy model of a task with a separator (copy, reverse, sort): the cross-entropy of the output
  after ``[SEP]`` (``output-loss``: its task's scored positions, ``TaskSpec.scored``);
- other causal language models: every next token's cross-entropy (``lm-loss``);
- encoders: 1 - cosine between the sentence embedding (the attention-mask-weighted mean of the
  last hidden state, as sentence-transformers pool MiniLM) of the run and of the intact model
  (``embedding``; ``m_clean`` is 0).

Cross-entropies are averaged over every scored token of every text together; the embedding's
distance over texts. The patterns are replaced through the stream recorder's pattern
replacement (``replace={"L{l}.pattern": fn}``), one text a pass.

**When no number is given.** A ratio needs a denominator that measures something: where making
the heads uniform moves ``m`` by less than ``MIN_EFFECT`` (5%) of what making *every* head of
their layers uniform moves it, the head is one of several siblings doing the same job (the
others make up for it), and any program, good or bad, scores near 1: ``value`` is NaN and
``reason`` says why. The scale is the layers' effect, not ``m_clean``: the embedding's
``m_clean`` is 0, and a loss's size says how well the model predicts the text, not how much the
head matters (a toy model whose repeat loss is near 0 would pass any head; a large model's
3-nat loss would fail nearly all). A set that is whole layers is its own scale and gets a
number wherever the layers move ``m`` at all.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mhsa.causal.metrics import REPEAT_TASKS
from mhsa.causal.targets import Item, prepare, target_spec
from mhsa.engine.families.layout import final_norm_of
from mhsa.engine.models.loading import LoadedModel, resolve_model
from mhsa.engine.models.names import toy_task
from mhsa.engine.runs.batches import Entry
from mhsa.engine.runs.swap import OurBlock, our_blocks
from mhsa.engine.stream.recorder import recorded
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.heads import head_label, parse_head

__all__ = [
    "FAITHFULNESS_TASKS",
    "FAITHFULNESS_TEXTS",
    "MIN_EFFECT",
    "Faithfulness",
    "default_task",
    "heads_faithfulness",
    "layer_faithfulness",
    "many_heads_faithfulness",
    "pattern_faithfulness",
    "uniform_pattern",
]

#: how many texts faithfulness is meant to run over (``explain_heads``: the first of its
#: held-out texts): each head costs two passes a text (its program, its uniform), so 16 texts
#: cost MiniLM's 72 heads about 53 s of CPU on the default atlas (BENCHMARKS.md)
FAITHFULNESS_TEXTS = 16

#: no number below this share of the heads' layers' own effect (see the module's docstring)
MIN_EFFECT = 0.05

#: what ``m`` can be (``task=``): ``mhsa.causal.metrics.TARGET_SPECS`` names, and
#: ``output-loss``, the loss on a separator task's output (the tokens after its first [SEP])
FAITHFULNESS_TASKS = ("repeat-loss", "output-loss", "lm-loss", "embedding")

Head = tuple[int, int]


@dataclass(frozen=True)
class Faithfulness:
    """How well replacing heads' patterns by programs' keeps the model working.

    Attributes:
        value: ``1 - (m_program - m_clean) / (m_uniform - m_clean)``, or NaN (``reason``).
        m_clean: ``m`` of the intact model.
        m_program: ``m`` with the heads' patterns replaced by the programs'.
        m_uniform: ``m`` with the heads made uniform over the keys each query may see.
        reason: why ``value`` is NaN, for the screen; "" when a value is given.
        heads: the ``(layer, head)`` pairs replaced together.
        task: what ``m`` is (``FAITHFULNESS_TASKS``).
        texts: how many texts ``m`` is measured over.
        scale: ``m`` with every head of the heads' layers uniform, less ``m_clean``: the
            effect ``m_uniform - m_clean`` is measured against (``MIN_EFFECT``).
    """

    value: float
    m_clean: float
    m_program: float
    m_uniform: float
    reason: str = ""
    heads: tuple[Head, ...] = ()
    task: str = ""
    texts: int = 0
    scale: float = math.nan

    @property
    def labels(self) -> list[str]:
        """The heads as labels, ``["L3H4", ...]``."""
        return [head_label(layer, head) for layer, head in self.heads]


def uniform_pattern(n: int, causal: bool) -> np.ndarray:
    """``[n, n]`` attention with no structure: each query's weight spread evenly over the keys
    it may see (the keys up to itself when ``causal``, else every key)."""
    visible = np.tril(np.ones((n, n))) if causal else np.ones((n, n))
    return visible / visible.sum(1, keepdims=True)


def _toy_measure(toy: str | None) -> str | None:
    """The measure of a toy task's scored positions, or None (not a toy task)."""
    if toy is None:
        return None
    if toy in REPEAT_TASKS:
        return "repeat-loss"
    from mhsa.training.tasks import TASKS

    spec = TASKS.get(toy)
    return "output-loss" if spec is not None and spec.separator else None


def default_task(lm: LoadedModel) -> str:
    """``m``'s default for ``lm``: a toy model's task's scored positions (``repeat-loss``,
    ``output-loss``), ``lm-loss`` for another causal language model, else ``embedding``."""
    if lm.lm_head == "causal":
        return _toy_measure(toy_task(lm.name)) or "lm-loss"
    return "embedding"


def _check_task(lm: LoadedModel, task: str | None) -> str:
    task = default_task(lm) if task is None else _toy_measure(task) or task
    if task not in FAITHFULNESS_TASKS:
        raise InputError(
            f"Faithfulness measures one of {', '.join(FAITHFULNESS_TASKS)}, not {task!r}."
        )
    if task != "embedding" and lm.lm_head != "causal":
        raise InputError(
            f"The task {task!r} is a next-token loss: {lm.display_name} is not a causal language "
            "model with its head (use 'embedding': a masked LM's masks would change the text the "
            "program's pattern was made for)."
        )
    return task


# --- the passes ---------------------------------------------------------------------------------


@dataclass
class _Text:
    """One text as faithfulness runs it: its scored inputs and, for a loss, its labels."""

    item: Item
    n: int

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        return self.item.scored[0]


@dataclass
class _Memo:
    """What does not change between calls on the same texts: the clean pass's readouts and
    ``m`` with each set of whole layers uniform."""

    clean: list[torch.Tensor] | None = None
    layers: dict[frozenset[int], float] = field(default_factory=dict)


#: per model, the memos of the last few sets of texts (a call per head, as ``explain_heads``
#: makes, then costs its own two passes a text); dropped with the model
_MEMOS: weakref.WeakKeyDictionary[LoadedModel, OrderedDict[tuple, _Memo]] = (
    weakref.WeakKeyDictionary()
)
_MEMOS_KEPT = 4


def _memo(lm: LoadedModel, key: tuple) -> _Memo:
    """The memo of ``key`` (texts, task, sizes) for ``lm``; caller holds ``lm.lock``."""
    memos = _MEMOS.setdefault(lm, OrderedDict())
    if key in memos:
        memos.move_to_end(key)
        return memos[key]
    memos[key] = _Memo()
    while len(memos) > _MEMOS_KEPT:
        memos.popitem(last=False)
    return memos[key]


@dataclass
class _Runs:
    """The passes of one model over one set of texts: the clean pass's readouts, the layers
    made uniform (each set once), and ``m`` of any replacement. Holds ``lm.lock`` while used."""

    lm: LoadedModel
    task: str
    texts: list[_Text]
    memo: _Memo = field(default_factory=lambda: _Memo())
    blocks: list[OurBlock] = field(init=False)
    #: decoders: a query sees itself and the keys before it
    causal: bool = field(init=False)
    #: heads a layer
    heads: int = field(init=False)
    #: the final norm the embedding reads through (models with one), else None
    norm: nn.Module | None = field(init=False)
    #: the point each pass keeps: the logits, or the last hidden state's input
    read: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.blocks = our_blocks(self.lm)
        if any(b.kind != "self" for b in self.blocks):
            raise UnsupportedModelError(
                f"{self.lm.display_name} is an encoder-decoder: faithfulness covers encoders and "
                "decoders (one self-attention a layer)."
            )
        self.causal = bool(self.blocks[0].causal)
        self.heads = self.blocks[0].ours.num_heads
        self.norm = None
        if self.task == "embedding":
            try:
                self.norm = final_norm_of(self.lm)
            except UnsupportedModelError:
                self.norm = None
        last = len(self.blocks) - 1
        self.read = (
            ["logits"]
            if self.task != "embedding"
            else ["final_norm_in"]
            if self.norm is not None
            else [f"L{last}.resid_post"]
        )

    def readout(self, text: _Text, replace: dict[str, Callable]) -> torch.Tensor:
        """One text's pass: the per-token losses and their mask ``[2, T]`` (a loss), or the
        sentence embedding ``[D]``."""
        values = recorded(self.lm, self.blocks, text.inputs, self.read, replace=replace).values
        hidden = values[self.read[0]]
        if self.task != "embedding":
            return _token_losses(self.lm, hidden, text.item.labels)
        if self.norm is not None:
            with torch.inference_mode():
                p = next(self.norm.parameters(), None)
                dtype = p.dtype if p is not None else torch.float32
                hidden = self.norm(hidden.to(self.lm.device, dtype)[None])[0].float().cpu()
        mask = text.inputs.get("attention_mask", torch.ones(1, hidden.shape[0]))[0]
        weight = mask.to(hidden.dtype)[:, None]
        return (hidden * weight).sum(0) / weight.sum()

    def clean(self) -> list[torch.Tensor]:
        if self.memo.clean is None:
            self.memo.clean = [self.readout(t, {}) for t in self.texts]
        return self.memo.clean

    def m(self, replace_of: Callable[[int], dict[str, Callable]]) -> float:
        """``m`` with each text ``i`` run under ``replace_of(i)``."""
        outs = [self.readout(t, replace_of(i)) for i, t in enumerate(self.texts)]
        return self.measure(outs)

    def measure(self, outs: Sequence[torch.Tensor]) -> float:
        if self.task != "embedding":
            total = sum(float(o[0].double().sum()) for o in outs)
            count = sum(float(o[1].double().sum()) for o in outs)
            return total / count
        clean = self.clean()
        distances = [  # 1 - cos is never below 0; rounding of a vector with itself can be
            max(0.0, 1.0 - float(F.cosine_similarity(o.double(), c.double(), dim=0)))
            for o, c in zip(outs, clean, strict=True)
        ]
        return float(np.mean(distances))

    def m_clean(self) -> float:
        if self.task == "embedding":
            return 0.0  # the intact model's distance from itself
        return self.measure(self.clean())

    def layers_uniform(self, layers: frozenset[int]) -> float:
        """``m`` with every head of ``layers`` uniform (each set measured once)."""
        if layers not in self.memo.layers:
            every = {layer: list(range(self.heads)) for layer in layers}
            self.memo.layers[layers] = self.m(lambda i: self._uniform(every))
        return self.memo.layers[layers]

    def _uniform(self, heads: Mapping[int, Sequence[int]]) -> dict[str, Callable]:
        return {f"L{layer}.pattern": _uniform_heads(hs, self.causal) for layer, hs in heads.items()}


def _token_losses(lm: LoadedModel, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``[2, T - 1]``: each next token's cross-entropy (0 where not scored) and the scored mask
    (``lm_loss``'s shift and labels, per token)."""
    labels = labels[0, 1:]
    scored = labels != -100
    per_token = F.cross_entropy(logits[:-1].float(), labels.clamp(min=0), reduction="none")
    return torch.stack([per_token * scored, scored.float()])


def _visible(value: torch.Tensor, causal: bool) -> torch.Tensor:
    """``[T, T]`` bool: the keys each query may see in this pass (the model's own mask shows
    as weight exactly 0 in every head: padding, a sliding window), within the causal mask."""
    visible = (value > 0).any(0)
    if causal:
        visible &= torch.ones_like(visible).tril()
    return visible


def _uniform_heads(heads: Sequence[int], causal: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def replace(value: torch.Tensor) -> torch.Tensor:
        visible = _visible(value, causal).to(value.dtype)
        uniform = visible / visible.sum(-1, keepdim=True).clamp(min=1)
        out = value.clone()
        out[list(heads)] = uniform
        return out

    return replace


def _program_heads(
    patterns: Mapping[int, torch.Tensor], causal: bool, layer: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    def replace(value: torch.Tensor) -> torch.Tensor:
        visible = _visible(value, causal)
        out = value.clone()
        for head, pattern in patterns.items():
            hidden = float(pattern.masked_fill(visible, 0).abs().max())
            if hidden > 1e-6:
                raise InputError(
                    f"The pattern given for {head_label(layer, head)} puts weight on keys its "
                    f"queries may not see (up to {hidden:.3g}); a query attends to "
                    f"{'itself and earlier keys' if causal else 'the text its mask shows'}."
                )
            out[head] = pattern.to(value.dtype)
        return out

    return replace


# --- inputs ---------------------------------------------------------------------------------------


def _heads_of(replacements: Mapping[object, Sequence[np.ndarray]]) -> dict[Head, list]:
    if not isinstance(replacements, Mapping) or not replacements:
        raise InputError("Give the patterns to put in: {(layer, head): [pattern per text]}.")
    out: dict[Head, list] = {}
    for key, patterns in replacements.items():
        head = parse_head(key)
        if head in out:
            raise InputError(f"{head_label(*head)} is given twice.")
        out[head] = list(patterns)
    return out


def _check_pattern(pattern: object, head: Head, t: int) -> np.ndarray:
    """A pattern as float64 ``[n, n]``, non-negative, each row summing to 1 or to 0 (a query the
    program gives no key: the head writes nothing there)."""
    where = f"{head_label(*head)}'s pattern for text {t + 1}"
    try:
        p = np.asarray(pattern, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{where} is not an array of numbers.") from None
    if p.ndim != 2 or p.shape[0] != p.shape[1] or p.shape[0] == 0:
        raise InputError(f"{where} must be a square [n, n] array, got shape {list(p.shape)}.")
    if not np.isfinite(p).all() or (p < 0).any():
        raise InputError(f"{where} has negative or non-finite weights.")
    sums = p.sum(1)
    if not np.all((np.abs(sums - 1) < 1e-4) | (np.abs(sums) < 1e-9)):
        bad = int(np.flatnonzero((np.abs(sums - 1) >= 1e-4) & (np.abs(sums) >= 1e-9))[0])
        raise InputError(f"{where}: row {bad} sums to {sums[bad]:.4g}; each row sums to 1 (or 0).")
    return p


def _output_only(lm: LoadedModel, item: Item, i: int) -> Item:
    """The labels of a separator task's output: the tokens after the first ``[SEP]``."""
    ids = item.scored[0]["input_ids"][0]
    sep = lm.tokenizer.convert_tokens_to_ids("[SEP]")
    where = (ids == sep).nonzero().flatten().tolist()
    if not where or where[0] + 1 >= len(ids):
        raise InputError(
            f"Text {i + 1} has no output after [SEP] to score (a sequence of the task: input "
            "symbols, [SEP], the output)."
        )
    labels = item.labels.clone()
    labels[0, : where[0] + 1] = -100
    return Item(item.encoded, item.scored, labels, item.stacked, item.rows)


def _prepare(lm: LoadedModel, texts: Sequence[str], task: str, sizes: Sequence[int]) -> list[_Text]:
    spec = target_spec("lm-loss" if task == "output-loss" else task)
    out = []
    for i, (text, n) in enumerate(zip(texts, sizes, strict=True)):
        item = prepare(lm, Entry(f"texts:{i + 1}", text), spec, n)
        if task == "output-loss":
            item = _output_only(lm, item, i)
        got = item.scored[0]["input_ids"].shape[1]
        if got != n:
            raise InputError(
                f"Text {i + 1} is {got} tokens for {lm.display_name}; its patterns are {n} x {n}: "
                "give one pattern per text, over the text's tokens as the model reads them."
            )
        out.append(_Text(item, n))
    return out


def _runs(
    lm: LoadedModel, texts: Iterable[str], heads: dict[Head, list], task: str | None
) -> tuple[_Runs, dict[Head, list[torch.Tensor]]]:
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise InputError("Faithfulness needs at least one text.")
    for head, patterns in heads.items():
        if len(patterns) != len(texts):
            raise InputError(
                f"{head_label(*head)} has {len(patterns)} patterns for {len(texts)} texts: give "
                "one a text."
            )
    checked = {h: [_check_pattern(p, h, t) for t, p in enumerate(ps)] for h, ps in heads.items()}
    sizes = [next(iter(checked.values()))[t].shape[0] for t in range(len(texts))]
    for head, patterns in checked.items():
        for t, p in enumerate(patterns):
            if p.shape[0] != sizes[t]:
                raise InputError(
                    f"{head_label(*head)}'s pattern for text {t + 1} is {p.shape[0]} x "
                    f"{p.shape[0]}; another head's is {sizes[t]} x {sizes[t]}."
                )
    task = _check_task(lm, task)
    memo = _memo(lm, (tuple(texts), task, tuple(sizes)))
    runs = _Runs(lm, task, _prepare(lm, texts, task, sizes), memo)
    layers, per_layer = len(runs.blocks), runs.heads
    for layer, head in checked:
        if not (0 <= layer < layers and 0 <= head < per_layer):
            raise InputError(
                f"{lm.display_name} has no head {head_label(layer, head)}: layers 0-{layers - 1}, "
                f"heads 0-{per_layer - 1}."
            )
    tensors = {
        h: [torch.as_tensor(p, dtype=torch.float32, device=lm.device) for p in ps]
        for h, ps in checked.items()
    }
    return runs, tensors


def _faithfulness(runs: _Runs, patterns: Mapping[Head, list[torch.Tensor]]) -> Faithfulness:
    """One set of heads replaced together, on ``runs``'s texts."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in sorted(patterns):
        by_layer.setdefault(layer, []).append(head)

    def program(i: int) -> dict[str, Callable]:
        return {
            f"L{layer}.pattern": _program_heads(
                {h: patterns[(layer, h)][i] for h in hs}, runs.causal, layer
            )
            for layer, hs in by_layer.items()
        }

    m_clean = runs.m_clean()
    m_program = runs.m(program)
    whole = all(len(hs) == runs.heads for hs in by_layer.values())
    m_uniform = runs.layers_uniform(frozenset(by_layer)) if whole else None
    if m_uniform is None:
        m_uniform = runs.m(lambda i: runs._uniform(by_layer))
    scale = runs.layers_uniform(frozenset(by_layer)) - m_clean
    heads = tuple(sorted(patterns))
    effect = m_uniform - m_clean
    value, reason = math.nan, ""
    names = ", ".join(head_label(*h) for h in heads)
    if len(heads) > 4:
        names = f"{len(heads)} heads"
    layers = ", ".join(f"L{layer}" for layer in sorted(by_layer))
    if not abs(scale) > 1e-9:
        reason = (
            f"Making every head of {layers} uniform does not change the {_what(runs.task)} "
            f"({m_clean:.4g}): there is nothing for a program to keep."
        )
    elif abs(effect) < MIN_EFFECT * abs(scale):
        reason = (
            f"Making {names} uniform changes the {_what(runs.task)} by {effect:.3g}, under "
            f"{MIN_EFFECT:.0%} of what making every head of {layers} uniform does "
            f"({scale:.3g}): the other heads do the same job, so no program can be told apart "
            "from no structure."
        )
    else:
        value = 1.0 - (m_program - m_clean) / effect
    return Faithfulness(
        value,
        m_clean,
        m_program,
        m_uniform,
        reason,
        heads,
        runs.task,
        len(runs.texts),
        scale,
    )


def _what(task: str) -> str:
    return {
        "repeat-loss": "loss on the repeat",
        "output-loss": "loss on the task's output",
        "lm-loss": "next-token loss",
        "embedding": "sentence embedding's distance from the intact model's (1 - cosine)",
    }[task]


# --- the functions ------------------------------------------------------------------------------


def pattern_faithfulness(
    lm: str | LoadedModel,
    texts: str | Sequence[str],
    replacements: Mapping[object, Sequence[np.ndarray]],
    *,
    task: str | None = None,
) -> Faithfulness:
    """Faithfulness of patterns put in place of heads' own, every head given replaced at once.

    ``1 - (m_program - m_clean) / (m_uniform - m_clean)`` (see the module's docstring): the
    model's loss ``m`` on ``texts`` with the heads' patterns replaced by ``replacements`` in
    the real forward pass, against the same heads made uniform over the keys each query may
    see (Hayes, Li and Andreas 2026's test of an explanation, on a scale from "no structure" to
    "the head itself").

    Args:
        lm: the model (a name, a folder or a ``LoadedModel``).
        texts: the texts, each encoded as ``mhsa.attend`` encodes it (cut to the patterns' size,
            as an atlas cuts a long text).
        replacements: ``(layer, head)`` (or ``"L3H4"``) -> one ``[n, n]`` pattern per text, over
            the text's ``n`` tokens, each row summing to 1 (0: the head writes nothing there),
            with no weight on keys a query may not see. Several heads: replaced together (a
            layer's heads, the best-explained quarter of the model's heads).
        task: what ``m`` is (``FAITHFULNESS_TASKS``): ``"repeat-loss"``, ``"output-loss"``,
            ``"lm-loss"`` or ``"embedding"``, or a toy task's name (``"induction"``: its scored
            positions); None: a toy model's task's scored positions, ``lm-loss`` for another
            causal language model, ``embedding`` for encoders.

    Returns:
        The ``Faithfulness``; ``value`` NaN with ``reason`` where the heads made uniform move
        ``m`` by less than ``MIN_EFFECT`` of what their layers made uniform do.

    Raises:
        InputError: no text or no pattern, a pattern of the wrong size or not a distribution,
            weight on a key a query may not see, a head the model lacks, a task the model
            cannot measure.
        UnsupportedModelError: an encoder-decoder.
    """
    lm = resolve_model(lm)
    heads = _heads_of(replacements)
    with lm.lock:
        runs, patterns = _runs(lm, texts, heads, task)
        return _faithfulness(runs, patterns)


def heads_faithfulness(
    lm: str | LoadedModel,
    texts: str | Sequence[str],
    replacements: Mapping[object, Sequence[np.ndarray]],
    *,
    task: str | None = None,
) -> dict[Head, Faithfulness]:
    """Each head's faithfulness alone (``pattern_faithfulness`` of that head, the others left
    as they are), sharing the clean pass and each layer's uniform pass: what ``explain_heads``
    runs for every head. Same arguments and errors as ``pattern_faithfulness``."""
    lm = resolve_model(lm)
    heads = _heads_of(replacements)
    with lm.lock:
        runs, patterns = _runs(lm, texts, heads, task)
        return {h: _faithfulness(runs, {h: patterns[h]}) for h in sorted(patterns)}


def layer_faithfulness(
    lm: str | LoadedModel,
    texts: str | Sequence[str],
    replacements: Mapping[object, Sequence[np.ndarray]],
    *,
    task: str | None = None,
) -> dict[int, Faithfulness]:
    """Per layer, the faithfulness of every head given for it replaced at once (give all of a
    layer's heads to replace the whole layer: its own scale, see the module's docstring). Same
    arguments and errors as ``pattern_faithfulness``."""
    lm = resolve_model(lm)
    heads = _heads_of(replacements)
    with lm.lock:
        runs, patterns = _runs(lm, texts, heads, task)
        layers = sorted({layer for layer, _ in patterns})
        return {
            layer: _faithfulness(runs, {h: p for h, p in patterns.items() if h[0] == layer})
            for layer in layers
        }


def many_heads_faithfulness(
    lm: str | LoadedModel,
    texts: str | Sequence[str],
    replacements: Mapping[object, Sequence[np.ndarray]],
    scores: Mapping[object, float],
    *,
    share: float = 0.25,
    task: str | None = None,
) -> Faithfulness:
    """The best-explained ``share`` of the model's heads replaced by their programs at once
    (Hayes, Li and Andreas 2026 replace a quarter of the heads and report the loss's rise).

    Args:
        lm, texts, replacements, task: as ``pattern_faithfulness``; ``replacements`` holds a
            pattern list for at least the heads chosen.
        scores: how well each head is explained (its IoU, say); NaN scores are never chosen.
        share: the share of the model's heads (all layers' heads together) to replace: the
            ``round(share * heads)`` best by ``scores`` (at least 1), ties by head order.

    Raises:
        InputError: as ``pattern_faithfulness``; ``share`` outside (0, 1], or fewer scored
            heads with patterns than the share asks.
    """
    if not isinstance(share, int | float) or not 0 < share <= 1:
        raise InputError(f"share must be in (0, 1], got {share!r}.")
    lm = resolve_model(lm)
    heads = _heads_of(replacements)
    ranked = sorted(
        (
            (-float(s), h)
            for key, s in scores.items()
            if (h := parse_head(key)) in heads and s is not None and not math.isnan(float(s))
        )
    )
    with lm.lock:
        blocks = our_blocks(lm)
        total = len(blocks) * blocks[0].ours.num_heads
    count = max(1, round(share * total))
    if len(ranked) < count:
        raise InputError(
            f"{share:.0%} of {lm.display_name}'s {total} heads is {count}; only {len(ranked)} have "
            "both a score and patterns."
        )
    chosen = {h: heads[h] for _, h in ranked[:count]}
    with lm.lock:
        runs, patterns = _runs(lm, texts, chosen, task)
        return _faithfulness(runs, patterns)

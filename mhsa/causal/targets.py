"""What "the output" of a model means when heads are switched off: the targets of knock-outs,
head importance and pruning curves, and how one is measured through our module's head gates.

One registry (``TARGET_SPECS``, defined with every other metric in ``mhsa.causal.metrics`` and
re-exported here) says everything about a target: its names for people, whether it needs a
second sentence or a language-model head, and the functions that compute its raw value and its
change from the intact model. Code looks a target up there instead of branching on its name.
This module prepares the inputs a target scores and measures it through our module's gates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mhsa.causal.metrics import (
    TARGET_SPECS,
    TargetSpec,
    induction_scored,
    lm_loss,
    resolve_target,
    sentence_embedding,
    target_spec,
)
from mhsa.engine.encoding import Encoded, check_text, encode
from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.runs.batches import Entry, pad_inputs
from mhsa.engine.runs.generation import Generation, generation_encoded
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks, run_with_our_blocks, tile_rows
from mhsa.errors import InputError
from mhsa.heads import layer_name

__all__ = [
    "MASK_FRACTION",
    "MASK_SEED",
    "TARGET_SPECS",
    "EncodedEntry",
    "Head",
    "Item",
    "Measure",
    "TargetSpec",
    "batch_item",
    "block_names",
    "encode_entry",
    "gated_heads",
    "gates_rows",
    "mask_tokens",
    "prepare",
    "resolve_target",
    "sentence_embedding",
    "target_spec",
]

#: the masked-LM loss masks this share of a text's word tokens (as BERT was trained)
MASK_FRACTION = 0.15
#: the masked tokens are drawn from this seed: the same tokens on every run
MASK_SEED = 0

Head = tuple[int, int]


# --- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One text (or sentence pair), or a batch of them, encoded for a target."""

    encoded: Encoded  # the first sentence, as typed (its attention is what is shown)
    scored: tuple[dict[str, torch.Tensor], ...]  # what the target runs: 1 or 2 sentences
    labels: torch.Tensor | None  # lm-loss: [B, T], -100 where not scored
    stacked: dict[str, torch.Tensor] | None = None  # similarity: both sentences, one padded batch
    rows: int = 1  # B: sentences (or pairs) side by side, right-padded (a corpus batch)


@dataclass(frozen=True)
class EncodedEntry:
    """A text (or pair) checked and encoded for a target, before it joins an ``Item``.

    Attributes:
        first: the first sentence.
        second: the second sentence (targets that need a pair).
        masked: the masked-LM loss: the masked inputs and their labels.
        decoded: an encoder-decoder's loss: the inputs (the decoder's teacher-forced input,
            ``mhsa.engine.encoding.teacher_forced``) and the labels it is shifted from (the target's
            ids after the decoder start token).
    """

    first: Encoded
    second: Encoded | None = None
    masked: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None
    decoded: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None

    @property
    def length(self) -> int:
        """Tokens of its longer sentence (what it pads a batch to)."""
        n = self.first.inputs["input_ids"].shape[1]
        return max(n, self.second.inputs["input_ids"].shape[1]) if self.second else n


def mask_tokens(lm: LoadedModel, encoded: Encoded) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The masked-LM loss's inputs: a fixed, seeded ``MASK_FRACTION`` of the non-special tokens
    replaced by the mask token; and the labels (the original ids there, -100 elsewhere).

    Raises:
        InputError: the tokenizer has no mask token, or the text no word token.
    """
    ids = encoded.inputs["input_ids"]
    candidates = torch.tensor([i for i, sp in enumerate(encoded.tokens.special) if not sp])
    mask_id = getattr(lm.tokenizer, "mask_token_id", None)
    if mask_id is None or not len(candidates):
        raise InputError("The masked-LM loss needs a mask token and at least one word token.")
    count = max(1, round(MASK_FRACTION * len(candidates)))
    generator = torch.Generator().manual_seed(MASK_SEED)
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:count]]
    labels = torch.full_like(ids, -100)
    labels[0, chosen] = ids[0, chosen]
    masked = ids.clone()
    masked[0, chosen] = mask_id
    return {**encoded.inputs, "input_ids": masked}, labels


def encode_entry(
    lm: LoadedModel, entry: Entry, spec: TargetSpec, max_tokens: int | None
) -> EncodedEntry:
    """A text (or pair) checked and encoded for the target. Caller holds the lock.

    Raises:
        InputError: an empty text or second sentence, a text over the model's limit, or one the
            loss cannot score.
    """
    if lm.is_encoder_decoder and isinstance(entry.text, Generation):
        return _generated_target(lm, entry.text, max_tokens)
    if lm.is_encoder_decoder:
        target = None if entry.pair is None else check_text(entry.pair, "target text")
        first = encode(lm, check_text(entry.text), target, max_tokens)
        return EncodedEntry(first, decoded=_decoder_loss_inputs(lm, first))
    if isinstance(entry.text, Generation):  # the ids the model chose, not its text re-tokenized
        first = generation_encoded(lm, entry.text, max_tokens)
    else:
        first = encode(lm, check_text(entry.text), None, max_tokens)
    if spec.needs_pair:
        second = encode(lm, check_text(entry.pair, "second sentence"), None, max_tokens)
        return EncodedEntry(first, second=second)
    if spec.needs_lm_head and lm.lm_head == "masked":
        return EncodedEntry(first, masked=mask_tokens(lm, first))
    if spec.needs_lm_head and first.inputs["input_ids"].shape[1] < 2:
        raise InputError("The next-token loss needs a text of at least two tokens.")
    if spec.repeats_only and not induction_scored(first.inputs["input_ids"]).any():
        raise InputError(
            "The loss on the repeat needs a text that repeats itself (a token seen before, "
            "followed again by the same token), such as a sequence written twice."
        )
    return EncodedEntry(first)


def _causal_labels(spec: TargetSpec, ids: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """A causal LM's labels: the ids, -100 on padding and, for ``repeats_only`` targets, on every
    token an induction head cannot predict (``induction_scored``)."""
    labels = ids.masked_fill(padding, -100)
    if spec.repeats_only:
        labels = labels.masked_fill(~induction_scored(ids).to(ids.device), -100)
    return labels


def _decoder_loss_inputs(
    lm: LoadedModel, encoded: Encoded
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """An encoder-decoder's loss inputs: the inputs as encoded (the decoder's already the
    teacher-forced input, ``mhsa.engine.encoding.teacher_forced``: what ``attend`` shows), and the
    labels it was shifted from, as the model's ``labels=`` argument would."""
    if encoded.decoder_labels is None:
        raise InputError("The decoder's loss needs a target text.")
    return dict(encoded.inputs), encoded.decoder_labels.clone()


def _generated_target(
    lm: LoadedModel, generation: Generation, max_tokens: int | None
) -> EncodedEntry:
    """An encoder-decoder's loss of the target it wrote, over exactly the ids it chose (the
    decoder's tokens as ``attend_generated`` shows them, its start token first): labels are
    the ids after the start token, the decoder's inputs the ids before the last one, as
    teacher forcing reads a target written after the start token.

    Raises:
        InputError: a generation of another model, or one that wrote nothing.
    """
    first = generation_encoded(lm, generation, max_tokens)
    ids = first.inputs["decoder_input_ids"]
    if ids.shape[1] < 2:
        raise InputError("The decoder's loss needs at least one generated token: generate more.")
    inputs = {**first.inputs, "decoder_input_ids": ids[:, :-1]}
    return EncodedEntry(first, decoded=(inputs, ids[:, 1:].clone()))


def _stack(
    first: dict[str, torch.Tensor], second: dict[str, torch.Tensor], pad: int
) -> dict[str, torch.Tensor]:
    """Two encoded sentences as one right-padded batch of two (the attention mask hides the
    padding from every attention and from the pooling)."""
    n = max(first["input_ids"].shape[1], second["input_ids"].shape[1])
    out = {}
    for key in first.keys() & second.keys():
        fill = pad if key == "input_ids" else 0
        rows = [F.pad(x[key], (0, n - x[key].shape[1]), value=fill) for x in (first, second)]
        out[key] = torch.cat(rows)
    return out


def prepare(lm: LoadedModel, entry: Entry, spec: TargetSpec, max_tokens: int | None) -> Item:
    """One text (or pair) as an item of its own, unpadded. Caller holds the lock."""
    encoded = encode_entry(lm, entry, spec, max_tokens)
    first = encoded.first
    if encoded.second is not None:
        pad = getattr(lm.tokenizer, "pad_token_id", None)
        stacked = None
        if pad is not None and "attention_mask" in first.inputs:
            stacked = _stack(first.inputs, encoded.second.inputs, pad)
        return Item(first, (first.inputs, encoded.second.inputs), None, stacked)
    if not spec.needs_lm_head:
        return Item(first, (first.inputs,), None)
    for loss_inputs in (encoded.masked, encoded.decoded):
        if loss_inputs is not None:
            return Item(first, (loss_inputs[0],), loss_inputs[1])
    ids = first.inputs["input_ids"]
    return Item(first, (first.inputs,), _causal_labels(spec, ids, torch.zeros_like(ids).bool()))


def _pad_labels(labels: Sequence[torch.Tensor], n: int) -> torch.Tensor:
    return torch.cat([F.pad(x, (0, n - x.shape[1]), value=-100) for x in labels])


def batch_item(lm: LoadedModel, group: Sequence[EncodedEntry], spec: TargetSpec) -> Item:
    """Several encoded entries as one right-padded batch (rows = entries); encoder-decoders:
    one entry (its encoder's and decoder's lengths differ)."""
    if lm.is_encoder_decoder:
        if len(group) != 1 or group[0].decoded is None:
            raise ValueError("encoder-decoder models run one entry at a time")
        inputs, labels = group[0].decoded
        return Item(group[0].first, (inputs,), labels)
    firsts = pad_inputs(lm, [e.first.inputs for e in group])
    rows = len(group)
    shown = group[0].first
    if spec.needs_pair:
        seconds = pad_inputs(lm, [e.second.inputs for e in group if e.second is not None])
        return Item(shown, (firsts, seconds), None, None, rows)
    if not spec.needs_lm_head:
        return Item(shown, (firsts,), None, None, rows)
    n = firsts["input_ids"].shape[1]
    if lm.lm_head == "masked":
        masked = [e.masked for e in group if e.masked is not None]
        inputs = pad_inputs(lm, [m[0] for m in masked])
        return Item(shown, (inputs,), _pad_labels([m[1] for m in masked], n), None, rows)
    labels = _causal_labels(spec, firsts["input_ids"], firsts["attention_mask"] == 0)
    return Item(shown, (firsts,), labels, None, rows)


# --- measuring ----------------------------------------------------------------------------------


def _copies(inputs: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """A batch of one sentence as ``rows`` copies of it (row r: gates row r)."""
    if rows == 1:
        return inputs
    return {k: v.repeat(rows, *[1] * (v.dim() - 1)) for k, v in inputs.items()}


def block_names(blocks: Sequence[OurBlock]) -> list[str]:
    """How head labels name each block's attention: ``L{layer}``; encoder-decoders
    ``E{layer}``, ``D{layer}``, ``C{layer}`` (``mhsa.heads.layer_name``)."""
    return [layer_name(b.kind, b.index) for b in blocks]


def gated_heads(blocks: Sequence[OurBlock]) -> int:
    """The heads of every block, which gates address.

    Raises:
        InputError: the blocks have different numbers of heads.
    """
    heads = {b.ours.num_heads for b in blocks}
    if len(heads) != 1:
        raise InputError(
            f"Head gates need the same number of heads in every attention block; this model "
            f"has {sorted(heads)}."
        )
    return heads.pop()


def gates_rows(
    configs: Sequence[Sequence[Head]], layers: int, heads: int, device: torch.device
) -> dict[int, torch.Tensor]:
    """One row of gates per configuration of heads switched off; only layers that switch
    something off get gates."""
    table = torch.ones(len(configs), layers, heads, device=device)
    for r, off in enumerate(configs):
        for layer, head in off:
            table[r, layer, head] = 0.0
    touched = sorted({layer for off in configs for layer, _ in off})
    if len(configs) == 1:
        return {layer: table[0, layer] for layer in touched}
    return {layer: table[:, layer] for layer in touched}


class Measure:
    """Runs an item through our modules with gates and measures the target, per row. Caller
    holds the lock."""

    def __init__(self, lm: LoadedModel, spec: TargetSpec) -> None:
        self.lm = lm
        self.spec = spec
        self.blocks: list[OurBlock] = our_blocks(lm, None)
        self.layers, self.heads = len(self.blocks), gated_heads(self.blocks)
        #: how head labels name each block's attention ("L3"; "E0", "D0", "C0")
        self.names = block_names(self.blocks)
        #: encoder-decoders: copies of a batch run as copies of the inputs (the encoder's and
        #: the decoder's batches must agree), never as a fan-out from a layer
        self.whole_copies = lm.is_encoder_decoder

    def raw(
        self,
        item: Item,
        gates: dict[int, torch.Tensor],
        *,
        rows: int = 1,
        layer: int = 0,
        replay: Sequence[dict[int, Any]] | None = None,
        record: Sequence[dict[int, Any]] | None = None,
    ) -> torch.Tensor:
        """The target's raw value per row: the embedding ``[rows, D]`` (``embedding``), the
        cosine similarity ``[rows]`` or the loss ``[rows]``. Rows fan out at ``layer``; the
        layers below it are replayed from ``replay`` (one record per scored sentence)."""
        if item.stacked is not None and rows == 1 and not replay and record is None:
            # a pair without fan-out (gradient, a single knock-out): one batch of two
            run = OurPass(gates=gates, need_weights=False)
            outputs = run_with_our_blocks(self.lm, self.blocks, run, item.stacked)
            pooled = sentence_embedding(outputs, item.stacked)
            return self.spec.raw((pooled[:1], pooled[1:]))
        readouts = []
        for s, inputs in enumerate(item.scored):
            if self.whole_copies:
                run = OurPass(gates=gates, need_weights=False)
                readouts.append(self._readout(item, run, _copies(inputs, rows)))
                continue
            run = OurPass(
                gates=gates,
                need_weights=False,
                fan_out=(layer, rows) if rows > 1 else None,
                replay={k: v for k, v in (replay[s] if replay else {}).items() if k < layer},
                record=record[s] if record is not None else None,
            )
            readouts.append(self._readout(item, run, inputs))
        return self.spec.raw(readouts)

    def _readout(self, item: Item, run: OurPass, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """One scored sentence's run: its loss ``[rows]`` (``needs_lm_head``), else its
        embedding ``[rows, D]``."""
        with_head = self.spec.needs_lm_head
        outputs = run_with_our_blocks(self.lm, self.blocks, run, inputs, with_head=with_head)
        if with_head:
            if item.labels is None:
                raise ValueError("A loss target's item has no labels.")
            return lm_loss(self.lm, outputs.logits, item.labels)
        return sentence_embedding(outputs, inputs)

    def change(self, raw: torch.Tensor, intact: torch.Tensor) -> torch.Tensor:
        """``[rows]``: the target's change from the intact model (``TARGET_SPECS``)."""
        return self.spec.change(raw, tile_rows(intact, raw.shape[0]))

    def value(self, raw: torch.Tensor, intact: torch.Tensor) -> torch.Tensor:
        """``[rows]``: the target's value for people (what a pruning curve plots): the
        embedding's change, else the raw value."""
        return self.change(raw, intact) if self.spec.value_is_change else raw

    def gates(self, off: Iterable[Head], rows: int = 1) -> dict[int, torch.Tensor]:
        """Per layer ``[H]`` gates (``rows`` > 1: ``[rows, H]``), 0 for the heads in ``off``."""
        return gates_rows([list(off)] * rows, self.layers, self.heads, self.lm.device)

"""What "the output" of a model is, and how a run of it is measured: the one definition every
analysis reads (knock-outs, head importance and pruning in ``mhsa.causal.targets``; activation and
attribution patching in ``mhsa.causal.patching``; direct logit attribution and the logit lens in
``mhsa.causal.attribution``; circuits).

- Causal language models: the **logit difference** ``logit(answer) - logit(wrong)`` at the last
  position (Wang et al. 2022, "Interpretability in the Wild", the IOI metric;
  TransformerLens's ``logits_to_ave_logit_diff`` in its demos), with ``answer`` and ``wrong``
  words that are each one token after a space (``answer_tokens``); and the language-model loss
  (``lm_loss``, cross-entropy of the next token, or of the masked tokens for masked LMs);
  the **repeat loss**, the same cross-entropy over only the tokens an induction head can
  predict (``induction_scored``: Olsson et al. 2022's loss on the repeated tokens).
- Encoders: the **sentence embedding**, the attention-mask-weighted mean of the last hidden
  state (as sentence-transformers pool all-MiniLM-L6-v2), compared by cosine with a reference
  (the intact run, the clean run, or a second sentence).

The importance targets (``TARGET_SPECS``: the change of one of these when heads are switched
off) and the patching targets (``PATCH_TARGETS``, ``PatchMetric``) are records over the
same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mhsa.engine.encoding import answer_ids
from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.models.names import toy_task
from mhsa.engine.runs.swap import OurBlock, OurPass, run_with_our_blocks, tile_rows
from mhsa.errors import InputError
from mhsa.registry import lookup

__all__ = [
    "PATCH_TARGETS",
    "REPEAT_TASKS",
    "TARGET_SPECS",
    "PatchMetric",
    "TargetSpec",
    "answer_direction",
    "answer_tokens",
    "default_target",
    "embedding_of",
    "induction_scored",
    "lm_loss",
    "logit_difference",
    "patch_metric",
    "resolve_target",
    "sentence_embedding",
    "target_spec",
    "widened",
]


# --- the measures -----------------------------------------------------------------------------


def widened(x: torch.Tensor) -> torch.Tensor:
    """16-bit values in float32 for a metric's sums; float32 and float64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def answer_tokens(lm: LoadedModel, answer: str, wrong: str) -> tuple[int, int]:
    """The token ids of ``answer`` and ``wrong``: each a word that, after a space, is exactly one
    token of ``lm``'s tokenizer (as it would follow the text); ``encoding.answer_ids`` under the
    model's lock.

    Raises:
        InputError: a word is empty, is more than one token (the message names the tokens), is
            the unknown token, or both are the same token.
    """
    with lm.lock:
        a, w, _, _ = answer_ids(lm, answer, wrong)
    return a, w


def logit_difference(
    logits: torch.Tensor, answer: int, wrong: int, *, position: int | None = -1
) -> torch.Tensor:
    """``logit(answer) - logit(wrong)`` in float32 (the IOI logit difference).

    Args:
        logits: ``[..., T, V]``.
        answer: the answer's token id.
        wrong: the competing token's id.
        position: the position read (default the last); None: every position.

    Returns:
        ``[...]`` (``[..., T]`` with ``position=None``).
    """
    at = logits if position is None else logits[..., position, :]
    return at[..., answer].float() - at[..., wrong].float()


def answer_direction(unembed_weight: torch.Tensor, answer: int, wrong: int) -> torch.Tensor:
    """``W_U[answer] - W_U[wrong]`` ``[D]`` in float32: the residual direction whose product with
    the (normed) final residual is the logit difference (TransformerLens's
    ``tokens_to_residual_directions`` of the two answers, subtracted)."""
    weight = unembed_weight.float()  # (V, D), as nn.Linear and the embeddings store it
    return weight[answer] - weight[wrong]


def sentence_embedding(outputs: Any, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Attention-mask-weighted mean of the last hidden state, ``[rows, D]`` (how
    sentence-transformers pool MiniLM): the sentence embedding every target reads."""
    hidden = widened(outputs.last_hidden_state)
    mask = inputs.get("attention_mask", torch.ones(hidden.shape[:2], dtype=torch.long))
    mask = tile_rows(mask, hidden.shape[0])
    weight = mask.to(hidden.device, hidden.dtype)[..., None]  # (1 or rows, T, 1)
    return (hidden * weight).sum(1) / weight.sum(1)


def embedding_of(
    lm: LoadedModel, blocks: list[OurBlock], inputs: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """``[D]``: the sentence embedding of one encoded text run through our ``blocks`` (the
    reference of patching's and circuits' encoder targets). Caller holds the lock."""
    with torch.inference_mode():
        outputs = run_with_our_blocks(lm, blocks, OurPass(need_weights=False), inputs)
        return sentence_embedding(outputs, inputs)[0]


def lm_loss(lm: LoadedModel, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per row, ``[rows]`` (causal: next token; masked: the masked tokens;
    labels -100 are not scored, as transformers' ``labels=``)."""
    labels = labels.to(logits.device)
    if lm.lm_head == "causal":
        logits, labels = logits[:, :-1], labels[:, 1:]
    rows, t, vocab = logits.shape
    labels = tile_rows(labels, rows).expand(rows, t)
    per_token = F.cross_entropy(
        widened(logits).reshape(-1, vocab), labels.reshape(-1), reduction="none"
    ).view(rows, t)
    scored = (labels != -100).to(per_token.dtype)
    return (per_token * scored).sum(1) / scored.sum(1)


def induction_scored(input_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: the next-token labels an induction head can predict, for causal LMs'
    ``lm_loss`` (label ``k`` is the token predicted at position ``k - 1``).

    Label ``k`` counts when the token before it, ``x[k-1]``, occurred earlier at some ``j < k-1``
    and ``x[j+1] == x[k]``: "``[A][B] ... [A]`` -> ``[B]``", the prefix-matching and copying of
    Olsson et al. 2022 ("In-context Learning and Induction Heads"), whose in-context loss is
    measured on the repeated tokens. On a random sequence followed by itself these are the
    repeat's tokens after its first (the first cannot be foreseen); the random first half
    counts for nothing.
    """
    ids = input_ids.tolist()
    scored = torch.zeros(input_ids.shape, dtype=torch.bool)
    for row, seq in enumerate(ids):
        seen: dict[int, set[int]] = {}  # token -> the tokens that followed it so far
        for k in range(1, len(seq)):
            scored[row, k] = seq[k] in seen.get(seq[k - 1], ())
            seen.setdefault(seq[k - 1], set()).add(seq[k])
    return scored


# --- importance targets: the change of a measure when heads are switched off -----------------


def _similarity(readouts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The cosine similarity of the two sentences' embeddings, ``[rows]``."""
    return F.cosine_similarity(readouts[0], readouts[1], dim=-1)


def _first(readouts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The first (only) sentence's readout as it is: its embedding or its loss."""
    return readouts[0]


def _embedding_distance(raw: torch.Tensor, intact: torch.Tensor) -> torch.Tensor:
    return 1.0 - F.cosine_similarity(raw, intact.expand_as(raw), dim=-1)


def _absolute_difference(raw: torch.Tensor, intact: torch.Tensor) -> torch.Tensor:
    return (raw - intact).abs()


def _difference(raw: torch.Tensor, intact: torch.Tensor) -> torch.Tensor:
    return raw - intact


@dataclass(frozen=True)
class TargetSpec:
    """One target: what a knock-out's change measures, and how.

    Attributes:
        name: what ``ablate(target=...)``, the command line and links take.
        label: its short name for people (pickers, legends).
        description: what the change measures, for people.
        metric: what a pruning curve's metric is under this target.
        needs_pair: it compares two sentences (every item is a ``(sentence, sentence)`` pair).
        needs_lm_head: it reads the language-model head's loss (else the sentence embedding).
        raw: the raw value per row from each scored sentence's readout (its embedding
            ``[rows, D]``, or with ``needs_lm_head`` its loss ``[rows]``).
        change: ``change(raw, intact)``, ``[rows]``: the value's change from the intact model.
        value_is_change: the raw value is a vector (the embedding), so the value people see is
            its change from the intact model (0 for the intact model itself).
        no_gradient: why the gradient of this target says nothing about the heads; empty when
            it does.
        encoder_decoder: it measures encoder-decoder models too (their output is the decoder's:
            no sentence embedding of the text).
        repeats_only: the loss counts only the tokens an induction head can predict
            (``induction_scored``; causal language models).
    """

    name: str
    label: str
    description: str
    metric: str
    needs_pair: bool
    needs_lm_head: bool
    raw: Callable[[Sequence[torch.Tensor]], torch.Tensor]
    change: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    value_is_change: bool = False
    no_gradient: str = ""
    encoder_decoder: bool = False
    repeats_only: bool = False


#: Every target, by name, in the order pickers and the command line list them.
TARGET_SPECS: Mapping[str, TargetSpec] = {
    spec.name: spec
    for spec in (
        TargetSpec(
            "embedding",
            label="sentence embedding",
            description="1 - cosine between the sentence embedding (the attention-mask-weighted "
            "mean of the last hidden state, as sentence-transformers pool MiniLM) of the intact "
            "and of the changed model",
            metric="1 − cos(embedding, intact embedding)",
            needs_pair=False,
            needs_lm_head=False,
            raw=_first,
            change=_embedding_distance,
            value_is_change=True,
            no_gradient="The gradient of the embedding distance is zero at the intact model (1 - "
            "cosine is at its minimum when nothing changed), so it says nothing about the heads: "
            "use method='ablation' for this target, or a target with a slope ('similarity' with "
            "sentence pairs, 'lm-loss' for a model with a language-model head).",
        ),
        TargetSpec(
            "similarity",
            label="similarity of two sentences",
            description="how far the cosine similarity of two sentences' embeddings moves: "
            "|cos(changed) - cos(intact)| (the task all-MiniLM-L6-v2 was trained for)",
            metric="cosine similarity of the two sentences",
            needs_pair=True,
            needs_lm_head=False,
            raw=_similarity,
            change=_absolute_difference,
        ),
        TargetSpec(
            "lm-loss",
            label="language-model loss",
            description="the change of the model's own language-model loss (cross-entropy; "
            "causal LMs: next token; masked LMs: a fixed, seeded 15% of the tokens masked; "
            "encoder-decoders: the decoder's loss of the target text, the second text or the "
            "text itself, given the text): loss(changed) - loss(intact)",
            metric="language-model loss",
            needs_pair=False,
            needs_lm_head=True,
            raw=_first,
            change=_difference,
            encoder_decoder=True,
        ),
        TargetSpec(
            "repeat-loss",
            label="loss on the repeat",
            description="the change of the next-token loss over only the tokens an induction "
            "head can predict (a token whose previous token came earlier, followed then by this "
            "same token: the repeated half of a repeated sequence after its first token; Olsson "
            "et al. 2022): loss(changed) - loss(intact); causal language models",
            metric="loss on the repeated tokens",
            needs_pair=False,
            needs_lm_head=True,
            raw=_first,
            change=_difference,
            repeats_only=True,
        ),
    )
}


def target_spec(name: str) -> TargetSpec:
    """The target called ``name``.

    Raises:
        InputError: there is no such target; the message lists them.
    """
    return lookup(TARGET_SPECS, name, "target")


#: the shipped toy tasks whose scored positions are a repeat's (``TaskSpec.scored``: "the
#: repeated half"): their models' automatic target is the loss on the repeat
REPEAT_TASKS = frozenset({"induction", "induction-long"})


def default_target(lm: LoadedModel, pair: bool = False) -> str:
    """The target ``resolve_target`` takes when none is asked (see there)."""
    if toy_task(lm.name) in REPEAT_TASKS and lm.lm_head == "causal" and not pair:
        return "repeat-loss"
    return "lm-loss" if lm.lm_head else "similarity" if pair else "embedding"


def resolve_target(lm: LoadedModel, target: str | None, pair: bool) -> TargetSpec:
    """The target asked for, or by default: for a toy model trained on a repeat
    (``toy:induction``, ``toy:induction-long``) the loss on the repeat, the positions its task
    scores (the random first half cannot be predicted by any head: a loss over it makes every
    head look harmful); else the language-model loss when the checkpoint has a head for it, the
    similarity with a second sentence, else the embedding.

    Raises:
        InputError: an unknown target, or one the model or the input cannot measure.
    """
    if target is None:
        target = default_target(lm, pair)
    spec = target_spec(target)
    if spec.needs_lm_head and not lm.lm_head:
        archs = ", ".join(getattr(lm.config, "architectures", None) or ["none listed"])
        raise InputError(
            f"{lm.display_name} has no language-model head in its checkpoint (architectures: "
            f"{archs}), so it has no loss to measure: use the target 'embedding' (or "
            f"'similarity' with a second sentence)."
        )
    if lm.is_encoder_decoder and not spec.encoder_decoder:
        raise InputError(
            f"{lm.display_name} is an encoder-decoder model: its knock-outs are measured by the "
            f"decoder's language-model loss (target 'lm-loss'), not by {spec.name!r}."
        )
    if spec.needs_pair and not pair:
        raise InputError(f"The target {spec.name!r} needs a second sentence to compare with.")
    if spec.repeats_only and lm.lm_head != "causal":
        raise InputError(
            f"The target {spec.name!r} scores next-token predictions: {lm.display_name} is not a "
            "causal language model (use 'lm-loss')."
        )
    return spec


# --- patching: one number per run, compared between clean, corrupted and patched runs ---------

#: What patching measures for models without a next-token head (encoders), by name.
PATCH_TARGETS: Mapping[str, str] = {
    "embedding": "cosine similarity of the run's sentence embedding to the clean run's (1 for "
    "the clean run)",
    "similarity": "cosine similarity of the run's sentence embedding to that of the second "
    "sentence",
}


@dataclass(frozen=True)
class PatchMetric:
    """What patching measures on a run's outputs: the logit difference at the last position
    (causal LMs) or the cosine similarity of the sentence embedding to a reference (encoders).

    Attributes:
        description: what it is, for people (tables' ``attrs["metric"]``).
        with_head: it reads the next-token logits (the run needs the language-model head).
        answer: the answer's token id (``with_head``).
        wrong: the competing token's id (``with_head``).
        reference: encoders: the embedding ``[D]`` compared with (``with_reference``).
    """

    description: str
    with_head: bool
    answer: int = -1
    wrong: int = -1
    reference: torch.Tensor | None = None

    def __call__(self, outputs: Any, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``[rows]``: the metric of each row of a run."""
        if self.with_head:
            return logit_difference(outputs.logits, self.answer, self.wrong)
        if self.reference is None:
            raise ValueError("An embedding metric needs its reference: use with_reference.")
        pooled = sentence_embedding(outputs, inputs).float()  # (rows, D)
        return F.cosine_similarity(pooled, self.reference[None], dim=-1)

    def with_reference(self, reference: torch.Tensor) -> PatchMetric:
        """The embedding metric comparing with ``reference`` ``[D]``."""
        return PatchMetric(self.description, False, reference=reference.detach().float())


def _logit_metric(lm: LoadedModel, answer: object, wrong: object) -> PatchMetric:
    if answer is None or wrong is None:
        raise InputError(
            f"{lm.display_name} is a causal language model: give both answer= and wrong= (the "
            "metric is logit(answer) - logit(wrong) at the last position), or target='embedding'."
        )
    a, w, a_text, w_text = answer_ids(lm, answer, wrong)
    return PatchMetric(f"logit({a_text!r}) − logit({w_text!r}) at the last position", True, a, w)


def patch_metric(
    lm: LoadedModel, answer: object, wrong: object, target: str | None, text_pair: str | None
) -> PatchMetric:
    """The patching metric asked for (see ``mhsa.causal.patching.patch_heads``): the logit
    difference
    for causal LMs, else ``PATCH_TARGETS[target]`` (its reference filled in by the caller).
    Caller holds the lock.

    Raises:
        InputError: with what to give instead.
    """
    if answer is not None or wrong is not None:
        if lm.lm_head != "causal":
            raise InputError(
                f"answer= and wrong= are for causal language models (a next-token head); "
                f"{lm.display_name} has none: leave them out and use target='embedding' or "
                f"'similarity'."
            )
        if target is not None:
            raise InputError("Give either answer= and wrong= or target=, not both.")
        return _logit_metric(lm, answer, wrong)
    if target is None and lm.lm_head == "causal":
        return _logit_metric(lm, None, None)
    name = target or "embedding"
    description = lookup(PATCH_TARGETS, name, "patching target")
    if name == "similarity" and text_pair is None:
        raise InputError("The target 'similarity' needs text_pair= (the sentence compared with).")
    if name == "embedding" and text_pair is not None:
        raise InputError("text_pair= is for target='similarity'.")
    return PatchMetric(description, False)

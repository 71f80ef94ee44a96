"""The clean / corrupted pair of a circuit analysis, checked, encoded and run once (``run_pair``:
every source's activation on each text, the metric of each and, for EAP, the clean run's
gradient at every target input from the same pass), with its metric: logit(answer) -
logit(wrong) for causal LMs, patching's embedding targets for encoders
(``mhsa.causal.metrics.PATCH_TARGETS``); ``mhsa.circuits`` scores edges and circuits from it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mhsa.causal.metrics import embedding_of, logit_difference, patch_metric
from mhsa.circuits.graph import CircuitGraph
from mhsa.circuits.postnorm import PostNormModel, embedding_metric, pooled
from mhsa.circuits.runs import CircuitModel, CircuitRun, circuit_model, run_circuit
from mhsa.engine.encoding import answer_ids, check_text, encode, encode_clean_corrupted
from mhsa.engine.models.loading import LoadedModel
from mhsa.errors import InputError

__all__ = ["EAP_ONE_PASS_MAX", "CircuitPair", "circuit_pair", "probe_gradients", "run_pair"]


def circuit_pair(
    lm: LoadedModel,
    clean: object,
    corrupted: object,
    answer: object,
    wrong: object,
    max_tokens,
    gradient: bool = False,
    target: str | None = None,
    text_pair: str | None = None,
    method: str = "",
) -> CircuitPair:
    """The pair checked, encoded and run once (clean and corrupted side by side; ``gradient``:
    with the clean run's gradients at every target input, see ``run_pair``; only below
    ``EAP_ONE_PASS_MAX``); lock held.

    Raises:
        UnsupportedModelError: see ``circuit_model``.
        InputError: answer/wrong and target/text_pair as for patching; texts of different token
            counts (both token lists named); texts that give the same metric; method "eap"
            with an encoder's target "embedding".
    """
    wired = circuit_model(lm)
    if isinstance(wired, PostNormModel):
        return _encoder_pair(
            wired, clean, corrupted, answer, wrong, max_tokens, gradient, target, text_pair, method
        )
    if target is not None or text_pair is not None:
        raise InputError(
            f"{lm.display_name} is a causal language model: its metric is logit(answer) - "
            "logit(wrong) (answer= and wrong=); target= and text_pair= are for encoders."
        )
    if answer is None or wrong is None:
        raise InputError(
            f"{lm.display_name} is a causal language model: give both answer= and wrong= (the "
            "metric is logit(answer) - logit(wrong) at the last position)."
        )
    a, w, a_text, w_text = answer_ids(lm, answer, wrong)
    clean_enc, corrupted_enc = encode_clean_corrupted(
        lm, clean, corrupted, max_tokens, "an edge carries a source's activation"
    )
    metric = f"logit({a_text!r}) − logit({w_text!r}) at the last position"
    tokens = (list(clean_enc.tokens.strings), list(corrupted_enc.tokens.strings))
    n_clean = clean_enc.inputs["input_ids"].shape[1]
    gradient = gradient and n_clean * _parameters(lm) <= EAP_ONE_PASS_MAX
    return run_pair(wired, clean_enc.inputs, corrupted_enc.inputs, a, w, metric, tokens, gradient)


def _encoder_pair(
    wired: PostNormModel,
    clean: object,
    corrupted: object,
    answer: object,
    wrong: object,
    max_tokens,
    gradient: bool,
    target: str | None,
    text_pair: str | None,
    method: str,
) -> CircuitPair:
    """``_pair`` of an encoder: patching's metric (``patch_metric``) on the sentence embedding."""
    lm = wired.lm
    metric = patch_metric(lm, answer, wrong, target, text_pair)
    name = target or "embedding"
    if method == "eap" and name == "embedding":
        raise InputError(
            "The target 'embedding' has a zero gradient at the clean run (the cosine with the "
            "clean run's own embedding is at its maximum there), so EAP would score every edge "
            "0: use method='eap-ig' or 'exact', or the target 'similarity' with text_pair=."
        )
    clean_enc, corrupted_enc = encode_clean_corrupted(
        lm, clean, corrupted, max_tokens, "an edge carries a source's activation"
    )
    reference = None
    if text_pair is not None:
        pair_inputs = encode(lm, check_text(text_pair, "second sentence"), None, max_tokens).inputs
        # a normal tensor (not an inference one): the gradient runs save it
        reference = embedding_of(lm, wired.blocks, pair_inputs).clone()
    tokens = (list(clean_enc.tokens.strings), list(corrupted_enc.tokens.strings))
    return run_pair(
        wired,
        clean_enc.inputs,
        corrupted_enc.inputs,
        -1,
        -1,
        metric.description,
        tokens,
        gradient,  # an encoder's clean row runs apart with the probe (``run_pair``)
        reference,
    )


#: EAP takes its gradient from the pair's own pass (two rows forward and backward) when the
#: model's parameters times the tokens are at most this; above, the fixed per-call costs no
#: longer dominate and a separate forward and backward of the clean row alone is cheaper
#: (BENCHMARKS.md §17: 3.2x against 3.4x a forward+backward at GPT-2 small's size)
EAP_ONE_PASS_MAX = 10**8


def _parameters(lm: LoadedModel) -> int:
    if "parameter-count" not in lm.cache:
        lm.cache["parameter-count"] = sum(p.numel() for p in lm.model.parameters())
    return lm.cache["parameter-count"]


# --- a clean / corrupted pair, run once --------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CircuitPair:
    """Both texts encoded for a wired model, the metric's tokens, and both runs' activations."""

    wired: CircuitModel | PostNormModel
    graph: CircuitGraph
    clean: dict[str, torch.Tensor]  # the clean text's inputs (batch 1)
    tokens: tuple[list[str], list[str]]  # the two texts' tokens
    answer: int
    wrong: int
    metric: str
    acts_clean: torch.Tensor  # (sources, T, D)
    acts_corrupted: torch.Tensor  # (sources, T, D)
    m_clean: float
    m_corrupted: float
    #: ``[targets, T, D]`` dm/d(each target input) at the clean run, when the pair's run kept it
    #: (an encoder: at each probe of ``mhsa.circuits.postnorm.probe_layout``)
    grads: torch.Tensor | None = None
    #: encoders: the sentence embedding ``[D]`` the metric compares with (cosine)
    reference: torch.Tensor | None = None

    def ids(self, rows: int) -> dict[str, torch.Tensor]:
        """The clean text's inputs, ``rows`` times."""
        return {k: v.expand(rows, -1) for k, v in self.clean.items()}

    def measure(self, logits: torch.Tensor) -> torch.Tensor:
        """``[rows]``: logit(answer) - logit(wrong) at the last position (the metric module's
        ``logit_difference``, patching's metric); an encoder: the cosine of the sentence
        embedding of ``logits`` (its last hidden state) with the reference."""
        return _measure(logits, self.answer, self.wrong, self.reference, self.clean)

    def attrs(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "clean": self.m_clean,
            "corrupted": self.m_corrupted,
            "clean_tokens": self.tokens[0],
            "corrupted_tokens": self.tokens[1],
            "model": self.wired.lm.display_name,
            "layers": self.graph.layers,
            "heads": self.graph.heads,
        }

    def corrupted_runs(self, corrupt: np.ndarray) -> np.ndarray:
        """``[rows]`` m of the clean text with each row's edges (``corrupt [rows, sources,
        targets]``) carrying the corrupted activations. Inference mode, lock held."""
        run = CircuitRun(
            self.graph.upstream,
            corrupt=torch.as_tensor(corrupt, device=self.acts_clean.device),
            corrupted=self.acts_corrupted,
        )
        logits = run_circuit(self.wired, run, self.ids(len(corrupt)))
        return self.measure(logits).double().cpu().numpy()


def run_pair(
    wired: CircuitModel,
    clean: dict[str, torch.Tensor],
    corrupted: dict[str, torch.Tensor],
    answer: int,
    wrong: int,
    metric: str,
    tokens: tuple[list[str], list[str]],
    gradient: bool = False,
    reference: torch.Tensor | None = None,
) -> CircuitPair:
    """Both inputs run side by side once (every source's activation, m of each); lock held.

    An encoder's metric is the cosine of the sentence embedding with ``reference`` ([D], the
    target "similarity"), or with the clean run's own (None: the target "embedding").

    ``gradient``: the same pass also carries EAP's probe (a zero added to every target input)
    and one backward gives dm_clean/d(each target input), so EAP costs one forward of two rows
    and one backward instead of a forward of two rows, one of one row and a backward. The rows
    do not mix (same length, no padding), so the corrupted row adds nothing to the clean row's
    gradient. An encoder's rows run apart (only the clean one carries every target's copy, with
    the probe), and need ``reference``.

    Raises:
        InputError: the two give the same metric.
    """
    graph = wired.graph
    both = {k: torch.cat([clean[k], corrupted[k]]) for k in clean.keys() & corrupted.keys()}
    run = CircuitRun(graph.upstream, probe=gradient)
    encoder = isinstance(wired, PostNormModel)
    if gradient and encoder:  # the rows apart: only the clean one carries every target's copy
        plain = CircuitRun(graph.upstream)
        with torch.inference_mode():
            other = _measure(run_circuit(wired, plain, corrupted), -1, -1, reference, clean)
        with torch.inference_mode(False), torch.enable_grad():
            clean_value = _measure(run_circuit(wired, run, clean), -1, -1, reference, clean)[0]
        values = torch.stack([clean_value.detach(), other[0]])
        run.acts = [torch.cat([a.detach(), b]) for a, b in zip(run.acts, plain.acts, strict=True)]
    elif gradient:
        with torch.inference_mode(False), torch.enable_grad():
            logits = run_circuit(wired, run, both)
            if encoder and reference is None:
                reference = _pooled(logits[:1], clean)
            values = _measure(logits, answer, wrong, reference, clean)
            clean_value = values[0]
    else:
        with torch.inference_mode():
            logits = run_circuit(wired, run, both)
        if encoder and reference is None:
            reference = _pooled(logits[:1], clean)
        values = _measure(logits, answer, wrong, reference, clean)
    m_clean, m_corrupted = (float(v) for v in values.detach())
    if abs(m_clean - m_corrupted) <= 1e-6 * max(1.0, abs(m_clean)):
        raise InputError(
            f"The clean and the corrupted text give the same metric ({m_clean:.6g}), so no "
            "edge carries a difference: change the corrupted text where it matters for the "
            "answer."
        )
    grads = probe_gradients(clean_value, run.zeros, 0) if gradient else None
    acts = torch.stack([a.detach() for a in run.acts], dim=1)  # (2, sources, T, D)
    ms = (m_clean, m_corrupted)
    return CircuitPair(
        wired, graph, clean, tokens, answer, wrong, metric, acts[0], acts[1], *ms, grads, reference
    )


def _pooled(hidden: torch.Tensor, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``[D]``: the sentence embedding of the first row of ``hidden`` (detached)."""
    return pooled(hidden.detach(), inputs)[0]


def _measure(
    out: torch.Tensor,
    answer: int,
    wrong: int,
    reference: torch.Tensor | None,
    inputs: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    """``[rows]``: the logit difference, or (``reference`` given) the embedding's cosine."""
    if reference is None:
        return logit_difference(out, answer, wrong)
    return embedding_metric(out, inputs, reference)


def probe_gradients(
    value: torch.Tensor, zeros: Sequence[torch.Tensor], row: int | None
) -> torch.Tensor:
    """``[targets, T, D]``: d value / d(each probe zero), of batch row ``row`` (None: summed
    over the rows)."""
    with torch.inference_mode(False), torch.enable_grad():
        # an input nothing reads (an MLP frozen at zero output) has no gradient: zero
        grads = torch.autograd.grad(value, zeros, allow_unused=True)
    grads = [torch.zeros_like(z) if g is None else g for g, z in zip(grads, zeros, strict=True)]
    whole = torch.cat(grads, dim=1)  # (B, targets, T, D)
    return (whole.sum(0) if row is None else whole[row]).detach()

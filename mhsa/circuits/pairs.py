"""The clean / corrupted pair of a circuit analysis, checked, encoded and run once
(``mhsa.circuits.runs.run_pair``), with its metric: logit(answer) - logit(wrong) for causal LMs,
patching's embedding targets for encoders (``mhsa.causal.metrics.PATCH_TARGETS``); ``mhsa.circuits``
scores edges and circuits from it."""

from __future__ import annotations

from mhsa.causal.metrics import embedding_of, patch_metric
from mhsa.circuits.postnorm import PostNormModel
from mhsa.circuits.runs import CircuitPair, circuit_model, run_pair
from mhsa.engine.encoding import answer_ids, check_text, encode, encode_clean_corrupted
from mhsa.engine.models.loading import LoadedModel
from mhsa.errors import InputError

__all__ = ["EAP_ONE_PASS_MAX", "circuit_pair"]


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

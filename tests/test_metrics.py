"""The one module that says what "the output" is (``mhsa.causal.metrics``): its measures against
independent computations, and the analyses reading it rather than a copy of their own."""

from __future__ import annotations

import pytest
import torch

import mhsa
from mhsa.causal import attribution, metrics, patching, targets
from mhsa.engine.models.loading import get_model


def test_the_analyses_read_the_one_definition() -> None:
    assert targets.TARGET_SPECS is metrics.TARGET_SPECS
    assert targets.resolve_target is metrics.resolve_target
    assert targets.sentence_embedding is metrics.sentence_embedding
    assert patching.PATCH_TARGETS is metrics.PATCH_TARGETS is mhsa.causal.PATCH_TARGETS
    assert attribution.answer_tokens is metrics.answer_tokens


def test_logit_difference_reads_the_answer_minus_the_wrong_token() -> None:
    logits = torch.arange(2 * 3 * 5, dtype=torch.float16).reshape(2, 3, 5) ** 1.5
    got = metrics.logit_difference(logits, 4, 1)
    want = torch.tensor([logits[r, 2, 4].item() - logits[r, 2, 1].item() for r in range(2)])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    every = metrics.logit_difference(logits, 1, 4, position=None)  # the other order: negative
    assert every.shape == (2, 3)
    torch.testing.assert_close(every[:, -1], -want)
    torch.testing.assert_close(metrics.logit_difference(logits, 4, 1, position=0), every[:, 0] * -1)


@pytest.mark.slow
def test_the_patch_metric_is_the_models_own_logit_difference() -> None:
    """On toy:induction, the metric of the plain transformers model's outputs equals the
    difference of its logits read by hand, and the answer words are its tokenizer's ids."""
    lm = get_model("toy:induction")
    with lm.lock:
        metric = metrics.patch_metric(lm, "ba", "ke", None, None)
        ids = lm.tokenizer("ba ke mo ba", return_tensors="pt")
        with torch.inference_mode():
            out = lm.head_model(**ids)
    vocab = lm.tokenizer.get_vocab()
    assert (metric.answer, metric.wrong) == (vocab["ba"], vocab["ke"])
    want = out.logits[0, -1, vocab["ba"]] - out.logits[0, -1, vocab["ke"]]
    assert float(metric(out, ids)[0]) == pytest.approx(float(want), abs=1e-6)
    assert metrics.answer_tokens(lm, "ba", "ke") == (vocab["ba"], vocab["ke"])

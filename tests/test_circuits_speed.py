"""EAP's two ways to its gradient (``mhsa.circuits.discovery.EAP_ONE_PASS_MAX``): from the pair's
own pass
of two rows (small models; checked against autograd by hand in test_circuits.py) and from a
separate forward and backward of the clean row (large models) give the same scores."""

from __future__ import annotations

import numpy as np
import pytest

import mhsa
from mhsa.circuits import discovery as circuits

CLEAN = "ba ke mo di fu lo ni pa su te ba ke mo di fu"
CORRUPTED = "ba ke mo di ra lo ni pa su te ba ke mo di fu"


def test_eap_from_a_separate_backward_equals_the_one_pass(monkeypatch: pytest.MonkeyPatch):
    toy = mhsa.load_model("toy:induction", device="cpu")
    kw = {"model": toy, "answer": "lo", "wrong": "ba"}
    one_pass = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, **kw)
    monkeypatch.setattr(circuits, "EAP_ONE_PASS_MAX", 0)
    separate = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, **kw)
    assert list(separate["target"]) == list(one_pass["target"])
    a, b = one_pass["score"].to_numpy(), separate["score"].to_numpy()
    assert np.abs(a).max() > 1e-3  # scores that could differ
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * np.abs(a).max())
    assert separate.attrs["clean"] == pytest.approx(one_pass.attrs["clean"], abs=1e-5)

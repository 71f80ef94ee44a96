"""Circuits on a CUDA GPU: every edge score, faithfulness curve and path patch computed with the
model on the GPU equals the same computation on the CPU (the CPU path is checked against hand
computations in ``tests/test_circuits.py`` and ``tests/test_circuits_encoder.py``). Skipped
without CUDA; run on a lent H100 (BENCHMARKS.md, "GPU checks").

Each model is built once on the CPU (random biases and norm weights moved off 0 and 1) and its
weights copied into the same model loaded on the GPU, so that the two runs differ only in the
device. Tolerances: float32 on both sides; GPU reductions run in another order (and cuBLAS may use
TF32 unless told not to, which the test forbids), so scores agree to 1e-4 of the largest.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import mhsa
from mhsa.circuits import discovery as circuits
from tests.tiny import DECODER_SIZES, perturbed_biases, save_tiny, tiny_bert

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOY = (
    "ba ke mo di fu lo ni pa su te ba ke mo di fu",
    "ba ke mo di ra lo ni pa su te ba ke mo di fu",
)
TOY_WORDS = {"answer": "lo", "wrong": "ba"}
LM = ("the cat sat on the mat and the cat", "the dog sat on the mat and the dog")
LM_WORDS = {"answer": "sat", "wrong": "mat"}
ENC = ("the cat sat on the mat", "the dog sat on the rug")


@pytest.fixture(autouse=True)
def _no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def _pair(
    folder: str, perturb: bool = True
) -> tuple[mhsa.engine.LoadedModel, mhsa.engine.LoadedModel]:
    """The model at ``folder`` on the CPU and on the GPU, with the same weights."""
    cpu = mhsa.load_model(folder, device="cpu")
    if perturb:
        perturbed_biases(cpu)
    gpu = mhsa.load_model(folder, device="cuda")
    gpu.head_model.load_state_dict(cpu.head_model.state_dict())
    assert next(gpu.head_model.parameters()).device.type == "cuda"
    return cpu, gpu


def _saved(tmp_path_factory: pytest.TempPathFactory, name: str, model: Any) -> str:
    return save_tiny(tmp_path_factory.mktemp(name), model)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=30522, n_positions=64, n_embd=32, n_layer=2, n_head=4, initializer_range=0.4
    )
    return _pair(_saved(tmp_path_factory, "gpt2", GPT2LMHeadModel(config)))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """Grouped-query attention (4 query heads, 2 key/value heads) and rotary positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **DECODER_SIZES, num_key_value_heads=2, attention_bias=True, initializer_range=0.2
    )
    return _pair(_saved(tmp_path_factory, "llama", LlamaForCausalLM(config)))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    torch.manual_seed(0)
    model = tiny_bert("BertForMaskedLM", layers=3, positions=64, initializer_range=0.4)
    return _pair(_saved(tmp_path_factory, "bert", model))


def _close(got, want) -> None:
    """Scores equal to 1e-4 of the largest, and the same edges in the same order."""
    assert list(got["source"]) == list(want["source"])
    assert list(got["input"]) == list(want["input"])
    a, b = got["score"].to_numpy(), want["score"].to_numpy()
    scale = np.abs(b).max()
    assert scale > 1e-3  # the texts move the metric: a zero table would not test anything
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * scale)
    assert np.isclose(
        got.attrs["clean"], want.attrs["clean"], atol=1e-4 * abs(want.attrs["clean"]) + 1e-5
    )


@pytest.mark.parametrize("method", ["eap", "eap-ig", "exact"])
def test_toy_induction_scores_on_the_gpu_equal_the_cpus(method: str) -> None:
    cpu = mhsa.load_model("toy:induction", device="cpu")
    gpu = mhsa.load_model("toy:induction", device="cuda")
    want = mhsa.circuits.edge_attribution(*TOY, model=cpu, method=method, **TOY_WORDS)
    got = mhsa.circuits.edge_attribution(*TOY, model=gpu, method=method, **TOY_WORDS)
    _close(got, want)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_lm_eap_and_curve_on_the_gpu_equal_the_cpus(name: str, request) -> None:
    cpu, gpu = request.getfixturevalue(name)
    want = mhsa.circuits.edge_attribution(*LM, model=cpu, method="eap-ig", **LM_WORDS)
    got = mhsa.circuits.edge_attribution(*LM, model=gpu, method="eap-ig", **LM_WORDS)
    _close(got, want)
    curve_cpu = mhsa.circuits.faithfulness_curve(*LM, want, model=cpu, **LM_WORDS)
    curve_gpu = mhsa.circuits.faithfulness_curve(*LM, want, model=gpu, **LM_WORDS)
    f_gpu = curve_gpu.points["faithfulness"].to_numpy()
    np.testing.assert_allclose(f_gpu, curve_cpu.points["faithfulness"], atol=1e-4)
    assert f_gpu[-1] == pytest.approx(1.0, abs=1e-4)  # every edge: the clean run
    assert curve_gpu.cpr == pytest.approx(curve_cpu.cpr, abs=1e-4)
    # the largest edge patched alone on the GPU: the CPU's path patch of it
    top = circuits.top_edges(want, 1).iloc[0]
    edge = (top["source"], top["target"], top["input"])
    on_gpu = mhsa.circuits.path_patch(*LM, *edge, model=gpu, **LM_WORDS).score
    on_cpu = mhsa.circuits.path_patch(*LM, *edge, model=cpu, **LM_WORDS).score
    assert abs(on_cpu) > 1e-3
    assert on_gpu == pytest.approx(on_cpu, abs=1e-4 * abs(on_cpu))


def test_encoder_targets_on_the_gpu_equal_the_cpus(bert) -> None:
    cpu, gpu = bert
    pair = {"target": "similarity", "text_pair": "a bird flew over the house"}
    _close(
        mhsa.circuits.edge_attribution(*ENC, model=gpu, method="eap", **pair),
        mhsa.circuits.edge_attribution(*ENC, model=cpu, method="eap", **pair),
    )
    want = mhsa.circuits.edge_attribution(*ENC, model=cpu, method="eap-ig", target="embedding")
    got = mhsa.circuits.edge_attribution(*ENC, model=gpu, method="eap-ig", target="embedding")
    _close(got, want)
    top = circuits.top_edges(want, 20)
    f_cpu = mhsa.circuits.circuit_faithfulness(*ENC, top, model=cpu, target="embedding")
    f_gpu = mhsa.circuits.circuit_faithfulness(*ENC, top, model=gpu, target="embedding")
    assert f_gpu == pytest.approx(f_cpu, abs=1e-4)

"""Big-model placement on a GPU: ``load_model(device_map=...)`` with layers on the GPU and the
CPU, our blocks following their layer's device, the selected layers' weights equal to a CPU
run. Skipped without CUDA (run on a lent GPU: BENCHMARKS.md, "GPU checks")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mhsa
from mhsa.swap import our_blocks_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TEXT = "A long text, read one selected layer at a time, on two devices."


def _split_map(layers: int) -> dict[str, object]:
    """The embeddings and the first half of the layers on GPU 0, the rest and the head on the
    CPU: accelerate's hooks move the hidden states between them."""
    placement: dict[str, object] = {"model.embed_tokens": 0, "model.rotary_emb": 0}
    for i in range(layers):
        placement[f"model.layers.{i}"] = 0 if i < layers // 2 else "cpu"
    placement.update({"model.norm": "cpu", "lm_head": "cpu"})
    return placement


def test_a_gpu_and_cpu_map_gives_the_cpu_weights(tiny_llama_path) -> None:
    reference = mhsa.load_model(tiny_llama_path, device="cpu")
    layers = reference.config.num_hidden_layers
    lm = mhsa.load_model(tiny_llama_path, device_map=_split_map(layers))
    devices = {str(p.device) for p in lm.model.parameters()}
    assert any(d.startswith("cuda") for d in devices) and "cpu" in devices
    with lm.lock:
        blocks = our_blocks_of(lm, frozenset(range(layers)))
    for block in blocks:  # each of our modules sits where its layer's weights are
        want = "cuda" if block.layer < layers // 2 else "cpu"
        assert block.ours.qkv.weight.device.type == want
    want = mhsa.attend(TEXT, model=reference).attention
    for engine in ("transformers", "mhsa"):
        got = mhsa.attend(TEXT, model=lm, engine=engine, layers=list(range(layers)))
        np.testing.assert_allclose(got.attention, want, atol=1e-4)
    one = mhsa.attend(TEXT, model=lm, engine="mhsa", layers=layers - 1, heads="0-1")
    np.testing.assert_allclose(one.attention, want[layers - 1 :, :2], atol=1e-4)


def test_auto_map_on_one_gpu_runs_every_selected_layer_there(tiny_llama_path) -> None:
    lm = mhsa.load_model(tiny_llama_path, device_map="auto", torch_dtype="float16")
    reference = mhsa.load_model(tiny_llama_path, device="cpu")
    got = mhsa.attend(TEXT, model=lm, engine="mhsa", layers=0, attention_dtype="float16")
    want = mhsa.attend(TEXT, model=reference, layers=0).attention
    assert got.attention.dtype == np.float16
    assert np.abs(got.attention.astype(np.float32) - want).max() < 5e-3

"""Big-model placement on a GPU: ``load_model(device_map=...)`` with layers on the GPU and the
CPU, our blocks following their layer's device, the selected layers' weights equal to a CPU
run. Skipped without CUDA (run on a lent GPU: BENCHMARKS.md, "GPU checks")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mhsa
from mhsa.engine.runs.swap import our_blocks_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TEXT = "A long text, read one selected layer at a time, on two devices."


def _split_map(layers: int) -> dict[str, object]:
    """The embeddings and the first half of the layers on GPU 0, the rest and the head on the
    CPU, which accelerate offloads (their weights on the meta device until it moves them)."""
    placement: dict[str, object] = {"model.embed_tokens": 0, "model.rotary_emb": 0}
    for i in range(layers):
        placement[f"model.layers.{i}"] = 0 if i < layers // 2 else "cpu"
    placement.update({"model.norm": "cpu", "lm_head": "cpu"})
    return placement


def test_a_map_with_offloaded_layers(tiny_llama_path) -> None:
    """The model's own forward runs across the map; a layer on the GPU runs through our module
    there with the CPU run's weights; an offloaded layer is the model's own block under the
    transformers engine and refused by name under ours, never read as meta."""
    reference = mhsa.load_model(tiny_llama_path, device="cpu")
    layers = reference.config.num_hidden_layers
    lm = mhsa.load_model(tiny_llama_path, device_map=_split_map(layers))
    devices = {p.device.type for p in lm.model.parameters()}
    assert devices == {"cuda", "meta"}  # the CPU half is offloaded
    want = mhsa.attend(TEXT, model=reference).attention
    whole = mhsa.attend(TEXT, model=lm, engine="transformers")
    np.testing.assert_allclose(whole.attention, want, atol=1e-4)
    with lm.lock:
        (block,) = our_blocks_of(lm, frozenset({0}))
    assert block.ours.qkv.weight.device.type == "cuda"  # our module sits where its layer is
    got = mhsa.attend(TEXT, model=lm, engine="transformers", layers=0, heads="0-1")
    np.testing.assert_allclose(got.attention, want[:1, :2], atol=1e-4)
    # an offloaded layer: the transformers engine reads the model's own eager block there
    last = mhsa.attend(TEXT, model=lm, engine="transformers", layers=layers - 1)
    np.testing.assert_allclose(last.attention, want[layers - 1 :], atol=1e-4)
    with pytest.raises(mhsa.UnsupportedModelError, match="offloaded by device_map"):
        mhsa.attend(TEXT, model=lm, engine="mhsa", layers=layers - 1)


def test_auto_map_on_one_gpu_runs_every_selected_layer_there(tiny_llama_path) -> None:
    lm = mhsa.load_model(tiny_llama_path, device_map="auto", torch_dtype="float16")
    reference = mhsa.load_model(tiny_llama_path, device="cpu")
    got = mhsa.attend(TEXT, model=lm, engine="mhsa", layers=0, attention_dtype="float16")
    want = mhsa.attend(TEXT, model=reference, layers=0).attention
    assert got.attention.dtype == np.float16
    assert np.abs(got.attention.astype(np.float32) - want).max() < 5e-3

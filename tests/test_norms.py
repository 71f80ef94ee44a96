"""Value-weighted attention (Kobayashi et al. 2020): ``attend(norms=True)``, checked against the
attention block's output rebuilt from the model's own weights, on tiny BERT, GPT-2 and Llama
(grouped-query) models and on MiniLM."""

from __future__ import annotations

import copy
import dataclasses
import io

import numpy as np
import pytest
import torch

import mhsa
from mhsa.engine.cache import result_nbytes
from mhsa.engine.encoding import encode
from mhsa.engine.runs.norms import recording_value_norms
from mhsa.engine.runs.swap import our_blocks

TEXT = "The keys of the cabinet are on the table."


def _bert_parts(model, layer: int):
    """(block, output projection, f(x) -> per-head vectors [S, H, D], output bias) of a BERT."""
    block = model.encoder.layer[layer].attention
    s, dense = block.self, block.output.dense
    h, dh = s.num_attention_heads, s.attention_head_size

    def vectors(x: torch.Tensor) -> torch.Tensor:
        v = (x @ s.value.weight.T + s.value.bias).view(-1, h, dh)  # (S, H, Dh)
        w_o = dense.weight.T.reshape(h, dh, -1)  # (H, Dh, D): rows of W_O^T per head
        return torch.einsum("shd,hde->she", v, w_o)

    return block, dense, vectors, dense.bias


def _gpt2_parts(model, layer: int):
    block = model.h[layer].attn
    h, d = block.num_heads, block.embed_dim
    dh = d // h

    def vectors(x: torch.Tensor) -> torch.Tensor:
        v = (x @ block.c_attn.weight + block.c_attn.bias)[:, 2 * d :].view(-1, h, dh)  # Conv1D
        w_o = block.c_proj.weight.reshape(h, dh, d)  # Conv1D [in, out]: rows per head
        return torch.einsum("shd,hde->she", v, w_o)

    return block, block.c_proj, vectors, block.c_proj.bias


def _llama_parts(model, layer: int):
    block = model.layers[layer].self_attn
    dh = block.head_dim
    h = block.q_proj.weight.shape[0] // dh
    g = block.k_proj.weight.shape[0] // dh

    def vectors(x: torch.Tensor) -> torch.Tensor:
        v = (x @ block.v_proj.weight.T).view(-1, g, dh)  # (S, G, Dh), no bias in Llama
        v = v[:, [head // (h // g) for head in range(h)]]  # query head h reads kv head h // (H/G)
        w_o = block.o_proj.weight.T.reshape(h, dh, -1)
        return torch.einsum("shd,hde->she", v, w_o)

    return block, block.o_proj, vectors, None


PARTS = {"bert": _bert_parts, "gpt2": _gpt2_parts, "llama": _llama_parts}


def _captured(lm: mhsa.engine.LoadedModel, parts, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states the model's own attention block receives, and the output of its own
    output projection (before residual and norm), from one forward of the model."""
    block, out_proj, _, _ = parts
    seen: dict[str, torch.Tensor] = {}

    def pre(_m, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"])[0].detach()

    def post(_m, _args, output):
        seen["out"] = output[0].detach()

    handles = [
        block.register_forward_pre_hook(pre, with_kwargs=True),
        out_proj.register_forward_hook(post),
    ]
    try:
        with torch.no_grad():
            lm.model(**encode(lm, TEXT, None, None).inputs_on(lm.device))
    finally:
        for handle in handles:
            handle.remove()
    return seen["x"], seen["out"]


@pytest.fixture(scope="module")
def tiny_models(tiny_bert_mlm_path, tiny_gpt2_path, tiny_llama_path):
    return {
        "bert": mhsa.load_model(tiny_bert_mlm_path, device="cpu"),
        "gpt2": mhsa.load_model(tiny_gpt2_path, device="cpu"),
        "llama": mhsa.load_model(tiny_llama_path, device="cpu"),
    }


@pytest.mark.parametrize("engine", ["transformers", "mhsa"])
@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_weighted_vectors_sum_to_the_blocks_output(tiny_models, family, engine) -> None:
    lm = tiny_models[family]
    result = mhsa.attend(TEXT, model=lm, engine=engine, norms=True)
    for layer in range(result.num_layers):
        parts = PARTS[family](lm.model, layer)
        x, block_out = _captured(lm, parts, layer)
        with torch.no_grad():
            fx = parts[2](x)  # (S, H, D): f_h(x_j)
        alpha = torch.from_numpy(result.attention[layer])  # (H, T, S)
        weighted = alpha[:, :, :, None] * fx.permute(1, 0, 2)[:, None]  # (H, T, S, D)
        rebuilt = weighted.sum(dim=(0, 2)) + (0 if parts[3] is None else parts[3].detach())
        assert torch.allclose(rebuilt, block_out, atol=1e-5, rtol=0), (family, layer)
        expected = weighted.norm(dim=-1).numpy()  # (H, T, S): alpha_ij ||f_h(x_j)||
        np.testing.assert_allclose(result.norms[layer], expected, atol=1e-5, rtol=0)
        assert (result.norms[layer] > 0).any()


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_both_engines_give_the_same_norms(tiny_models, family) -> None:
    lm = tiny_models[family]
    theirs = mhsa.attend(TEXT, model=lm, engine="transformers", norms=True)
    ours = mhsa.attend(TEXT, model=lm, engine="mhsa", norms=True)
    np.testing.assert_allclose(ours.norms, theirs.norms, atol=1e-5, rtol=0)


def test_minilm_engines_agree_and_norms_are_weight_times_a_per_key_norm(minilm) -> None:
    theirs = mhsa.attend(TEXT, model=minilm, engine="transformers", norms=True)
    ours = mhsa.attend(TEXT, model=minilm, engine="mhsa", norms=True)
    np.testing.assert_allclose(ours.norms, theirs.norms, atol=1e-5, rtol=0)
    a, n = theirs.attention.astype(np.float64), theirs.norms.astype(np.float64)
    ratio = np.where(a > 1e-6, n / np.where(a > 1e-6, a, 1), np.nan)  # (L, H, T, S)
    per_key = np.nanmean(ratio, axis=2, keepdims=True)  # the value norm of each key
    kept = ~np.isnan(ratio)
    assert kept.mean() > 0.9
    np.testing.assert_allclose(ratio[kept], np.broadcast_to(per_key, ratio.shape)[kept], rtol=1e-4)
    assert np.nanstd(per_key) > 0.05 * np.nanmean(per_key)  # the norms differ from key to key


def test_the_norms_of_a_causal_model_are_zero_where_the_weights_are(tiny_models) -> None:
    result = mhsa.attend(TEXT, model=tiny_models["llama"], norms=True)
    above = np.triu(np.ones((result.num_tokens,) * 2, dtype=bool), 1)
    assert (result.norms[..., above] == 0).all()
    assert (result.norms[..., ~above] > 0).all()


def test_norms_only_when_asked_and_kept_everywhere_a_result_goes(minilm, tmp_path) -> None:
    plain = mhsa.attend(TEXT, model=minilm)
    result = mhsa.attend(TEXT, model=minilm, norms=True)
    assert plain.norms is None
    assert result_nbytes(result) == result_nbytes(plain) + result.norms.nbytes
    buffer = io.BytesIO()
    result.save(buffer)
    buffer.seek(0)
    loaded = mhsa.AttentionResult.load(buffer)
    np.testing.assert_array_equal(loaded.norms, result.norms)
    words = result.to_words()
    assert words.norms is not None and words.norms.shape == words.attention.shape


def test_norms_as_attention_puts_the_norms_in_place_of_the_weights(minilm) -> None:
    result = mhsa.attend(TEXT, model=minilm, norms=True)
    shown = mhsa.engine.norms_as_attention(result)
    assert shown.attention is result.norms and shown.norms is None
    rows = mhsa.engine.norms_as_attention(result, rows_sum_to_one=True).attention
    np.testing.assert_allclose(rows.sum(-1), 1, atol=1e-5)
    np.testing.assert_allclose(rows * result.norms.sum(-1, keepdims=True), result.norms, atol=1e-6)
    with pytest.raises(ValueError, match="norms=True"):
        mhsa.engine.norms_as_attention(mhsa.attend(TEXT, model=minilm))


def test_norms_of_a_model_our_module_cannot_load_say_so(tiny_t5_path) -> None:
    with pytest.raises(mhsa.UnsupportedModelError, match="value norm"):
        mhsa.attend(TEXT, model=tiny_t5_path, text_pair="Hi.", norms=True)


def test_cli_attend_norms_saves_them(tmp_path, capsys, minilm) -> None:
    from mhsa.__main__ import main

    out = tmp_path / "norms.npz"
    assert main(["attend", TEXT, "--norms", "--device", "cpu", "--out", str(out)]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("norms"))
    saved = mhsa.AttentionResult.load(out)
    assert f"largest {saved.norms.max():.3g}" in line
    np.testing.assert_allclose(saved.norms, mhsa.attend(TEXT, model=minilm, norms=True).norms)


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_a_family_without_a_value_hook_projects_the_blocks_input(tiny_models, family) -> None:
    """``Family.values`` names where a block computes V; without it the block's input is
    projected with our module: the same norms."""
    lm = tiny_models[family]
    inputs = encode(lm, TEXT, None, None).inputs_on(lm.device)
    with lm.lock:
        blocks = our_blocks(lm)
    bare = []
    for block in blocks:
        copied = copy.copy(block)
        copied.family = dataclasses.replace(block.family, values=None)
        bare.append(copied)
    recorded = []
    for which in (blocks, bare):
        with recording_value_norms(which, {}) as out, torch.no_grad():
            lm.model(**inputs)
        recorded.append(out)
    assert sorted(recorded[0]) == sorted(recorded[1]) == list(range(len(blocks)))
    for layer in recorded[0]:
        torch.testing.assert_close(recorded[0][layer], recorded[1][layer], atol=1e-6, rtol=1e-5)

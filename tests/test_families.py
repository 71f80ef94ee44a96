"""The families of issue 39 part B through our module: GPT-NeoX (Pythia), GPT-J, Phi, OPT,
Falcon (multi-query, grouped and per-head layouts) and ALBERT (shared layers), each a tiny
random model saved to a folder and opened by path.

For each: engine ``mhsa`` equals the model's eager run in every layer's attention and in the
final hidden state (<= 1e-4) while the model's own attention ``forward`` raises if called;
``store`` round-trips and the model's own forward then agrees with ours on the new weights. The
attention features are checked against the families' own functions in transformers (GPT-J's
``apply_rotary_pos_emb``, GPT-NeoX's, Falcon's ``_split_heads``); features we do not reproduce
are refused by name, and ``verify`` catches a module that is silently wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mhsa
from mhsa.engine.families.fused import join_qkv, split_qkv, value_rows
from mhsa.engine.runs.swap import (
    our_blocks,
    store_our_weights,
    trainable_our_blocks,
)
from tests.tiny import save_tiny
from tests.tiny_families import check_engine, loaded_tiny

TEXT = "The quick brown fox jumps over the lazy dog, then sleeps."
TOL = 1e-4
#: variants of the registered families (each registered family's own tiny model runs every tool
#: in tests/test_family_tools.py)
VARIANTS = ["GPT-NeoX sequential", "Falcon grouped", "Falcon per-head"]
FAMILIES = [
    "GPT-NeoX",
    "GPT-NeoX sequential",
    "GPT-J",
    "Phi",
    "OPT",
    "Falcon",
    "Falcon grouped",
    "Falcon per-head",
    "ALBERT",
]


@pytest.fixture(params=FAMILIES)
def family_model(request, tmp_path_factory) -> mhsa.engine.LoadedModel:
    return loaded_tiny(request.param, tmp_path_factory.mktemp)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_run_through_our_module_and_equal_the_model(
    variant, tmp_path_factory, monkeypatch
) -> None:
    """The registered families run in tests/test_family_tools.py; their variants here."""
    check_engine(loaded_tiny(variant, tmp_path_factory.mktemp), monkeypatch)


@pytest.mark.slow
def test_store_round_trips_and_the_model_follows(family_model) -> None:
    """Weights changed in our modules and stored: loading them back gives the changed weights,
    and the model's own forward attends as ours does with them."""
    lm = mhsa.load_model(family_model.name, device="cpu")  # a copy of our own to change
    before = mhsa.attend(TEXT, model=lm, engine="transformers").attention
    gen = torch.Generator().manual_seed(3)
    with lm.lock:
        blocks = trainable_our_blocks(lm)
        changed = {}
        with torch.no_grad():
            for block in blocks:
                if id(block.ours) in changed:  # ALBERT: layers sharing a block share a module
                    continue
                for p in block.ours.parameters():
                    p.add_(0.3 * torch.randn(p.shape, generator=gen))
                changed[id(block.ours)] = block.ours.projections()
            store_our_weights(blocks)
            for block in blocks:
                reloaded = block.family.load(block.original, lm.model)
                mine, theirs = changed[id(block.ours)], reloaded.projections()
                for a, b in zip(mine[0] + mine[1], theirs[0] + theirs[1], strict=True):
                    assert (a is None) == (b is None)
                    if a is not None:
                        torch.testing.assert_close(a, b, rtol=0, atol=0)
        lm.cache.clear()  # our modules are rebuilt from the stored weights
    after = mhsa.attend(TEXT, model=lm, engine="transformers").attention
    ours = mhsa.attend(TEXT, model=lm, engine="mhsa").attention
    assert np.abs(after - before).max() > 1e-3  # the store reached the model
    assert np.abs(ours - after).max() <= TOL


def test_interleaved_partial_rotary_is_gptjs() -> None:
    from transformers.models.gptj.modeling_gptj import (
        apply_rotary_pos_emb,
        create_sinusoidal_positions,
    )

    torch.manual_seed(0)
    b, h, t, d_head, rot = 2, 3, 7, 16, 6
    x = torch.randn(b, h, t, d_head)
    sincos = create_sinusoidal_positions(t, rot)[None].repeat(b, 1, 1)  # (B, T, rot)
    sin, cos = sincos.split(rot // 2, dim=-1)
    x_bthd = x.transpose(1, 2)  # GPT-J rotates [B, T, H, Dh]
    rotated = apply_rotary_pos_emb(x_bthd[..., :rot], sin, cos)
    want = torch.cat([rotated, x_bthd[..., rot:]], dim=-1).transpose(1, 2)
    ours = mhsa.engine.RotaryEmbedding.default(d_head, rot_dim=rot, interleaved=True)
    c, s = ours.cos_sin(torch.arange(t), x.dtype)
    torch.testing.assert_close(ours.rotate(x, c, s), want, rtol=0, atol=1e-6)
    plain = mhsa.engine.RotaryEmbedding.default(d_head, rot_dim=rot)  # rotate_half: another result
    assert (plain.rotate(x, c, s) - want).abs().max() > 1e-2
    assert torch.equal(ours.rotate(x, c, s)[..., rot:], x[..., rot:])  # the rest unrotated


def test_partial_rotary_is_gpt_neoxs() -> None:
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import (
        GPTNeoXRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    torch.manual_seed(0)
    config = GPTNeoXConfig(hidden_size=64, num_attention_heads=4, rotary_pct=0.25)
    theirs = GPTNeoXRotaryEmbedding(config)
    q, k = torch.randn(2, 2, 4, 9, 16).unbind(0)
    positions = torch.arange(9)[None]
    cos, sin = theirs(q, positions)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    ours = mhsa.engine.RotaryEmbedding(theirs.inv_freq)
    assert ours.rot_dim == 4
    c, s = ours.cos_sin(positions, q.dtype)
    torch.testing.assert_close(ours.rotate(q, c, s), want_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.rotate(k, c, s), want_k, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("flags", "layout", "kv_heads"),
    [
        ({"multi_query": True, "new_decoder_architecture": False}, "stacked", 1),
        ({"new_decoder_architecture": True, "num_kv_heads": 2}, "grouped", 2),
        ({"multi_query": False, "new_decoder_architecture": False}, "per-head", 4),
    ],
)
def test_fused_layouts_split_as_falcon_does(flags, layout, kv_heads) -> None:
    from transformers import FalconConfig
    from transformers.models.falcon.modeling_falcon import FalconAttention

    config = FalconConfig(hidden_size=32, num_attention_heads=4, alibi=False, **flags)
    block = FalconAttention(config, layer_idx=0)
    heads, d_head = 4, 8
    torch.manual_seed(0)
    fused = torch.randn(2, 5, block.query_key_value.weight.shape[0])  # (B, T, rows)
    q, k, v = block._split_heads(fused)  # (B, T, H or G, Dh); grouped: K/V repeated per head
    sizes = {"heads": heads, "kv_heads": kv_heads, "d_head": d_head}
    mine = split_qkv(fused.movedim(-1, 0), layout, **sizes)
    torch.testing.assert_close(mine[0].movedim(0, -1), q.flatten(2), rtol=0, atol=0)
    groups = heads // kv_heads if layout == "grouped" else 1
    want_k = k[:, :, ::groups].flatten(2)  # one of each group's repeated copies
    torch.testing.assert_close(mine[1].movedim(0, -1), want_k, rtol=0, atol=0)
    want_v = v[:, :, ::groups].flatten(2)
    torch.testing.assert_close(value_rows(fused, layout, **sizes), want_v, rtol=0, atol=0)
    rejoined = join_qkv(*mine, layout, heads=heads, kv_heads=kv_heads)
    torch.testing.assert_close(rejoined.movedim(0, -1), fused, rtol=0, atol=0)


def _tiny(tmp_path, model) -> mhsa.engine.LoadedModel:
    return mhsa.load_model(save_tiny(tmp_path, model), device="cpu")


def test_features_we_do_not_reproduce_are_refused_by_name(tmp_path) -> None:
    import transformers as tf

    from tests.tiny import DECODER_SIZES

    torch.manual_seed(0)
    phi = _tiny(tmp_path / "phi", tf.PhiModel(tf.PhiConfig(**DECODER_SIZES, qk_layernorm=True)))
    with pytest.raises(mhsa.UnsupportedModelError, match="qk_layernorm"):
        mhsa.attend(TEXT, model=phi, engine="mhsa")
    sizes = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64}
    albert = tf.AlbertModel(tf.AlbertConfig(**sizes, inner_group_num=2))
    with pytest.raises(mhsa.UnsupportedModelError, match="inner_group_num=2"):
        mhsa.attend(TEXT, model=_tiny(tmp_path / "albert", albert), engine="mhsa")
    falcon = tf.FalconModel(tf.FalconConfig(hidden_size=32, num_attention_heads=4, alibi=True))
    with pytest.raises(mhsa.UnsupportedModelError, match="ALiBi") as info:
        mhsa.attend(TEXT, model=_tiny(tmp_path / "falcon", falcon), engine="mhsa")
    assert "GPT-NeoX" in str(info.value) and "information flow" in str(info.value)
    deberta = tf.DebertaV2Model(
        tf.DebertaV2Config(vocab_size=30522, **sizes, num_hidden_layers=1, relative_attention=True)
    )
    with pytest.raises(mhsa.UnsupportedModelError, match="disentangled attention"):
        mhsa.attend(TEXT, model=_tiny(tmp_path / "deberta", deberta), engine="mhsa")


@pytest.mark.parametrize(
    ("change", "refusal"),
    [({"do_layer_norm_before": False}, "post-norm"), ({"word_embed_proj_dim": 16}, "project_out")],
)
def test_opts_the_decomposition_does_not_cover_are_refused_by_name(
    tmp_path, change, refusal
) -> None:
    import transformers as tf

    torch.manual_seed(0)
    sizes = {"hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    config = tf.OPTConfig(vocab_size=30522, **sizes, **{"word_embed_proj_dim": 32, **change})
    lm = _tiny(tmp_path, tf.OPTForCausalLM(config))
    assert mhsa.attend(TEXT, model=lm, engine="mhsa", verify=True).max_abs_diff <= TOL
    with pytest.raises(mhsa.UnsupportedModelError, match=refusal):
        mhsa.causal.head_attribution(TEXT, model=lm, answer="cat", wrong="dog")


def test_verify_catches_a_module_that_is_silently_wrong(tmp_path_factory) -> None:
    """GPT-J's rotation with rotate_half pairs instead of its interleaved ones: the same
    shapes, no error, other weights; ``verify`` reports the difference."""
    lm = mhsa.load_model(loaded_tiny("GPT-J", tmp_path_factory.mktemp).name, device="cpu")
    with lm.lock:
        for block in our_blocks(lm):
            block.ours.rotary.interleaved = False
    result = mhsa.attend(TEXT, model=lm, engine="mhsa", verify=True)
    assert result.max_abs_diff > 1e-3

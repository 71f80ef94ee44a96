"""Renamed public names keep working for a release (issue 37.6): each old name warns with a
``DeprecationWarning`` naming the new one, and gives exactly what the new name gives."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    GPT2Config,
    GPT2Model,
    LlamaConfig,
    LlamaModel,
)

from mhsa import MultiHeadSelfAttention
from mhsa.engine.attention.core import combine_masks
from mhsa.engine.families.bert import load_bert
from mhsa.engine.families.distilbert import load_distilbert
from mhsa.engine.families.gpt2 import load_gpt2
from mhsa.engine.families.llama import load_llama


def _module() -> MultiHeadSelfAttention:
    torch.manual_seed(0)
    return MultiHeadSelfAttention(16, 4).eval()


def _masks() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input [2, 5, 16]; a boolean mask that is not symmetric (a later query may not see key
    1), and padding hiding the second sentence's last two tokens."""
    torch.manual_seed(1)
    x = torch.randn(2, 5, 16)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[3:, 1] = False
    padding = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    return x, mask, padding


@pytest.mark.parametrize(
    ("old", "new"), [("attn_mask", "mask"), ("attention_mask", "padding_mask")]
)
def test_forwards_old_mask_names_warn_and_give_the_new_names_result(old: str, new: str) -> None:
    module = _module()
    x, mask, padding = _masks()
    value = mask if new == "mask" else padding
    with torch.no_grad():
        want_out, want_w = module(x, **{new: value})
        with pytest.warns(DeprecationWarning, match=f"'{old}' is deprecated .*use '{new}'") as rec:
            out, w = module(x, **{old: value})
        # the warning names the caller's line, not torch's module call (Python shows those)
        assert [r.filename for r in rec] == [__file__]
        with pytest.warns(DeprecationWarning, match=f"use '{new}'"):
            weights = module.attention_weights(x, **{old: value})
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(w, want_w, rtol=0, atol=0)
    torch.testing.assert_close(weights, module.attention_weights(x, **{new: value}))
    # the mask changed something: a wrong mapping (mask <-> padding) would not give these
    assert not torch.equal(w, module(x)[1])
    if new == "mask":
        assert float(w[:, :, 3:, 1].abs().max()) == 0.0
    else:
        assert float(w[1, :, :, 3:].abs().max()) == 0.0 and float(w[0, :, :, 3:].min()) > 0


def test_both_old_and_new_names_is_an_error() -> None:
    x, mask, _ = _masks()
    with pytest.raises(TypeError, match="both 'attn_mask' and its new name 'mask'"):
        _module()(x, attn_mask=mask, mask=mask)


def test_combine_masks_old_names() -> None:
    _, mask, padding = _masks()
    shape = {"is_causal": True, "q_len": 5, "k_len": 5, "device": torch.device("cpu")}
    want = combine_masks(mask=mask, padding_mask=padding, dtype=torch.float32, **shape)
    with pytest.warns(DeprecationWarning, match="use 'padding_mask'"):
        got = combine_masks(attn_mask=mask, attention_mask=padding, dtype=torch.float32, **shape)
    assert got is not None and want is not None
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _blocks() -> dict[str, tuple[torch.nn.Module, tuple]]:
    """One attention block of each family the old constructors loaded (tiny, random)."""
    torch.manual_seed(0)
    small = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4}
    bert = BertModel(BertConfig(vocab_size=50, intermediate_size=32, **small))
    distil = DistilBertModel(
        DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=4, hidden_dim=32)
    )
    gpt2 = GPT2Model(GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=4))
    llama = LlamaModel(
        LlamaConfig(vocab_size=50, intermediate_size=32, num_key_value_heads=2, **small)
    )
    return {
        "bert": (bert.encoder.layer[0].attention, ()),
        "distilbert": (distil.transformer.layer[0].attention, ()),
        "gpt2": (gpt2.h[0].attn, ()),
        "llama": (llama.layers[0].self_attn, (llama.rotary_emb,)),
    }


LOADERS = {
    "bert": load_bert,
    "distilbert": load_distilbert,
    "gpt2": load_gpt2,
    "llama": load_llama,
}


@pytest.mark.parametrize("family", list(LOADERS))
def test_removed_constructors_warn_and_give_the_loaders_module(family: str) -> None:
    block, extra = _blocks()[family]
    new = LOADERS[family](block, *extra).eval()
    with pytest.warns(
        DeprecationWarning,
        match=rf"MultiHeadSelfAttention\.from_{family} is deprecated .*"
        rf"use mhsa\.engine\.families\.{family}\.load_{family}",
    ) as rec:
        old = getattr(MultiHeadSelfAttention, f"from_{family}")(block, *extra).eval()
    assert [r.filename for r in rec] == [__file__]
    assert isinstance(old, MultiHeadSelfAttention)
    assert old.state_dict().keys() == new.state_dict().keys()
    for name, tensor in new.state_dict().items():
        torch.testing.assert_close(old.state_dict()[name], tensor, rtol=0, atol=0)
    x = torch.randn(1, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(old(x)[0], new(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["CircuitPair", "run_pair", "probe_gradients"])
def test_the_pairs_names_moved_with_the_pair(name: str) -> None:
    """The clean / corrupted pair is one module (``mhsa.circuits.pairs``): its run and record
    were in ``mhsa.circuits.runs`` only to keep another file short; the old names still
    resolve there, warning, as the very same objects."""
    import mhsa.circuits.pairs as pairs
    import mhsa.circuits.runs as runs

    with pytest.warns(DeprecationWarning, match=rf"runs\.{name} is deprecated.*circuits\.pairs"):
        old = getattr(runs, name)
    assert old is getattr(pairs, name)
    with pytest.raises(AttributeError):
        runs.no_such_name  # noqa: B018

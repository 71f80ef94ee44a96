"""OV and QK circuits from the weights (``mhsa.analysis.weights``) against an independent
float64 computation from each family's own modules (``tests.circuits_by_hand.model_parts``:
module names and fused row layouts written out from transformers' code): the full OV circuit
built as the vocabulary-square matrix ``W_E W_V W_O W_U`` and its eigenvalues taken, on tiny
models with a vocabulary of 128 tokens. The weight processing (TransformerLens's defaults) is
written out here again: norm weights folded into the reading matrices, the unembedding centred
over the vocabulary, and for LayerNorm models reading weights centred and writing weights
(``W_E``, ``W_O``, ``W_pos``) centred over ``d_model``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import mhsa
from mhsa.analysis.weights import ov_copying_scores, ov_top_tokens, qk_positional_scores
from tests.circuits_by_hand import model_parts
from tests.tiny import save_tiny
from tests.tiny_families import small_vocabulary_model

#: a spread of layouts: LayerNorm and Conv1D (GPT-2), grouped-query attention (Llama), fused
#: per-head rows (GPT-NeoX), parallel blocks (GPT-J), grouped fused rows (Falcon), Gemma's
#: ``1 + w`` norms, Phi-3's fused projection
FAMILIES = ["GPT-2 family", "Llama-style", "GPT-NeoX", "GPT-J", "Falcon grouped", "Gemma", "Phi-3"]
_LOADED: dict[str, mhsa.engine.LoadedModel] = {}


def _small(name: str, factory) -> mhsa.engine.LoadedModel:
    if name not in _LOADED:
        folder = factory(name.replace(" ", "-"))
        _LOADED[name] = mhsa.load_model(
            save_tiny(folder, small_vocabulary_model(name)), device="cpu"
        )
    return _LOADED[name]


def _linear(module: nn.Module) -> torch.Tensor:
    """A projection's weight in ``nn.Linear`` layout ``[out, in]`` (GPT-2's Conv1D stores
    ``[in, out]``), float64."""
    w = module.weight.detach().double()
    return w.T if type(module).__name__ == "Conv1D" else w


def _norm_weight(norm: nn.Module) -> torch.Tensor:
    w = norm.weight.detach().double()
    return w + 1.0 if type(norm).__name__.startswith("Gemma") else w


def _hand_circuits(lm: mhsa.engine.LoadedModel) -> dict[str, tuple[torch.Tensor, ...]]:
    """Per head ``L{l}H{h}``: the processed ``(W_E [V, D], W_V [D, Dh], W_O [Dh, D], W_U [D, V],
    W_Q [D, Dh], W_K [D, Dh])``."""
    p = model_parts(lm)
    layer_norm = isinstance(p.final, nn.LayerNorm)
    emb = lm.head_model.get_input_embeddings().weight.detach().double()  # (V, D)
    w_u = _norm_weight(p.final)[:, None] * _linear(lm.head_model.get_output_embeddings()).T
    if layer_norm:
        emb = emb - emb.mean(1, keepdim=True)
        w_u = w_u - w_u.mean(0, keepdim=True)
    w_u = w_u - w_u.mean(1, keepdim=True)  # center_unembed
    d, per_kv = p.d_head, p.heads // p.kv_heads
    found = {}
    for i in range(len(p.layers)):
        w1 = _norm_weight(p.norms[i][0])
        for h in range(p.heads):
            read = []
            for part, index in (("v", h // per_kv), ("q", h), ("k", h // per_kv)):
                w = w1[:, None] * _linear(p.projection(i, part))[p.rows(part, index)].T
                read.append(w - w.mean(0, keepdim=True) if layer_norm else w)
            w_o = _linear(p.out[i])[:, h * d : (h + 1) * d].T  # (Dh, D)
            if layer_norm:
                w_o = w_o - w_o.mean(1, keepdim=True)
            found[f"L{i}H{h}"] = (emb, read[0], w_o, w_u, read[1], read[2])
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_copying_scores_equal_the_eigenvalues_of_the_vocabulary_square_circuit(
    name: str, tmp_path_factory
):
    lm = _small(name, tmp_path_factory.mktemp)
    ours = ov_copying_scores(lm)
    assert ours.attrs["circuit"] == "W_E W_V W_O W_U"
    hand = {}
    for label, (emb, w_v, w_o, w_u, _, _) in _hand_circuits(lm).items():
        full = emb @ w_v @ w_o @ w_u  # (V, V)
        assert full.shape == (128, 128)
        eigenvalues = torch.linalg.eigvals(full)
        hand[label] = float(eigenvalues.real.sum() / eigenvalues.abs().sum())
    assert list(ours.index) == list(hand)
    assert ours.to_dict() == pytest.approx(hand, abs=1e-6)
    assert max(hand.values()) - min(hand.values()) > 0.1  # heads differ: a mix-up would show


def test_an_encoder_without_unembedding_measures_w_v_w_o_alone(tiny_bert_path: str):
    lm = mhsa.load_model(tiny_bert_path, device="cpu")
    ours = ov_copying_scores(lm)
    assert ours.attrs["circuit"].startswith("W_V W_O")
    hand = {}
    encoder = lm.model.encoder.layer
    heads = lm.config.num_attention_heads
    d = lm.config.hidden_size // heads
    for i, layer in enumerate(encoder):
        w_v = layer.attention.self.value.weight.detach().double()  # (H Dh, D)
        w_o = layer.attention.output.dense.weight.detach().double()  # (D, H Dh)
        for h in range(heads):
            rows = slice(h * d, (h + 1) * d)
            v = w_v[rows].T - w_v[rows].T.mean(0, keepdim=True)  # reads a LayerNorm's output
            o = w_o[:, rows].T - w_o[:, rows].T.mean(1, keepdim=True)
            eigenvalues = torch.linalg.eigvals(v @ o)  # (D, D)
            hand[f"L{i}H{h}"] = float(eigenvalues.real.sum() / eigenvalues.abs().sum())
    assert ours.to_dict() == pytest.approx(hand, abs=1e-6)
    with pytest.raises(mhsa.UnsupportedModelError, match="no next-token head"):
        ov_top_tokens("L0H0", lm)


@pytest.mark.slow
def test_top_tokens_are_the_largest_entries_of_the_circuits_rows(tmp_path_factory):
    lm = _small("GPT-2 family", tmp_path_factory.mktemp)
    emb, w_v, w_o, w_u, _, _ = _hand_circuits(lm)["L1H2"]
    full = emb @ w_v @ w_o @ w_u
    ours = ov_top_tokens("L1H2", lm, tokens=[7, 40], k=4)
    names = lm.tokenizer.convert_ids_to_tokens
    for token in (7, 40):
        top = full[token].topk(4)
        rows = ours[ours["input"] == names(token)]
        assert list(rows["output"]) == names(top.indices.tolist())
        assert list(rows["score"]) == pytest.approx(top.values.tolist(), rel=1e-9)
        assert list(rows["copies"]) == [i == token for i in top.indices.tolist()]
    with pytest.raises(mhsa.InputError, match="There is no head L2H0"):
        ov_top_tokens("L2H0", lm)
    with pytest.raises(mhsa.InputError, match="not a token"):
        ov_top_tokens("L0H0", lm, tokens=["no-such-token-here"])
    with pytest.raises(mhsa.InputError, match="no token 500"):
        ov_top_tokens("L0H0", lm, tokens=[500])


@pytest.mark.slow
def test_positional_pattern_of_learned_positions_by_hand(tmp_path_factory):
    lm = _small("GPT-2 family", tmp_path_factory.mktemp)
    n = 12
    ours = qk_positional_scores(lm, positions=n)
    pos = lm.model.wpe.weight.detach().double()[:n]
    pos = pos - pos.mean(1, keepdim=True)
    for label, (_, _, _, _, w_q, w_k) in _hand_circuits(lm).items():
        layer, head = mhsa.parse_head_label(label)
        scores = pos @ w_q @ w_k.T @ pos.T / math.sqrt(w_q.shape[1])
        pattern = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):  # softmax over the keys 0 .. i
            row = torch.exp(scores[i, : i + 1] - scores[i, : i + 1].max())
            pattern[i, : i + 1] = row / row.sum()
        assert ours.pattern[layer, head] == pytest.approx(pattern.numpy(), abs=1e-6)
        previous = sum(float(pattern[i, i - 1]) for i in range(1, n)) / (n - 1)
        assert ours.previous_token[label] == pytest.approx(previous, abs=1e-6)


def test_rotary_models_have_no_positional_pattern(tiny_llama_path: str):
    with pytest.raises(mhsa.UnsupportedModelError, match="rotary positions"):
        qk_positional_scores(tiny_llama_path)


def test_positional_pattern_of_a_post_norm_encoder_by_hand(tmp_path):
    """A tiny BERT (norm weights moved off 1): each row of its position embeddings through the
    embeddings' LayerNorm alone (``torch.nn.functional.layer_norm``, no bias), then each head's
    query and key rows of the plain model's ``BertSelfAttention``; softmax over every key."""
    from tests.tiny import moved_off_init, tiny_bert

    torch.manual_seed(0)
    model = moved_off_init(tiny_bert("BertModel", positions=64, initializer_range=0.4))
    lm = mhsa.load_model(save_tiny(tmp_path / "bert", model), device="cpu")
    n = 12
    ours = qk_positional_scores(lm, positions=n)
    assert ours.reads == "LN(W_pos)" and ours.pattern.shape == (2, 4, n, n)
    norm = model.embeddings.LayerNorm
    pos = model.embeddings.position_embeddings.weight.detach().double()[:n]
    weight = norm.weight.detach().double()
    pos = torch.nn.functional.layer_norm(pos, (pos.shape[1],), weight, None, norm.eps)
    d = model.config.hidden_size // model.config.num_attention_heads
    for layer, block in enumerate(model.encoder.layer):
        attention = block.attention.self
        for head in range(model.config.num_attention_heads):
            rows = slice(head * d, (head + 1) * d)
            q = pos @ attention.query.weight.detach().double()[rows].T
            k = pos @ attention.key.weight.detach().double()[rows].T
            scores = q @ k.T / math.sqrt(d)
            pattern = torch.exp(scores - scores.max(1, keepdim=True).values)
            pattern = pattern / pattern.sum(1, keepdim=True)
            assert ours.pattern[layer, head] == pytest.approx(pattern.numpy(), abs=1e-6)
            previous = sum(float(pattern[i, i - 1]) for i in range(1, n)) / (n - 1)
            label = f"L{layer}H{head}"
            assert ours.previous_token[label] == pytest.approx(previous, abs=1e-6)
    assert float(ours.pattern.std()) > 1e-3  # not uniform: positions tell the keys apart


def test_minilm_has_a_finite_positional_pattern(minilm):
    ours = qk_positional_scores(minilm)
    assert ours.pattern.shape == (6, 12, 64, 64)
    assert np.isfinite(ours.pattern).all() and np.isfinite(ours.previous_token).all()
    np.testing.assert_allclose(ours.pattern.sum(-1), 1.0, atol=1e-5)
    assert (ours.pattern[..., 0, 1:] > 0).all()  # no causal mask: a query reads later keys


def test_encoders_that_project_their_embeddings_have_no_positional_pattern(tmp_path_factory):
    from tests.tiny_families import loaded_tiny

    lm = loaded_tiny("ALBERT", tmp_path_factory.mktemp)
    with pytest.raises(mhsa.UnsupportedModelError, match="projects the embeddings"):
        qk_positional_scores(lm)

"""``qk_attribution`` (a head's scores split into pairs of residual parts) against the model
itself: the plain transformers model (its own attention blocks, not our module) with
``torch.nn.functional.softmax`` observed, whose input in eager attention is the scaled score
(soft-capped for Gemma 2) plus the mask, on a tiny random model of every family the residual
decompositions run (pre-norm decoders, post-norm encoders); on MiniLM the scores from its own
query and key projections, hooked; one term (an earlier head on the key side) by hand on GPT-2
and on BERTs; the refusals; and the induction head of ``toy:induction`` explained.
"""

from __future__ import annotations

import math

import pytest
import torch

import mhsa
from mhsa.analysis.qk_attribution import layer_sources, qk_attribution
from mhsa.analysis.weights import ov_copying_scores
from tests.tiny import moved_off_init, save_tiny
from tests.tiny_families import TINY_FAMILIES, loaded_tiny

TEXT = "the cat sat on the mat and the dog sat on the rug"
#: the post-norm encoders (split through their chain of frozen norms)
ENCODERS = ["BERT family", "DistilBERT", "ALBERT"]
#: the encoder-decoders and the pre-norm encoder ModernBERT
#: (tests/test_qk_attribution_families.py)
OTHERS = ["BART family", "T5 family", "ModernBERT"]
#: every other tiny family is a pre-norm decoder (16 layouts)
DECODERS = [name for name in TINY_FAMILIES if name not in OTHERS and name not in ENCODERS]


def _own_softmax_inputs(lm: mhsa.engine.LoadedModel, text: str, monkeypatch) -> list[torch.Tensor]:
    """Per attention layer, what the model's own eager attention gives softmax ``[H, T, T]``."""
    seen: list[torch.Tensor] = []
    softmax = torch.nn.functional.softmax

    def observed(scores: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if scores.dim() == 4 and scores.shape[-1] == scores.shape[-2]:
            seen.append(scores.detach().double()[0])
        return softmax(scores, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "softmax", observed)
    inputs = lm.tokenizer(text, return_tensors="pt")
    with torch.inference_mode(), lm.lock:
        (lm.head_model or lm.model)(**inputs)
    monkeypatch.undo()
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("name", DECODERS)
def test_terms_sum_to_the_models_own_score(name: str, tmp_path_factory, monkeypatch):
    lm = loaded_tiny(name, tmp_path_factory.mktemp)
    layer, head = lm.config.num_hidden_layers - 1, 1
    frame = qk_attribution(TEXT, f"L{layer}H{head}", model=lm)
    own = _own_softmax_inputs(lm, TEXT, monkeypatch)[layer][head]  # (T, T)
    query = frame.attrs["query"]
    assert own.shape[0] == len(frame.attrs["tokens"]) == query + 1
    summed = torch.tensor(frame.groupby("key")["score"].sum().sort_index().to_numpy())
    cap = getattr(lm.config, "attn_logit_softcapping", None)
    if cap is not None:  # Gemma 2: the model gives softmax c tanh(score / c) + mask
        summed = cap * torch.tanh(summed / cap)
    allowed = own[query] > -1e4  # outside a sliding window: masked
    assert int(allowed.sum()) >= 4
    scale = float(own[query][allowed].abs().max())
    assert summed[allowed].numpy() == pytest.approx(own[query][allowed].numpy(), abs=1e-4 * scale)
    sources = frame.attrs["sources"]
    per_pair = frame.groupby(["query_source", "key_source"])["score"].sum().abs()
    assert len(sources) == 1 + layer * (lm.config.num_attention_heads + 1) + 1
    assert (per_pair > 1e-3 * per_pair.max()).sum() > 10  # many parts matter, not one


def test_a_head_on_the_key_side_by_hand(tmp_path_factory):
    """Term (input, L0H2) of L1H1 from the plain GPT-2: layer 0's head output ``A_h V_h W_O^h``
    (its probabilities and ln_1 from the model), layer 1's ln_1 frozen at the stream entering
    it (the model's hidden state), then ``W_Q``, ``W_K`` of c_attn's columns."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=4)
    config.initializer_range = 0.3  # sharp heads: terms far from 0
    model = moved_off_init(transformers.GPT2LMHeadModel(config))
    lm = mhsa.load_model(save_tiny(tmp_path_factory.mktemp("gpt2-sharp"), model), device="cpu")
    text = "the cat sat on the mat"
    frame = qk_attribution(text, "L1H1", model=lm, query=4)
    inputs = lm.tokenizer(text, return_tensors="pt")
    with torch.inference_mode():
        out = lm.model(**inputs, output_attentions=True, output_hidden_states=True)
    blocks, d_model = lm.model.h, lm.config.n_embd
    d = d_model // lm.config.n_head
    x0, x1 = out.hidden_states[0][0].double(), out.hidden_states[1][0].double()
    w0 = blocks[0].attn.c_attn.weight.detach().double()  # Conv1D (D, 3D): x @ w
    b0 = blocks[0].attn.c_attn.bias.detach().double()
    ln0 = blocks[0].ln_1
    normed0 = torch.nn.functional.layer_norm(
        x0, (d_model,), ln0.weight.double(), ln0.bias.double(), ln0.eps
    )
    cols = slice(2 * d_model + 2 * d, 2 * d_model + 3 * d)  # head 2's values
    v = normed0 @ w0[:, cols] + b0[cols]
    z = out.attentions[0][0, 2].double() @ v  # (T, Dh)
    o = z @ blocks[0].attn.c_proj.weight.detach().double()[2 * d : 3 * d]  # (T, D)
    ln1 = blocks[1].ln_1
    sigma = torch.sqrt(x1.var(-1, unbiased=False, keepdim=True) + ln1.eps)
    w1 = blocks[1].attn.c_attn.weight.detach().double()
    key_part = ((o - o.mean(-1, keepdim=True)) / sigma * ln1.weight.double()) @ w1[
        :, d_model + d : d_model + 2 * d
    ]
    query_part = ((x0 - x0.mean(-1, keepdim=True)) / sigma * ln1.weight.double()) @ w1[:, d : 2 * d]
    hand = query_part[4] @ key_part[:5].T / math.sqrt(d)
    ours = frame[(frame.query_source == "input") & (frame.key_source == "L0H2")]
    assert list(ours["key"]) == [0, 1, 2, 3, 4]
    assert float(hand.abs().max()) > 1e-2
    assert ours["score"].to_numpy() == pytest.approx(
        hand.numpy(), abs=1e-5 * float(hand.abs().max())
    )


@pytest.mark.parametrize("name", ENCODERS)
def test_post_norm_terms_sum_to_the_models_own_score(name: str, tmp_path_factory, monkeypatch):
    """Every key of an encoder (no mask), at a query inside the text, in its last layer (the
    stream through every norm of the layers below) and its first (input and bias alone)."""
    lm = loaded_tiny(name, tmp_path_factory.mktemp)
    own = _own_softmax_inputs(lm, TEXT, monkeypatch)
    last = len(own) - 1
    for layer, head, query in ((last, 1, 4), (0, 2, 0)):
        frame = qk_attribution(TEXT, f"L{layer}H{head}", model=lm, query=query)
        assert frame.attrs["causal"] is False
        theirs = own[layer][head][query]  # (T,)
        assert len(theirs) == len(frame.attrs["tokens"]) > query + 1  # keys after it too
        summed = frame.groupby("key", observed=True)["score"].sum().sort_index().to_numpy()
        scale = float(theirs.abs().max())
        assert scale > 1e-2
        assert summed == pytest.approx(theirs.numpy(), abs=1e-4 * scale)
    frame = qk_attribution(TEXT, f"L{last}H1", model=lm)
    sources = frame.attrs["sources"]
    assert sources[0] == "input" and sources[-1] == "bias"
    assert len(sources) == 1 + last * (lm.config.num_attention_heads + 1) + 1


def _hooked_scores(lm: mhsa.engine.LoadedModel, text: str, layer: int) -> torch.Tensor:
    """``q k^T / sqrt(d_head)`` per head ``[H, T, T]`` from the query and key projections of
    the plain BERT's layer ``layer`` (``BertSelfAttention.query`` / ``.key``), hooked."""
    seen: dict[str, torch.Tensor] = {}
    attention = lm.model.encoder.layer[layer].attention.self
    handles = [
        getattr(attention, name).register_forward_hook(
            lambda _m, _a, out, name=name: seen.__setitem__(name, out[0].double())
        )
        for name in ("query", "key")
    ]
    try:
        with torch.inference_mode(), lm.lock:
            lm.model(**lm.tokenizer(text, return_tensors="pt"))
    finally:
        for handle in handles:
            handle.remove()
    h = lm.config.num_attention_heads
    q, k = (seen[n].view(seen[n].shape[0], h, -1).transpose(0, 1) for n in ("query", "key"))
    return q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])


def test_minilm_terms_sum_to_its_own_hooked_scores(minilm):
    text = "The quick brown fox jumps over the lazy dog because it was bored."
    for layer, head, query in ((5, 7, 3), (2, 0, 9)):
        sources = layer_sources(text, layer, model=minilm)
        frame = qk_attribution(sources, (layer, head), model=minilm, query=query)
        theirs = _hooked_scores(minilm, text, layer)[head, query]  # (T,)
        summed = frame.groupby("key", observed=True)["score"].sum().sort_index().to_numpy()
        scale = float(theirs.abs().max())
        assert len(summed) == len(theirs) == len(sources.tokens)
        assert summed == pytest.approx(theirs.numpy(), abs=1e-4 * scale)
        # the layer's sources serve every head and query of it as the text itself does
        again = qk_attribution(text, (layer, head), model=minilm, query=query)
        assert again["score"].to_numpy() == pytest.approx(frame["score"].to_numpy(), abs=1e-9)
    with pytest.raises(mhsa.InputError, match="enter layer 2"):
        qk_attribution(sources, "L3H0", model=minilm)


def _bert_term_by_hand(lm: mhsa.engine.LoadedModel, text: str, query: int) -> torch.Tensor:
    """Term (input, L0H2) of L1H1 of a plain BERT at ``query`` over every key, from hooks:
    layer 0's head 2 output ``A_2 V_2 W_O^2`` (its probabilities from the model), each
    LayerNorm (layer 0's after the attention and after the MLP) frozen at the input the model
    gave it, the embeddings' LayerNorm bias left out of ``input``; then layer 1's ``W_Q``,
    ``W_K`` rows of head 1."""
    bert = lm.model
    layer0, layer1 = bert.encoder.layer[0], bert.encoder.layer[1]
    norms = {"a": layer0.attention.output.LayerNorm, "m": layer0.output.LayerNorm}
    given: dict[str, torch.Tensor] = {}
    handles = [
        norm.register_forward_hook(
            lambda _m, args, _o, name=name: given.__setitem__(name, args[0][0].double())
        )
        for name, norm in norms.items()
    ]
    try:
        with torch.inference_mode():
            out = bert(
                **lm.tokenizer(text, return_tensors="pt"),
                output_attentions=True,
                output_hidden_states=True,
            )
    finally:
        for handle in handles:
            handle.remove()
    d = lm.config.hidden_size // lm.config.num_attention_heads
    x0 = out.hidden_states[0][0].double()
    value = layer0.attention.self.value
    v = x0 @ value.weight.double()[2 * d : 3 * d].T + value.bias.double()[2 * d : 3 * d]
    z = out.attentions[0][0, 2].double() @ v  # (T, Dh)
    written = z @ layer0.attention.output.dense.weight.double()[:, 2 * d : 3 * d].T  # (T, D)
    embedding_input = x0 - bert.embeddings.LayerNorm.bias.double()

    def through(x: torch.Tensor) -> torch.Tensor:  # LN_a then LN_m, scales frozen, no beta
        for name, norm in norms.items():
            sigma = torch.sqrt(given[name].var(-1, unbiased=False, keepdim=True) + norm.eps)
            x = (x - x.mean(-1, keepdim=True)) / sigma * norm.weight.double()
        return x

    w_q = layer1.attention.self.query.weight.double()[d : 2 * d]  # head 1's rows
    w_k = layer1.attention.self.key.weight.double()[d : 2 * d]
    query_part = through(embedding_input)[query] @ w_q.T
    key_part = through(written) @ w_k.T  # (T, Dh)
    return key_part @ query_part / math.sqrt(d)


@pytest.mark.parametrize("which", ["tiny", "minilm"])
def test_a_head_on_the_key_side_by_hand_on_bert(which, tiny_bert_sharp_path, minilm):
    lm = minilm if which == "minilm" else mhsa.load_model(tiny_bert_sharp_path, device="cpu")
    text = "the cat sat on the mat"
    frame = qk_attribution(text, "L1H1", model=lm, query=3)
    hand = _bert_term_by_hand(lm, text, 3)
    ours = frame[(frame.query_source == "input") & (frame.key_source == "L0H2")]
    assert list(ours["key"]) == list(range(len(frame.attrs["tokens"])))
    assert float(hand.abs().max()) > 1e-2
    assert ours["score"].to_numpy() == pytest.approx(
        hand.numpy(), abs=1e-5 * float(hand.abs().max())
    )


def test_bad_heads_and_queries_are_refused(tiny_gpt2_path: str):
    with pytest.raises(mhsa.InputError, match="There is no head L7H0"):
        qk_attribution(TEXT, "L7H0", model=tiny_gpt2_path)
    with pytest.raises(mhsa.InputError, match="not a head"):
        qk_attribution(TEXT, "layer one", model=tiny_gpt2_path)
    with pytest.raises(mhsa.InputError, match="no query position 99"):
        qk_attribution(TEXT, "L1H0", model=tiny_gpt2_path, query=99)
    with pytest.raises(mhsa.InputError, match="no query position -1"):
        qk_attribution(TEXT, "L1H0", model=tiny_gpt2_path, query=-1)


INDUCTION = "ro te mi bu gu ka be pa ku pi do ne re ro te mi bu gu ka be"


@pytest.mark.slow
def test_the_induction_head_of_toy_induction_explained():
    """The head of layer 1 that attends most to the token after the earlier "be" (the
    induction head, read off the attention) is explained by K-composition with the layer-0
    head that attends most to the previous token (read off the attention too), and copies."""
    result = mhsa.attend(INDUCTION, model="toy:induction")
    tokens = list(result.tokens)
    query = len(tokens) - 1
    target = tokens.index("be") + 1  # the token after the earlier occurrence
    attention = result.attention
    induction = int(attention[1, :, query, target].argmax())
    previous = int(
        max(range(attention.shape[1]), key=lambda h: attention[0, h].diagonal(-1).mean())
    )
    frame = qk_attribution(INDUCTION, f"L1H{induction}", model="toy:induction")
    top_key = int(frame.groupby("key")["score"].sum().idxmax())
    assert top_key == target
    at_key = frame[frame.key == top_key].sort_values("score", ascending=False)
    largest = at_key.iloc[0]
    assert (largest.query_source, largest.key_source) == ("input", f"L0H{previous}")
    assert ov_copying_scores("toy:induction")[f"L1H{induction}"] > 0.9


def test_a_residual_pass_can_skip_all_but_the_last_logits():
    from mhsa.engine.stream.residual import residual_pass

    full = residual_pass(INDUCTION, model="toy:induction")
    last = residual_pass(INDUCTION, model="toy:induction", all_logits=False)
    assert full.logits.shape[0] == len(full.tokens) > 1 and last.logits.shape[0] == 1
    torch.testing.assert_close(last.logits[0], full.logits[-1])
    torch.testing.assert_close(last.resid_pre[1], full.resid_pre[1])

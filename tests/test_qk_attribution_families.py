"""``qk_attribution`` on the families outside one pre-norm decoder or post-norm encoder: the
pre-norm encoder ModernBERT and the encoder-decoders (T5, BART) against the model itself (its
own rotated queries and keys, hooked; the plain model's softmax input), and one term of each
computed by hand from hooks on the Hugging Face modules; cross-attention refused."""

from __future__ import annotations

import math

import pytest
import torch

import mhsa
from mhsa.analysis.qk_attribution import layer_sources, qk_attribution
from tests.tiny import moved_off_init, save_tiny, tiny_seq2seq
from tests.tiny_families import loaded_tiny

TEXT = "the cat sat on the mat and the dog sat on the rug"
#: an encoder-decoder's target: its decoder reads it teacher-forced
TARGET = "a dog sat on a rug"


def _summed(frame) -> torch.Tensor:
    return torch.tensor(frame.groupby("key", observed=True)["score"].sum().sort_index().to_numpy())


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Equal at every key within 1e-4 of the largest |score|."""
    assert len(ours) == len(theirs)
    scale = float(theirs.abs().max())
    assert scale > 1e-2
    assert ours.numpy() == pytest.approx(theirs.numpy(), abs=1e-4 * scale)


# --- ModernBERT: a pre-norm encoder ------------------------------------------------------------


def _modernbert_hooked(lm: mhsa.engine.LoadedModel, text: str, monkeypatch) -> dict[str, list]:
    """Per layer, from the plain ModernBERT: its rotated queries and keys ``[H, T, Dh]`` (the
    model's own ``apply_rotary_pos_emb``, observed), each layer's input stream, its
    ``(cos, sin)`` and its attention probabilities."""
    from transformers.models.modernbert import modeling_modernbert as mb

    seen: dict[str, list] = {"q": [], "k": [], "x": [], "rope": []}
    rotate = mb.apply_rotary_pos_emb

    def observed(q, k, cos, sin, *args, **kwargs):
        q, k = rotate(q, k, cos, sin, *args, **kwargs)
        seen["q"].append(q[0].double())
        seen["k"].append(k[0].double())
        return q, k

    def entering(_m, args, kwargs):
        seen["x"].append((args[0] if args else kwargs["hidden_states"])[0].double())
        seen["rope"].append(kwargs["position_embeddings"])

    monkeypatch.setattr(mb, "apply_rotary_pos_emb", observed)
    handles = [
        layer.register_forward_pre_hook(entering, with_kwargs=True) for layer in lm.model.layers
    ]
    try:
        with torch.inference_mode(), lm.lock:
            out = lm.model(**lm.tokenizer(text, return_tensors="pt"), output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
        monkeypatch.undo()
    seen["attentions"] = [a[0].double() for a in out.attentions]
    return seen


def test_modernbert_terms_sum_to_its_own_rotated_scores(tmp_path_factory, monkeypatch):
    """Every key (those outside a local layer's window too: the score is ``q . k`` scaled,
    the window a mask), in a global layer and a local one, at queries inside the text."""
    lm = loaded_tiny("ModernBERT", tmp_path_factory.mktemp)
    seen = _modernbert_hooked(lm, TEXT, monkeypatch)
    d_head = lm.config.hidden_size // lm.config.num_attention_heads
    layers = lm.config.layer_types
    for layer, head, query in ((2, 1, 5), (1, 3, 9), (0, 2, 0)):
        frame = qk_attribution(TEXT, f"L{layer}H{head}", model=lm, query=query)
        assert frame.attrs["causal"] is False
        theirs = seen["q"][layer][head, query] @ seen["k"][layer][head].T * d_head**-0.5
        _close(_summed(frame), theirs)
        hidden = [k for k, p in enumerate(seen["attentions"][layer][head, query]) if p == 0]
        assert frame.attrs["masked_keys"] == hidden
        assert bool(hidden) == (layers[layer] == "sliding_attention")
    assert frame.attrs["sources"] == ["input", "bias"]  # layer 0: nothing written yet


def test_a_head_on_the_key_side_by_hand_on_modernbert(tmp_path_factory, monkeypatch):
    """Term (input, L0H2) of L1H1: layer 0's head 2 output ``A_2 V_2 W_O^2`` (its
    probabilities and values from the model's own ``Wqkv``, no norm before layer 0), layer
    1's ``attn_norm`` frozen at the stream entering it, its ``Wqkv`` rows of head 1, the
    model's own rotation at each side."""
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    lm = loaded_tiny("ModernBERT", tmp_path_factory.mktemp)
    seen = _modernbert_hooked(lm, TEXT, monkeypatch)
    layer0, layer1 = lm.model.layers[0], lm.model.layers[1]
    width = lm.config.hidden_size
    d = width // lm.config.num_attention_heads
    x0, x1 = seen["x"][0], seen["x"][1]
    w0 = layer0.attn.Wqkv.weight.double()  # (3 D, D): queries, keys, values
    v = x0 @ w0[2 * width + 2 * d : 2 * width + 3 * d].T  # head 2's values (no bias)
    written = (seen["attentions"][0][2] @ v) @ layer0.attn.Wo.weight.double()[:, 2 * d : 3 * d].T
    norm = layer1.attn_norm
    sigma = torch.sqrt(x1.var(-1, unbiased=False, keepdim=True) + norm.eps)

    def normed(part: torch.Tensor) -> torch.Tensor:  # the frozen LayerNorm, no bias
        return (part - part.mean(-1, keepdim=True)) / sigma * norm.weight.double()

    w1 = layer1.attn.Wqkv.weight.double()
    q = normed(x0) @ w1[d : 2 * d].T  # (T, Dh) head 1's queries from the input
    k = normed(written) @ w1[width + d : width + 2 * d].T
    cos, sin = (t.double() for t in seen["rope"][1])
    q, k = apply_rotary_pos_emb(q[None, None], k[None, None], cos, sin, unsqueeze_dim=1)
    query = 6
    hand = k[0, 0] @ q[0, 0, query] * d**-0.5  # (T,)
    frame = qk_attribution(TEXT, "L1H1", model=lm, query=query)
    ours = frame[(frame.query_source == "input") & (frame.key_source == "L0H2")]
    assert list(ours["key"]) == list(range(len(frame.attrs["tokens"])))
    assert float(hand.abs().max()) > 1e-2
    assert ours["score"].to_numpy() == pytest.approx(
        hand.numpy(), abs=1e-5 * float(hand.abs().max())
    )


# --- encoder-decoders ----------------------------------------------------------------------------


def _seq2seq_inputs(lm: mhsa.engine.LoadedModel) -> dict[str, torch.Tensor]:
    """The text for the encoder, the target shifted right for the decoder (the model's own
    ``prepare_decoder_input_ids_from_labels``: teacher forcing)."""
    inputs = dict(lm.tokenizer(TEXT, return_tensors="pt"))
    labels = lm.tokenizer(TARGET, return_tensors="pt")["input_ids"]
    inputs["decoder_input_ids"] = lm.head_model.prepare_decoder_input_ids_from_labels(labels=labels)
    return {k: v for k, v in inputs.items() if k != "token_type_ids"}


def _own_softmax_inputs(lm: mhsa.engine.LoadedModel, monkeypatch) -> dict[str, torch.Tensor]:
    """Per attention (``E0``, ``E1``, ``D0``, ``C0``, ``D1``, ``C1``: the order the plain
    model calls them), what its eager attention gives softmax ``[H, T, S]``: the score, T5's
    position bias, the mask."""
    seen: list[torch.Tensor] = []
    softmax = torch.nn.functional.softmax

    def observed(scores: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if scores.dim() == 4:
            seen.append(scores.detach().double()[0])
        return softmax(scores, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "softmax", observed)
    with torch.inference_mode(), lm.lock:
        lm.model(**_seq2seq_inputs(lm))
    monkeypatch.undo()
    names = ["E0", "E1", "D0", "C0", "D1", "C1"]
    assert len(seen) == len(names)
    return dict(zip(names, seen, strict=True))


@pytest.mark.parametrize("name", ["T5 family", "BART family"])
def test_seq2seq_terms_sum_to_the_models_own_score(name: str, tmp_path_factory, monkeypatch):
    """Encoder heads over every key, decoder self-attention heads over the keys up to the
    query, in the first layer (input and bias alone; T5's position term) and the last (every
    earlier head, cross-attention heads too, and MLP)."""
    lm = loaded_tiny(name, tmp_path_factory.mktemp)
    own = _own_softmax_inputs(lm, monkeypatch)
    decoder_ids = _seq2seq_inputs(lm)["decoder_input_ids"][0].tolist()
    for label, query in (("E1H1", 4), ("E0H2", 0), ("D1H1", 3), ("D0H2", None), ("D1H3", 0)):
        frame = qk_attribution(TEXT, label, model=lm, query=query, text_pair=TARGET)
        row = frame.attrs["query"]
        causal = label[0] == "D"
        assert frame.attrs["causal"] is causal and frame.attrs["head"] == label
        theirs = own[label[:2]][int(label[-1]), row]
        _close(_summed(frame), theirs[: row + 1] if causal else theirs)
        if causal:
            assert frame.attrs["tokens"] == tuple(lm.tokenizer.convert_ids_to_tokens(decoder_ids))
    sources = frame.attrs["sources"]
    heads = lm.config.num_heads if name == "T5 family" else lm.config.decoder_attention_heads
    expected = ["input", *[f"{k}0H{h}" for k in "DC" for h in range(heads)], "M0", "bias"]
    assert sources == expected + (["position"] if name == "T5 family" else [])


def test_a_cross_head_on_the_key_side_by_hand_on_t5(tmp_path_factory):
    """Term (input, C0H1) of D1H2 of the plain T5: cross-attention head 1's output in the
    decoder's stream (its probabilities from the model, its values from ``EncDecAttention.v``
    of the encoder's output, hooked), decoder layer 1's RMSNorm frozen at the stream entering
    it; no scaling. And the position term: the model's own ``compute_bias``."""
    lm = loaded_tiny("T5 family", tmp_path_factory.mktemp)
    t5 = lm.model
    seen: dict[str, torch.Tensor] = {}
    blocks = t5.decoder.block
    hooks = [
        (blocks[0], "x0", lambda _m, args, kwargs: seen.__setitem__("x0", args[0][0].double())),
        (blocks[1], "x1", lambda _m, args, kwargs: seen.__setitem__("x1", args[0][0].double())),
    ]
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m, _, hook in hooks]
    cross = blocks[0].layer[1].EncDecAttention
    handles.append(cross.v.register_forward_hook(lambda _m, _a, out: seen.__setitem__("v", out)))
    try:
        with torch.inference_mode():
            out = t5(**_seq2seq_inputs(lm), output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    d = lm.config.d_kv
    v = seen["v"][0].double()[:, d : 2 * d]  # head 1's values of the encoder's tokens
    z = out.cross_attentions[0][0, 1].double() @ v  # (m, Dh)
    written = z @ cross.o.weight.double()[:, d : 2 * d].T  # (m, D)
    norm = blocks[1].layer[0].layer_norm
    rms = torch.rsqrt(seen["x1"].pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    attention = blocks[1].layer[0].SelfAttention
    q = (seen["x0"] * rms * norm.weight.double()) @ attention.q.weight.double()[2 * d : 3 * d].T
    k = (written * rms * norm.weight.double()) @ attention.k.weight.double()[2 * d : 3 * d].T
    query = 5
    hand = k[: query + 1] @ q[query]
    frame = qk_attribution(TEXT, "D1H2", model=lm, query=query, text_pair=TARGET)
    ours = frame[(frame.query_source == "input") & (frame.key_source == "C0H1")]
    assert list(ours["key"]) == list(range(query + 1))
    assert float(hand.abs().max()) > 1e-2
    assert ours["score"].to_numpy() == pytest.approx(
        hand.numpy(), abs=1e-5 * float(hand.abs().max())
    )
    m = len(frame.attrs["tokens"])
    bias = blocks[0].layer[0].SelfAttention.compute_bias(m, m)[0, 2, query, : query + 1]
    position = frame[(frame.query_source == "position") & (frame.key_source == "position")]
    assert position["score"].to_numpy() == pytest.approx(bias.double().numpy(), abs=1e-6)
    assert frame[(frame.query_source == "position") & (frame.key_source != "position")][
        "score"
    ].abs().max() == pytest.approx(0.0, abs=0.0)


def test_an_encoder_head_on_the_key_side_by_hand_on_bart(tmp_path_factory):
    """Term (input, E0H2) of E1H1 of a plain BART (post-norm): encoder layer 0's head 2
    output, its ``self_attn_layer_norm`` and ``final_layer_norm`` frozen at what the model gave
    them (hooked), the ``layernorm_embedding``'s bias left out of ``input``; layer 1's
    ``q_proj``, ``k_proj`` rows of head 1 (their biases are terms of ``bias``), scaled."""
    import transformers

    torch.manual_seed(0)
    config = tiny_seq2seq("bart").config
    config.init_std = 0.3  # sharp heads: terms far from 0
    model = moved_off_init(transformers.BartForConditionalGeneration(config))
    lm = mhsa.load_model(save_tiny(tmp_path_factory.mktemp("bart-sharp"), model), device="cpu")
    encoder = lm.model.encoder
    layer0, layer1 = encoder.layers[0], encoder.layers[1]
    norms = {"a": layer0.self_attn_layer_norm, "f": layer0.final_layer_norm}
    given: dict[str, torch.Tensor] = {}
    handles = [
        norm.register_forward_hook(
            lambda _m, args, _o, name=name: given.__setitem__(name, args[0][0].double())
        )
        for name, norm in norms.items()
    ]
    handles.append(
        layer0.register_forward_pre_hook(
            lambda _m, args, kwargs: given.__setitem__("x0", args[0][0].double()),
            with_kwargs=True,
        )
    )
    try:
        with torch.inference_mode():
            out = lm.model(**_seq2seq_inputs(lm), output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    d = config.d_model // config.encoder_attention_heads
    x0 = given["x0"]
    value = layer0.self_attn.v_proj
    v = x0 @ value.weight.double()[2 * d : 3 * d].T + value.bias.double()[2 * d : 3 * d]
    z = out.encoder_attentions[0][0, 2].double() @ v
    written = z @ layer0.self_attn.out_proj.weight.double()[:, 2 * d : 3 * d].T

    def through(x: torch.Tensor) -> torch.Tensor:  # LN_a then LN_f, scales frozen, no beta
        for name, norm in norms.items():
            sigma = torch.sqrt(given[name].var(-1, unbiased=False, keepdim=True) + norm.eps)
            x = (x - x.mean(-1, keepdim=True)) / sigma * norm.weight.double()
        return x

    embedding_input = x0 - encoder.layernorm_embedding.bias.double()
    w_q = layer1.self_attn.q_proj.weight.double()[d : 2 * d]
    w_k = layer1.self_attn.k_proj.weight.double()[d : 2 * d]
    query = 3
    hand = (through(written) @ w_k.T) @ (through(embedding_input)[query] @ w_q.T) / math.sqrt(d)
    frame = qk_attribution(TEXT, "E1H1", model=lm, query=query, text_pair=TARGET)
    ours = frame[(frame.query_source == "input") & (frame.key_source == "E0H2")]
    assert list(ours["key"]) == list(range(len(frame.attrs["tokens"])))
    assert float(hand.abs().max()) > 1e-2
    assert ours["score"].to_numpy() == pytest.approx(
        hand.numpy(), abs=1e-5 * float(hand.abs().max())
    )


@pytest.mark.parametrize("name", ["T5 family", "BART family"])
def test_cross_attention_and_bad_layers_are_refused(name: str, tmp_path_factory):
    lm = loaded_tiny(name, tmp_path_factory.mktemp)
    with pytest.raises(mhsa.UnsupportedModelError, match="C1H0 is a cross-attention head"):
        qk_attribution(TEXT, "C1H0", model=lm)
    with pytest.raises(mhsa.UnsupportedModelError, match="two different streams"):
        layer_sources(TEXT, "C0", model=lm)
    with pytest.raises(mhsa.InputError, match="There is no head L1H0"):
        qk_attribution(TEXT, "L1H0", model=lm)  # an encoder-decoder's heads are E, D or C
    with pytest.raises(mhsa.InputError, match="no layer 'D7'"):
        layer_sources(TEXT, "D7", model=lm)
    sources = layer_sources(TEXT, "D1", model=lm, text_pair=TARGET)
    with pytest.raises(mhsa.InputError, match="enter layer"):
        qk_attribution(sources, "E1H0", model=lm)
    again = qk_attribution(TEXT, "D1H0", model=lm, text_pair=TARGET)
    assert qk_attribution(sources, "D1H0", model=lm)["score"].to_numpy() == pytest.approx(
        again["score"].to_numpy(), abs=1e-9
    )

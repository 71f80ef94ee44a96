"""Circuits on post-norm encoders (``mhsa.circuits.postnorm``): every score against a hand
computation on the plain transformers BERT model (its own attention, LayerNorm and MLP modules,
with torch hooks; not our module, not our copy code): each target's own copy of the post-norm
chain rebuilt by hand from the run's node outputs; EAP and EAP-IG by autograd through it, exact
scores by patching one copy. The metric is patching's: the cosine of the sentence embedding
(the mean of the last hidden state) with the clean run's or a second sentence's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mhsa
from mhsa.circuits import discovery as circuits
from tests.tiny import perturbed_biases, save_tiny, tiny_bert

CLEAN, CORRUPTED = "the cat sat on the mat", "the dog sat on the rug"
PAIR = "a bird flew over the house"
HEADS, WIDTH = 4, 32


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> mhsa.engine.LoadedModel:
    """BERT (3 layers of 4 heads, with its masked-LM head) with weights of std 0.4 and random
    biases and norm weights: the corrupted words move the sentence embedding visibly."""
    torch.manual_seed(0)
    model = tiny_bert("BertForMaskedLM", layers=3, positions=64, initializer_range=0.4)
    folder = save_tiny(tmp_path_factory.mktemp("bert"), model)
    return perturbed_biases(mhsa.load_model(folder, device="cpu"))


# --- the plain model, wired by hand -------------------------------------------------------------


def _layers(lm: mhsa.engine.LoadedModel) -> Any:
    return lm.model.encoder.layer


def _copy(lm, acts: Mapping, layer: int, deltas: Mapping, mlp: bool = False) -> torch.Tensor:
    """A target's copy of ``x_layer`` (``mlp``: of ``y_layer``, MLP ``layer``'s input) from the
    run's node outputs ``acts``, with ``deltas[source]`` added to each source as this copy
    reads it, through the model's own LayerNorms."""
    x = acts["input"] + deltas.get("input", 0)
    for j in range(layer + mlp):
        attention = _layers(lm)[j].attention
        names = [mhsa.head_label(j, h) for h in range(HEADS)]
        heads = sum(acts[name] + deltas.get(name, 0) for name in names)
        y = attention.output.LayerNorm(heads + attention.output.dense.bias + x)
        if mlp and j == layer:
            return y
        mlp_out = acts[f"M{j}"] + deltas.get(f"M{j}", 0)
        x = _layers(lm)[j].output.LayerNorm(mlp_out + y)
    return x


def _hand_run(
    lm: mhsa.engine.LoadedModel,
    text: str,
    deltas: Mapping[tuple, Mapping],
    rows: int = 1,
    embeddings: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[Any, torch.Tensor]]:
    """The plain model on ``text``; ``deltas[(target, input)][source]`` added to ``source`` as
    that target's copy reads it (the graph's names: ``("L1H2", "k")``, ``("M1", "")``,
    ``("logits", "")``; sources ``"input"``, ``"L0H1"``, ``"M0"``). Returns the last hidden
    state the logits read and every node output, by name."""
    inputs = {k: v.expand(rows, -1) for k, v in lm.tokenizer(text, return_tensors="pt").items()}
    acts: dict[Any, torch.Tensor] = {}
    d_head = WIDTH // HEADS
    handles = []

    def first_layer(_m, args, kwargs):
        h = embeddings if embeddings is not None else args[0]
        acts["input"] = h
        return (h, *args[1:]), kwargs

    def projection(i: int, part: str, module: torch.nn.Module):
        def hook(_m, _args, out):
            out = out.clone()
            for (node, into), added in deltas.items():
                if into == part and mhsa.parse_head_label(node)[0] == i:
                    head = mhsa.parse_head_label(node)[1]
                    cols = slice(head * d_head, (head + 1) * d_head)
                    out[..., cols] = module.forward(_copy(lm, acts, i, added))[..., cols]
            return out

        return hook

    def head_outputs(i: int):
        def hook(module, args):  # z_h W_O^h: W_O's input and weight split by head
            z = args[0].unflatten(-1, (HEADS, d_head))  # (B, T, H, Dh)
            w_o = module.weight.unflatten(-1, (HEADS, d_head))  # (D, H, Dh)
            for h, out in enumerate(torch.einsum("bthk,dhk->hbtd", z, w_o)):
                acts[mhsa.head_label(i, h)] = out

        return hook

    def mlp_input(i: int):
        def hook(_m, args):
            if (f"M{i}", "") in deltas:
                return (_copy(lm, acts, i, deltas[(f"M{i}", "")], mlp=True),)
            return None

        return hook

    def mlp_output(i: int):
        return lambda _m, _a, out: acts.__setitem__(f"M{i}", out)

    try:
        handles.append(_layers(lm)[0].register_forward_pre_hook(first_layer, with_kwargs=True))
        for i, layer in enumerate(_layers(lm)):
            for part in "qkv":
                module = getattr(
                    layer.attention.self, {"q": "query", "k": "key", "v": "value"}[part]
                )
                handles.append(module.register_forward_hook(projection(i, part, module)))
            dense = layer.attention.output.dense
            handles.append(dense.register_forward_pre_hook(head_outputs(i)))
            handles.append(layer.intermediate.register_forward_pre_hook(mlp_input(i)))
            handles.append(layer.output.dense.register_forward_hook(mlp_output(i)))
        hidden = lm.model(**inputs).last_hidden_state
    finally:
        for handle in handles:
            handle.remove()
    if ("logits", "") in deltas:
        hidden = _copy(lm, acts, len(_layers(lm)), deltas[("logits", "")])
    return hidden, acts


def _embedding(lm: mhsa.engine.LoadedModel, text: str) -> torch.Tensor:
    with torch.no_grad():
        inputs = lm.tokenizer(text, return_tensors="pt")
        return lm.model(**inputs).last_hidden_state.mean(1)[0]


def _metric(hidden: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(hidden.mean(1), reference[None], dim=-1)


def _hand_scores(lm, reference: torch.Tensor, steps: int | None = None) -> dict:
    """EAP (``steps`` None) or EAP-IG of every edge by hand: a zero added to each source as
    each target's copy reads it, and autograd."""
    with torch.no_grad():
        _, clean = _hand_run(lm, CLEAN, {})
        _, corrupted = _hand_run(lm, CORRUPTED, {})
    rows = 1 if steps is None else steps
    edges = circuits.circuit_graph(lm).edges()
    deltas: dict[tuple, dict] = {}
    for row in edges.itertuples():
        zero = torch.zeros(rows, *clean["input"].shape[1:], requires_grad=True)
        deltas.setdefault((row.target, row.input), {})[row.source] = zero
    embeddings = None
    if steps is not None:
        alphas = torch.arange(steps, dtype=torch.float32)[:, None, None] / steps
        embeddings = corrupted["input"] + alphas * (clean["input"] - corrupted["input"])
    hidden, _ = _hand_run(lm, CLEAN, deltas, rows, embeddings)
    zeros = [(t, u, z) for t, by in deltas.items() for u, z in by.items()]
    grads = torch.autograd.grad(_metric(hidden, reference).sum(), [z for *_, z in zeros])
    return {
        (u, t): float(((corrupted[u] - clean[u])[0] * g.sum(0) / rows).sum())
        for (t, u, _), g in zip(zeros, grads, strict=True)
    }


def _compare(frame, hand: dict, tol: float) -> None:
    ours = {(r.source, (r.target, r.input)): r.score for r in frame.itertuples()}
    assert ours.keys() == hand.keys()
    scale = max(abs(v) for v in ours.values())
    assert scale > 1e-3
    for key, value in ours.items():
        assert value == pytest.approx(hand[key], abs=tol * scale), key


# --- scores against the hand computation --------------------------------------------------------


def test_eap_on_the_similarity_target_equals_autograd_through_copies_by_hand(bert):
    frame = mhsa.circuits.edge_attribution(
        CLEAN, CORRUPTED, model=bert, target="similarity", text_pair=PAIR
    )
    # per layer l: 3H head inputs and the MLP read input and the 5 nodes of each layer below
    # (the MLP also its own layer's 4 heads); the logits all 16 sources
    assert len(frame) == 12 * 1 + 5 + 12 * 6 + 10 + 12 * 11 + 15 + 16 == 262
    _compare(frame, _hand_scores(bert, _embedding(bert, PAIR)), 1e-4)
    assert frame.attrs["metric"].startswith("cosine similarity of the run's sentence embedding")


def test_eap_ig_on_the_embedding_target_equals_autograd_by_hand(bert):
    frame = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=bert, method="eap-ig", steps=3)
    _compare(frame, _hand_scores(bert, _embedding(bert, CLEAN), steps=3), 1e-4)
    assert frame.attrs["clean"] == pytest.approx(1, abs=1e-6)
    expected = float(_metric(_embedding(bert, CORRUPTED)[None, None], _embedding(bert, CLEAN)))
    assert frame.attrs["corrupted"] == pytest.approx(expected, abs=1e-5)
    assert frame.attrs["corrupted"] < 0.99


def test_exact_scores_equal_patching_one_copy_by_hand(bert):
    frame = mhsa.circuits.edge_attribution(
        CLEAN, CORRUPTED, model=bert, method="exact", batch_size=64
    )
    reference = _embedding(bert, CLEAN)
    with torch.no_grad():
        _, clean = _hand_run(bert, CLEAN, {})
        _, corrupted = _hand_run(bert, CORRUPTED, {})
        picked = [
            ("L0H1", "L2H3", "k"),
            ("M0", "L2H0", "q"),
            ("L1H2", "M2", ""),
            ("L2H1", "logits", ""),
            ("input", "logits", ""),
            ("M1", "logits", ""),
        ]
        for row in frame.iloc[::9].itertuples():  # every ninth edge: all kinds of them
            picked.append((row.source, row.target, row.input))
        scores = frame.set_index(["source", "target", "input"])["score"]
        for source, target, part in picked:
            patch = {(target, part): {source: corrupted[source] - clean[source]}}
            patched = float(_metric(_hand_run(bert, CLEAN, patch)[0], reference)[0])
            assert scores[(source, target, part)] == pytest.approx(patched - 1, abs=1e-5)
    assert scores[("M2", "logits", "")] < -1e-3  # not all of them near 0
    one = mhsa.circuits.path_patch(CLEAN, CORRUPTED, "L0H1", "L2H3", "k", model=bert)
    assert one.score == pytest.approx(scores[("L0H1", "L2H3", "k")], abs=1e-6)


def test_every_edge_is_faithful_and_no_edge_is_the_corrupted_run(bert):
    every = circuits.circuit_graph(bert).edges()
    for kw in ({}, {"target": "similarity", "text_pair": PAIR}):
        f_all = mhsa.circuits.circuit_faithfulness(CLEAN, CORRUPTED, every, model=bert, **kw)
        f_none = mhsa.circuits.circuit_faithfulness(CLEAN, CORRUPTED, [], model=bert, **kw)
        assert f_all == pytest.approx(1, abs=1e-4) and f_none == pytest.approx(0, abs=1e-4)


def test_faithfulness_curve_runs_on_the_encoder(bert):
    scores = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=bert, method="eap-ig", steps=2)
    curve = mhsa.circuits.faithfulness_curve(CLEAN, CORRUPTED, scores, model=bert, extra=(9,))
    f = curve.points["faithfulness"].to_numpy()
    assert f[0] == pytest.approx(0, abs=1e-4) and f[9] == pytest.approx(1, abs=1e-4)
    nine = mhsa.circuits.circuit_faithfulness(
        CLEAN, CORRUPTED, circuits.top_edges(scores, 9), model=bert
    )
    assert f[10] == pytest.approx(nine, abs=1e-5)
    assert curve.clean == pytest.approx(1, abs=1e-6)


# --- bad input ----------------------------------------------------------------------------------


def test_encoder_targets_are_checked_as_for_patching(bert):
    with pytest.raises(mhsa.InputError, match=r"zero gradient at the clean run.*eap-ig"):
        mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=bert)
    with pytest.raises(mhsa.InputError, match="answer= and wrong= are for causal"):
        mhsa.circuits.edge_attribution(
            CLEAN, CORRUPTED, model=bert, answer="a", wrong="b", method="exact"
        )
    with pytest.raises(mhsa.InputError, match="needs text_pair="):
        mhsa.circuits.path_patch(
            CLEAN, CORRUPTED, "L0H0", "logits", model=bert, target="similarity"
        )
    with pytest.raises(mhsa.InputError, match="patching target"):
        mhsa.circuits.circuit_faithfulness(CLEAN, CORRUPTED, [], model=bert, target="lm-loss")


def test_causal_lms_refuse_the_encoder_targets():
    with pytest.raises(mhsa.InputError, match="target= and text_pair= are for encoders"):
        mhsa.circuits.edge_attribution(
            "ba ke", "ba ko", model="toy:induction", answer="lo", wrong="ba", target="embedding"
        )


def test_an_encoder_outside_the_bert_family_is_refused_naming_the_tools(
    tiny_distilbert_path, tmp_path
):
    from tests.tiny import tiny_family

    torch.manual_seed(0)
    modernbert = save_tiny(tmp_path / "modernbert", tiny_family("modernbert"))  # pre-norm
    for folder in (tiny_distilbert_path, modernbert):
        with pytest.raises(mhsa.UnsupportedModelError, match="BERT family's post-norm") as e:
            mhsa.circuits.circuit_graph(folder)
        assert "Circuits" in str(e.value) and "Patching" in str(e.value)


def test_minilm_runs_end_to_end_with_the_embedding_target(minilm):
    graph = mhsa.circuits.circuit_graph("default")
    per_layer = [36 * (1 + 13 * layer) + (13 + 13 * layer) for layer in range(6)]
    assert (graph.layers, graph.heads, graph.n_edges) == (6, 12, sum(per_layer) + 79)
    scores = mhsa.circuits.edge_attribution(
        "the film was great", "the film was awful", model=minilm, method="eap-ig", steps=2
    )
    assert len(scores) == graph.n_edges
    assert np.isfinite(scores["score"]).all() and scores["score"].abs().max() > 0


@pytest.mark.parametrize("family", ["roberta", "electra"])
def test_the_wired_run_is_the_models_own_forward_in_the_bert_family(family, tmp_path):
    """RoBERTa (its positions from the ids) and ELECTRA (embeddings narrower than the stream,
    projected before layer 0): the metric of both runs is the plain model's cosine, and the
    exact score of an edge equals the hand patch of that copy."""
    import transformers as tf

    torch.manual_seed(0)
    sizes = {
        "vocab_size": 30522,
        "hidden_size": WIDTH,
        "num_hidden_layers": 2,
        "num_attention_heads": HEADS,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "initializer_range": 0.4,
    }
    if family == "roberta":
        model = tf.RobertaModel(tf.RobertaConfig(**sizes, pad_token_id=0))
    else:
        model = tf.ElectraModel(tf.ElectraConfig(**sizes, embedding_size=16))
    lm = mhsa.load_model(save_tiny(tmp_path / family, model), device="cpu")
    kw = {"model": lm, "target": "similarity", "text_pair": PAIR}
    one = mhsa.circuits.path_patch(CLEAN, CORRUPTED, "L0H2", "L1H1", "v", **kw)
    reference = _embedding(lm, PAIR)
    with torch.no_grad():
        clean = _metric(
            lm.model(**lm.tokenizer(CLEAN, return_tensors="pt")).last_hidden_state, reference
        )
        corrupted = _metric(
            lm.model(**lm.tokenizer(CORRUPTED, return_tensors="pt")).last_hidden_state, reference
        )
        _, clean_acts = _hand_run(lm, CLEAN, {})
        _, corrupted_acts = _hand_run(lm, CORRUPTED, {})
        delta = corrupted_acts["L0H2"] - clean_acts["L0H2"]
        patched = _metric(_hand_run(lm, CLEAN, {("L1H1", "v"): {"L0H2": delta}})[0], reference)
    assert one.clean == pytest.approx(float(clean[0]), abs=1e-5)
    assert one.corrupted == pytest.approx(float(corrupted[0]), abs=1e-5)
    assert one.patched == pytest.approx(float(patched[0]), abs=1e-5)
    assert abs(one.score) > 1e-6


def test_rows_beyond_the_copies_memory_budget_run_in_chunks_with_the_same_values(bert, monkeypatch):
    from mhsa.circuits import postnorm as circuit_postnorm

    scores = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=bert, method="eap-ig", steps=3)
    curve = mhsa.circuits.faithfulness_curve(CLEAN, CORRUPTED, scores, model=bert)
    wired = mhsa.circuits.runs.circuit_model(bert)
    assert circuit_postnorm.rows_per_pass(wired, 8, probe=False) > 11  # one pass above
    monkeypatch.setattr(circuit_postnorm, "COPY_BUDGET_BYTES", 1)
    assert circuit_postnorm.rows_per_pass(wired, 8, probe=True) == 1
    chunked = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=bert, method="eap-ig", steps=3)
    np.testing.assert_allclose(chunked["score"], scores["score"], rtol=1e-5, atol=1e-7)
    again = mhsa.circuits.faithfulness_curve(CLEAN, CORRUPTED, scores, model=bert)
    np.testing.assert_allclose(
        again.points["faithfulness"], curve.points["faithfulness"], rtol=1e-5, atol=1e-6
    )


# --- copies only where a target's edges are mixed ----------------------------------------------


def _wired_run(lm: mhsa.engine.LoadedModel, corrupt: np.ndarray) -> tuple[torch.Tensor, list, Any]:
    """The clean text run with ``corrupt [rows, sources, targets]``: the last hidden state the
    logits read, every source's output ``[rows, T, D]`` and the pair."""
    from mhsa.circuits.pairs import circuit_pair
    from mhsa.circuits.runs import CircuitRun, run_circuit

    with lm.lock, torch.inference_mode():
        pair = circuit_pair(lm, CLEAN, CORRUPTED, None, None, None)
        run = CircuitRun(
            pair.graph.upstream, corrupt=torch.as_tensor(corrupt), corrupted=pair.acts_corrupted
        )
        hidden = run_circuit(pair.wired, run, pair.ids(len(corrupt)))
    return hidden, run.acts, pair


@pytest.mark.parametrize("mixed_only", [True, False], ids=["mixed-only", "every-copy"])
def test_a_target_whose_edges_are_all_corrupted_reads_the_corrupted_runs_stream(
    bert, monkeypatch, mixed_only
):
    """The claim ``_Mixed`` rests on, checked on every target's own copy (``every-copy``) and
    on the run that relies on it: a target all of whose edges carry the corrupted outputs reads
    the corrupted forward of the plain model, whatever the row's other edges do. L0H1's only
    source is the input node; the logits read all 16 sources."""
    monkeypatch.setattr("mhsa.circuits.postnorm.COPIES_ONLY_WHERE_MIXED", mixed_only)
    graph = circuits.circuit_graph(bert)
    rng = np.random.default_rng(0)
    corrupt = graph.mask[None] & (rng.random((3, *graph.mask.shape)) < 0.4)
    whole = [("L0H1", p) for p in "qkv"] + [("L2H3", p) for p in "qkv"]
    whole += [("M1", ""), ("logits", "")]
    for target in whole:  # rows 0 and 2: every edge into these; row 1: none
        t = graph.targets.index(target)
        corrupt[[0, 2], :, t], corrupt[1, :, t] = graph.mask[:, t], False
    hidden, acts, _ = _wired_run(bert, corrupt.astype(np.float32))
    with torch.no_grad():
        plain, by_hand = _hand_run(bert, CORRUPTED, {})  # hooks on the plain model
        clean, _ = _hand_run(bert, CLEAN, {})
    for node in ("L0H1", "L2H3", "M1"):
        got = acts[graph.sources.index(node)]
        for row in (0, 2):
            torch.testing.assert_close(got[row], by_hand[node][0], atol=2e-5, rtol=1e-4)
        assert (got[1] - by_hand[node][0]).abs().max() > 1e-3, node  # row 1 is not corrupted
    for row in (0, 2):
        torch.testing.assert_close(hidden[row], plain[0], atol=2e-5, rtol=1e-4)
    assert (hidden[1] - plain[0]).abs().max() > 1e-3
    assert (plain - clean).abs().max() > 1e-2  # the two runs differ where it is checked


@pytest.mark.parametrize("key_bits", [62, 0], ids=["integer-keys", "row-keys"])
def test_copies_only_where_mixed_give_every_copys_values(bert, monkeypatch, key_bits):
    """Rows of every kind: random edges at three densities, the edges from the input and layer
    0 only (copies branch off the corrupted stream at layer 1), those from layer 1 on only
    (they branch off the row's own stream there), one edge, all but one: the values (the metric
    and every node's output) equal those of the run that carries every target's copy, with the
    shared copies told apart by integer keys or (keys too wide) by rows of integers."""
    monkeypatch.setattr("mhsa.circuits.postnorm.KEY_BITS", key_bits)
    graph = circuits.circuit_graph(bert)
    rng = np.random.default_rng(1)
    rows = [graph.mask & (rng.random(graph.mask.shape) < p) for p in (0.05, 0.5, 0.95)]
    early = np.zeros_like(graph.mask)
    early[: graph.sources.index("L1H0")] = True
    rows += [graph.mask & early, graph.mask & ~early]
    one, all_but_one = np.zeros_like(graph.mask), graph.mask.copy()
    one[graph.edge("L0H2", "L2H1", "v")] = True
    all_but_one[graph.edge("M1", "logits")] = False
    corrupt = np.stack([*rows, one, all_but_one]).astype(np.float32)
    runs = {}
    for mixed_only in (True, False):
        monkeypatch.setattr("mhsa.circuits.postnorm.COPIES_ONLY_WHERE_MIXED", mixed_only)
        runs[mixed_only] = _wired_run(bert, corrupt)
    (hidden, acts, pair), (every, every_acts, _) = runs[True], runs[False]
    torch.testing.assert_close(hidden, every, atol=1e-5, rtol=1e-5)
    for got, expected in zip(acts, every_acts, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    m = pair.measure(hidden).numpy()
    assert np.ptp(m) > 1e-2 and np.abs(m - pair.measure(every).numpy()).max() < 1e-6

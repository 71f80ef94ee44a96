"""Circuits (``mhsa.circuits``): edge scores against a hand computation with plain torch hooks
on the transformers model itself (its own attention blocks, not our module): EAP and EAP-IG
against autograd through split q/k/v input copies made by hand, exact scores against path
patching by hand; faithfulness at its two ends; the induction circuit of toy:induction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import mhsa
from mhsa import plots
from mhsa.circuits import discovery as circuits
from tests.circuits_by_hand import hand_run
from tests.tiny import DECODER_SIZES, perturbed_biases, save_tiny

CLEAN, CORRUPTED = "the cat sat on the mat and the cat", "the dog sat on the mat and the dog"
ANSWER, WRONG = "sat", "mat"
#: a repeat; and the same with the first occurrence of its last symbol ("fu") replaced, so the
#: induction head's key at the answer's first occurrence no longer follows "fu"
TOY_CLEAN = "ba ke mo di fu lo ni pa su te ba ke mo di fu"
TOY_CORRUPTED = "ba ke mo di ra lo ni pa su te ba ke mo di fu"
TOY_ANSWER, TOY_WRONG = "lo", "ba"


def _tiny(
    tmp_path_factory: pytest.TempPathFactory, name: str, model: Any
) -> mhsa.engine.LoadedModel:
    """A tiny random model with random biases and norm weights, saved and loaded."""
    folder = save_tiny(tmp_path_factory.mktemp(name), model)
    return perturbed_biases(mhsa.load_model(folder, device="cpu"))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> mhsa.engine.LoadedModel:
    """GPT-2 (2 layers of 4 heads) with weights of std 0.4: its last position feels the
    corrupted tokens (logit differences moving by about 0.2, not 1e-3 as at std 0.02)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=30522, n_positions=64, n_embd=32, n_layer=2, n_head=4, initializer_range=0.4
    )
    return _tiny(tmp_path_factory, "gpt2", GPT2LMHeadModel(config))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> mhsa.engine.LoadedModel:
    """Llama with grouped-query attention (4 query heads, 2 key/value heads), rotary positions
    and biases on the attention projections."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **DECODER_SIZES, num_key_value_heads=2, attention_bias=True, initializer_range=0.2
    )
    return _tiny(tmp_path_factory, "llama", LlamaForCausalLM(config))


@pytest.fixture(scope="module")
def toy() -> mhsa.engine.LoadedModel:
    return mhsa.load_model("toy:induction", device="cpu")


# --- the model's own modules, wired by hand -----------------------------------------------------


def _hand_run(
    lm: mhsa.engine.LoadedModel,
    text: str,
    added: Mapping[tuple, torch.Tensor],
    rows: int = 1,
    embeddings: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[Any, torch.Tensor]]:
    """The plain model on ``text`` with ``added[target]`` added to that target's own copy of
    its input: ``("q"|"k"|"v", layer, head or key/value head)``, ``("M", layer)`` or
    ``("logits",)``; ``embeddings`` (``rows`` of them) in place of the residual entering layer
    0. Returns the logits and every source's output (``"input"``, ``(layer, head)``, ``("M",
    layer)``): ``tests.circuits_by_hand.hand_run``."""
    assert embeddings is None or len(embeddings) == rows
    return hand_run(lm, text, added, embeddings)


def _metric(
    lm: mhsa.engine.LoadedModel, logits: torch.Tensor, answer: str, wrong: str
) -> torch.Tensor:
    a, w = (
        lm.tokenizer(" " + word, add_special_tokens=False)["input_ids"][0]
        for word in (answer, wrong)
    )
    return logits[:, -1, a] - logits[:, -1, w]


def _source(name: str) -> Any:
    if name == "input":
        return "input"
    if name.startswith("M"):
        return ("M", int(name[1:]))
    return mhsa.parse_head_label(name)


def _target(lm: mhsa.engine.LoadedModel, name: str, part: str) -> tuple:
    """The hand run's key of a target; key/value inputs of grouped-query attention are per
    key/value head (the sum over the query heads sharing it)."""
    if name == "logits":
        return ("logits",)
    if name.startswith("M"):
        return ("M", int(name[1:]))
    layer, head = mhsa.parse_head_label(name)
    groups = lm.config.num_attention_heads // getattr(
        lm.config, "num_key_value_heads", lm.config.num_attention_heads
    )
    return (part, layer, head // groups if part in "kv" else head)


def _hand_scores(lm, clean, corrupted, answer, wrong, steps: int | None = None) -> dict:
    """EAP (``steps`` None) or EAP-IG scores by hand: ``{(source, target key): score}``."""
    with torch.no_grad():
        _, clean_acts = _hand_run(lm, clean, {})
        _, corrupted_acts = _hand_run(lm, corrupted, {})
    _, d = clean_acts["input"].shape[1:]
    t = clean_acts["input"].shape[1]
    keys = {_target(lm, n, p) for n, p in circuits.circuit_graph(lm).targets}
    rows = 1 if steps is None else steps
    zeros = {k: torch.zeros(rows, t, d, requires_grad=True) for k in keys}
    embeddings = None
    if steps is not None:
        alphas = torch.arange(steps, dtype=torch.float32)[:, None, None] / steps
        start = corrupted_acts["input"]
        embeddings = start + alphas * (clean_acts["input"] - start)
    logits, _ = _hand_run(lm, clean, zeros, rows, embeddings)
    grads = torch.autograd.grad(_metric(lm, logits, answer, wrong).sum(), list(zeros.values()))
    grad = {k: g.sum(0) / rows for k, g in zip(zeros, grads, strict=True)}
    return {
        (u, k): float(((corrupted_acts[u] - clean_acts[u])[0] * g).sum())
        for u in clean_acts
        for k, g in grad.items()
    }


def _compare(lm, frame, hand: dict, tol: float) -> None:
    ours: dict[tuple, float] = {}
    for row in frame.itertuples():
        key = (_source(row.source), _target(lm, row.target, row.input))
        ours[key] = ours.get(key, 0.0) + row.score  # grouped k/v: summed over query heads
    scale = max(abs(v) for v in ours.values())
    assert scale > 1e-3
    for key, value in ours.items():
        assert value == pytest.approx(hand[key], abs=tol * scale), key


# --- the graph ----------------------------------------------------------------------------------


def test_graph_counts_edges_as_mib():
    # MIB's EDGE_COUNTS["gpt2"]: GPT-2 small, 12 layers of 12 heads
    assert circuits.CircuitGraph(12, 12).n_edges == 32491


def test_graph_of_one_head_lists_its_edges():
    edges = circuits.CircuitGraph(1, 1).edges()
    assert list(edges.itertuples(index=False, name=None)) == [
        ("input", "L0H0", "q"),
        ("input", "L0H0", "k"),
        ("input", "L0H0", "v"),
        ("input", "M0", ""),
        ("L0H0", "M0", ""),
        ("input", "logits", ""),
        ("L0H0", "logits", ""),
        ("M0", "logits", ""),
    ]
    # parallel blocks (GPT-J, GPT-NeoX): a head does not feed its own layer's MLP
    assert ("L0H0", "M0", "") not in set(
        circuits.CircuitGraph(1, 1, parallel=True).edges().itertuples(index=False, name=None)
    )


# --- scores against the hand computation --------------------------------------------------------


@pytest.mark.parametrize("one_pass", [True, False], ids=["pair's pass", "tapped"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_eap_equals_autograd_by_hand(name: str, one_pass: bool, request, monkeypatch):
    """Both ways to the gradients: the pair's own pass with a zero on every target's copy (small
    models), and a plain pass with taps (``mhsa.circuits.taps``, above ``EAP_ONE_PASS_MAX``)."""
    lm = request.getfixturevalue(name)
    if not one_pass:
        monkeypatch.setattr(mhsa.circuits.pairs, "EAP_ONE_PASS_MAX", 0)
    frame = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=lm, answer=ANSWER, wrong=WRONG)
    assert list(frame.columns) == ["source", "target", "input", "score"]
    assert len(frame) == circuits.circuit_graph(lm).n_edges == 110
    _compare(lm, frame, _hand_scores(lm, CLEAN, CORRUPTED, ANSWER, WRONG), 1e-4)


def test_eap_ig_averages_gradients_along_the_embeddings_by_hand(gpt2: mhsa.engine.LoadedModel):
    frame = mhsa.circuits.edge_attribution(
        CLEAN, CORRUPTED, model=gpt2, answer=ANSWER, wrong=WRONG, method="eap-ig", steps=3
    )
    assert frame.attrs["steps"] == 3
    _compare(gpt2, frame, _hand_scores(gpt2, CLEAN, CORRUPTED, ANSWER, WRONG, steps=3), 1e-4)
    # batched in passes of 2 steps: the same scores
    again = mhsa.circuits.edge_attribution(
        CLEAN,
        CORRUPTED,
        model=gpt2,
        answer=ANSWER,
        wrong=WRONG,
        method="eap-ig",
        steps=3,
        batch_size=2,
    )
    np.testing.assert_allclose(again["score"], frame["score"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_taps_give_the_probes_scores_also_inside_inference_mode(llama, method, monkeypatch):
    """The gradients from taps (``mhsa.circuits.taps``) against those from a copy of the
    residual per target (``circuits.TAPPED_GRADIENTS`` off), on grouped-query attention, for
    every edge; and a caller's ``torch.inference_mode()`` around the call changes nothing (the
    IG steps' embeddings are inference tensors there)."""
    monkeypatch.setattr(mhsa.circuits.pairs, "EAP_ONE_PASS_MAX", 0)  # both from their own pass
    kw = {"model": llama, "answer": ANSWER, "wrong": WRONG, "method": method, "steps": 3}
    with torch.inference_mode():
        tapped = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, **kw)
    monkeypatch.setattr(circuits, "TAPPED_GRADIENTS", False)
    copies = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, **kw)
    scale = np.abs(copies["score"]).max()
    assert scale > 1e-3
    np.testing.assert_allclose(tapped["score"], copies["score"], rtol=0, atol=1e-5 * scale)


def test_exact_scores_equal_path_patching_by_hand(gpt2: mhsa.engine.LoadedModel):
    frame = mhsa.circuits.edge_attribution(
        CLEAN, CORRUPTED, model=gpt2, answer=ANSWER, wrong=WRONG, method="exact", batch_size=40
    )
    with torch.no_grad():
        logits, clean_acts = _hand_run(gpt2, CLEAN, {})
        _, corrupted_acts = _hand_run(gpt2, CORRUPTED, {})
        m_clean = float(_metric(gpt2, logits, ANSWER, WRONG)[0])
        for row in frame.iloc[::3].itertuples():  # every third edge: all kinds of them
            u = _source(row.source)
            patch = {_target(gpt2, row.target, row.input): corrupted_acts[u] - clean_acts[u]}
            patched = float(_metric(gpt2, _hand_run(gpt2, CLEAN, patch)[0], ANSWER, WRONG)[0])
            assert row.score == pytest.approx(patched - m_clean, abs=1e-4), row
    one = frame[(frame.source == "L0H2") & (frame.target == "L1H1") & (frame.input == "k")]
    patched = mhsa.circuits.path_patch(
        CLEAN, CORRUPTED, "L0H2", "L1H1", "k", model=gpt2, answer=ANSWER, wrong=WRONG
    )
    assert patched.score == pytest.approx(float(one["score"].iloc[0]), abs=1e-5)
    assert patched.clean == pytest.approx(m_clean, abs=1e-4)


# --- faithfulness -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_every_edge_is_faithful_and_no_edge_is_the_corrupted_run(name, request):
    lm = request.getfixturevalue(name)
    kw = {"model": lm, "answer": ANSWER, "wrong": WRONG}
    every = circuits.circuit_graph(lm).edges()
    assert mhsa.circuits.circuit_faithfulness(CLEAN, CORRUPTED, every, **kw) == pytest.approx(
        1, abs=1e-4
    )
    assert mhsa.circuits.circuit_faithfulness(CLEAN, CORRUPTED, [], **kw) == pytest.approx(
        0, abs=1e-4
    )


def test_faithfulness_curve_is_mibs(gpt2: mhsa.engine.LoadedModel):
    kw = {"model": gpt2, "answer": ANSWER, "wrong": WRONG}
    scores = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, **kw)
    curve = mhsa.circuits.faithfulness_curve(CLEAN, CORRUPTED, scores, extra=(7, 999), **kw)
    points = curve.points
    assert list(points["edges"]) == [0, 0, 0, 1, 2, 5, 11, 22, 55, 110, 7, 110]
    mib = points[points["mib"]]
    x, f = mib["fraction"].to_numpy(), mib["faithfulness"].to_numpy()
    assert curve.cpr == pytest.approx(np.trapezoid(f, x))
    assert curve.cmd == pytest.approx(np.trapezoid(np.abs(1 - f), x))
    assert f[-1] == pytest.approx(1, abs=1e-4) and f[0] == pytest.approx(0, abs=1e-4)
    seven = mhsa.circuits.circuit_faithfulness(
        CLEAN, CORRUPTED, circuits.top_edges(scores, 7), **kw
    )
    assert points["faithfulness"].iloc[10] == pytest.approx(seven, abs=1e-5)


def test_top_masks_of_a_reordered_table_are_top_edges_row_by_row(gpt2: mhsa.engine.LoadedModel):
    """The curve's circuits: a table in another order (with ties) is looked up column-wise and
    each n's mask is the ``selection`` of ``top_edges`` of that table."""
    kw = {"model": gpt2, "answer": ANSWER, "wrong": WRONG}
    scores = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, **kw)
    shuffled = scores.sample(frac=1.0, random_state=3).reset_index(drop=True)
    shuffled.loc[:9, "score"] = shuffled["score"].abs().max()  # ten ties at the top
    graph = circuits.circuit_graph(gpt2)
    counts = (0, 4, 17, len(scores))
    for n, mask in zip(counts, graph.top_masks(shuffled, counts), strict=True):
        assert mask.sum() == n
        np.testing.assert_array_equal(mask, graph.selection(circuits.top_edges(shuffled, n)))
    s, t = graph.indices(shuffled)
    assert [graph.sources[i] for i in s[:5]] == list(shuffled["source"][:5])
    pairs = list(zip(shuffled["target"][:5], shuffled["input"][:5], strict=True))
    assert [graph.targets[i] for i in t[:5]] == pairs
    bad = shuffled.copy()
    bad.loc[5, "source"] = "L9H9"
    with pytest.raises(mhsa.InputError, match="L9H9"):
        graph.indices(bad)


# --- toy:induction: the K-composition edge ------------------------------------------------------


def test_induction_circuit_has_the_previous_token_heads_k_edge(toy: mhsa.engine.LoadedModel):
    previous = mhsa.detect_heads(TOY_CLEAN, "previous token", model=toy)["score"].idxmax()
    induction = mhsa.detect_heads(None, "induction", model=toy)["score"].idxmax()
    assert mhsa.parse_head_label(previous)[0] < mhsa.parse_head_label(induction)[0]
    kw = {"model": toy, "answer": TOY_ANSWER, "wrong": TOY_WRONG}
    scores = mhsa.circuits.edge_attribution(TOY_CLEAN, TOY_CORRUPTED, method="eap-ig", **kw)
    top = circuits.top_edges(scores, 20)
    assert (previous, induction, "k") in set(
        top[["source", "target", "input"]].itertuples(index=False, name=None)
    )
    assert mhsa.circuits.circuit_faithfulness(TOY_CLEAN, TOY_CORRUPTED, top, **kw) >= 0.8


# --- bad input ----------------------------------------------------------------------------------


def test_texts_of_different_lengths_name_both_token_lists(gpt2: mhsa.engine.LoadedModel):
    with pytest.raises(
        mhsa.InputError, match=r"clean: \['\[CLS\]', 'the', 'cat'.*corrupted: .*'big'"
    ):
        mhsa.circuits.edge_attribution(
            "the cat sat", "the big dog sat", model=gpt2, answer=ANSWER, wrong=WRONG
        )


def test_answer_and_wrong_are_checked_as_for_patching(gpt2: mhsa.engine.LoadedModel):
    with pytest.raises(mhsa.InputError, match="give both answer= and wrong="):
        mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=gpt2, answer=ANSWER)
    with pytest.raises(mhsa.InputError, match="exactly one token"):
        mhsa.circuits.edge_attribution(
            CLEAN, CORRUPTED, model=gpt2, answer="unbelievably", wrong=WRONG
        )
    with pytest.raises(mhsa.InputError, match="same token"):
        mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=gpt2, answer=ANSWER, wrong=ANSWER)


def test_unknown_method_steps_and_edges_are_refused(gpt2: mhsa.engine.LoadedModel):
    kw = {"model": gpt2, "answer": ANSWER, "wrong": WRONG}
    with pytest.raises(mhsa.InputError, match="eap, eap-ig, exact"):
        mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, method="acdc", **kw)
    with pytest.raises(mhsa.InputError, match="steps"):
        mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, method="eap-ig", steps=0, **kw)
    with pytest.raises(mhsa.InputError, match="no edge L1H0 -> L0H1"):
        mhsa.circuits.path_patch(CLEAN, CORRUPTED, "L1H0", "L0H1", "q", **kw)
    with pytest.raises(mhsa.InputError, match="No source node"):
        mhsa.circuits.circuit_faithfulness(CLEAN, CORRUPTED, [("L9H0", "logits", "")], **kw)


# --- figures ------------------------------------------------------------------------------------


def test_circuit_figure_draws_each_edge_into_its_input_coloured_by_sign():
    edges = pd.DataFrame(
        {
            "source": ["L0H1", "input", "L1H0"],
            "target": ["L1H0", "L0H1", "logits"],
            "input": ["k", "q", ""],
            "score": [-2.0, 0.5, 1.0],
        }
    )
    fig = plots.circuit_figure(edges, layers=2, heads=4)
    lines = [t for t in fig.data if t.mode == "lines"]
    # drawn weakest first: input -> L0H1 (q), L1H0 -> logits, L0H1 -> L1H0 (k)
    assert [(t.x[0], t.y[0]) for t in lines] == [(1.5, 0.0), (0.0, 3.0), (1.0, 1.0)]
    assert (lines[2].x[1], lines[2].y[1]) == pytest.approx((0.0, 3 - 0.22))  # k: straight below
    assert lines[0].x[1] == pytest.approx(1 - 0.18)  # q: left of the head
    assert (lines[1].x[1], lines[1].y[1]) == (1.5, 5.0)  # the logits, at the top
    # coloured by support, minus the score: -2 carries the clean answer (blue), 1 works
    # against it (red)
    blue, red = (np.array(plotly_rgb(t.line.color)) for t in (lines[2], lines[1]))
    assert red[0] > red[2] and blue[2] > blue[0]
    assert lines[2].line.width > lines[1].line.width > lines[0].line.width
    mids = next(t for t in fig.data if t.name == "edges")
    assert [list(c) for c in mids.customdata][-1] == ["edge", "L0H1", "L1H0", "k"]
    assert list(mids.text) == ["q", "", "k"]
    nodes = next(t for t in fig.data if t.name == "nodes")
    assert ["node", "L1H3"] in [list(c) for c in nodes.customdata]
    assert nodes.text[-1] == fig.layout.yaxis.ticktext[-1] == "logits"
    # an encoder's output node is named for what it is; clicks still carry the graph's name
    named = plots.circuit_figure(edges, layers=2, heads=4, output="last hidden state")
    nodes = next(t for t in named.data if t.name == "nodes")
    assert nodes.text[-1] == named.layout.yaxis.ticktext[-1] == "last hidden state"
    assert list(nodes.customdata[-1]) == ["node", "logits"] and "logits" not in nodes.text


def test_faithfulness_figure_marks_the_chosen_size():
    points = pd.DataFrame(
        {
            "fraction": [*circuits.MIB_PERCENTAGES, 0.25],
            "edges": [0, 0, 0, 1, 2, 5, 10, 20, 50, 100, 25],
            "mib": [True] * 10 + [False],
            "faithfulness": [0, 0, 0, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1, 0.85],
        }
    )
    curve = circuits.FaithfulnessCurve(points, 0.7, 0.3, 2.0, -1.0, 100)
    fig = plots.faithfulness_figure(curve, 25)
    star = next(t for t in fig.data if t.name == "top 25")
    assert (star.x[0], star.y[0]) == (0.25, 0.85)
    assert "CPR 0.700" in fig.layout.title.text and "CMD 0.300" in fig.layout.title.text


def plotly_rgb(color: str) -> tuple[float, ...]:
    """``"rgb(r, g, b)"`` as numbers."""
    return tuple(float(v) for v in color[color.index("(") + 1 : -1].split(","))


# --- during training: ids, and blocks already in place -----------------------------------------


def test_scores_on_ids_inside_a_running_swap_equal_the_texts_scores(toy: mhsa.engine.LoadedModel):
    from mhsa.engine.runs.swap import OurPass, through_our_module, trainable_our_blocks

    kw = {"model": toy, "answer": TOY_ANSWER, "wrong": TOY_WRONG}
    expected = mhsa.circuits.edge_attribution(TOY_CLEAN, TOY_CORRUPTED, **kw)
    ids = [toy.tokenizer(t, return_tensors="pt")["input_ids"] for t in (TOY_CLEAN, TOY_CORRUPTED)]
    a, w = (
        toy.tokenizer(" " + x, add_special_tokens=False)["input_ids"][0]
        for x in kw.values()
        if isinstance(x, str)
    )
    with toy.lock:
        blocks = trainable_our_blocks(toy)
        running = OurPass(need_weights=False)
    with through_our_module(toy, blocks, running):  # as a training run holds the model
        frame = circuits.edge_attribution_ids(toy, *ids, a, w, blocks=blocks, running=running)
        # the run's own blocks still stand in the model afterwards
        outer, name = blocks[0].place
        assert getattr(outer, name) is blocks[0]
    np.testing.assert_allclose(frame["score"], expected["score"], rtol=1e-4, atol=1e-5)
    assert frame.attrs["clean_tokens"] == expected.attrs["clean_tokens"]


def test_a_model_our_module_cannot_run_or_with_norms_after_its_blocks_is_refused_by_name(
    tmp_path_factory,
):
    from transformers import BloomConfig, BloomForCausalLM

    from tests.tiny_families import loaded_tiny

    torch.manual_seed(0)
    bloom = _tiny(
        tmp_path_factory,
        "bloom",
        BloomForCausalLM(BloomConfig(vocab_size=30522, hidden_size=32, n_layer=2, n_head=4)),
    )
    with pytest.raises(mhsa.UnsupportedModelError, match="Circuits run through our module") as e:
        mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=bloom, answer=ANSWER, wrong=WRONG)
    assert "GPT-2 family" in str(e.value)  # the families our module runs
    # parallel blocks run (tests/test_circuits_families.py); OLMo 2's norms after attention
    # and the MLP make the residual no sum of the nodes' outputs
    olmo2 = loaded_tiny("OLMo 2", tmp_path_factory.mktemp)
    with pytest.raises(mhsa.UnsupportedModelError, match="norms after attention") as e:
        mhsa.circuits.circuit_graph(olmo2)
    assert "Patching" in str(e.value) and "GPT-J" in str(e.value)


def test_training_probe_pair_breaks_the_repeat_at_the_last_symbols_first_occurrence():
    from mhsa.training.circuit_probe import induction_edge_probe

    ids = [2, 10, 11, 12, 13, 10, 11, 12, 13]  # [BOS] a b c d a b c d
    probe = induction_edge_probe(ids, symbols=[10, 11, 14, 15])
    assert probe is not None
    assert probe.clean.tolist() == [[2, 10, 11, 12, 13, 10, 11, 12]]
    assert probe.corrupted.tolist() == [[2, 10, 11, 14, 13, 10, 11, 12]]  # the first "c"
    assert (probe.answer, probe.wrong) == (13, 14)
    assert induction_edge_probe([2, 10, 11, 12, 13, 14, 15, 16, 17], [20]) is None  # no repeat


def test_k_edge_scores_during_training_are_the_libraries_and_the_series_follows_them(toy):
    from mhsa.engine.runs.swap import OurPass, through_our_module, trainable_our_blocks
    from mhsa.training.circuit_probe import (
        EdgeProbe,
        k_composition_series,
        k_edge_scores,
    )

    ids = [toy.tokenizer(t, return_tensors="pt")["input_ids"] for t in (TOY_CLEAN, TOY_CORRUPTED)]
    a, w = (toy.tokenizer.convert_tokens_to_ids(x) for x in (TOY_ANSWER, TOY_WRONG))
    with toy.lock:
        blocks = trainable_our_blocks(toy)
        running = OurPass(need_weights=False)
    with through_our_module(toy, blocks, running):
        k = k_edge_scores(toy.head_model, (blocks, running), EdgeProbe(*ids, a, w), toy.device)
    scores = mhsa.circuits.edge_attribution(
        TOY_CLEAN, TOY_CORRUPTED, model=toy, answer="lo", wrong="ba"
    )
    row = scores[(scores.source == "L0H3") & (scores.target == "L1H3") & (scores.input == "k")]
    assert k[0, 3, 1, 3] == pytest.approx(float(row["score"].iloc[0]), rel=1e-4, abs=1e-6)
    assert np.isnan(k[1, 0, 0, 0]) and np.isnan(k[0, 0, 0, 1])  # no edge downwards or across

    class Snap:
        def __init__(self, step, scale):
            self.step, self.k_edge_scores = step, k * scale
            self.previous_token_scores = np.array([[0.1, 0.2, 0.1, 0.6], [0, 0, 0, 0]])
            self.induction_scores = np.array([[0, 0, 0, 0], [0.2, 0.1, 0.3, 0.7]])

    sender, receiver, steps, values = k_composition_series([Snap(0, 0.0), Snap(25, 1.0)])
    assert (sender, receiver, steps) == ("L0H3", "L1H3", [0, 25])
    assert values == pytest.approx([0.0, k[0, 3, 1, 3]])
    fig = plots.k_composition_figure(sender, receiver, steps, values, phase_change_step=25)
    assert list(fig.data[0].y) == pytest.approx(values)


def test_an_induction_training_run_records_k_edges_and_another_task_none():
    run = mhsa.training.train(
        mhsa.training.TrainConfig(task="induction", steps=4, seed=0), snapshot_every=2
    )
    scores = [s.k_edge_scores for s in run.snapshots]
    assert [s.shape for s in scores] == [(2, 4, 2, 4)] * 3
    assert np.isnan(scores[-1][1, :, 0, :]).all() and np.isfinite(scores[-1][0, :, 1, :]).all()
    series = circuits_series(run.snapshots)
    assert series is not None and len(series[2]) == 3
    other = mhsa.training.train(
        mhsa.training.TrainConfig(task="copy", steps=2, seed=0), snapshot_every=2
    )
    assert all(s.k_edge_scores is None for s in other.snapshots)


def circuits_series(snapshots):
    from mhsa.training.circuit_probe import k_composition_series

    return k_composition_series(snapshots)

"""Circuits on the parallel-block decoder families (GPT-J, GPT-NeoX/Pythia with
``use_parallel_residual``, Phi, Falcon in its three attention layouts), on sequential GPT-NeoX,
and on Qwen3 (per-head q/k norms, grouped-query attention, a sliding window), Gemma and Phi-3,
each a tiny random model (``tests.tiny_families``).

A parallel layer computes ``x + attn(ln_a(x)) + mlp(ln_m(x))`` (EAP-IG's ``parallel_attn_mlp``
graphs, hannamw/EAP-IG ``src/eap/graph.py``): its MLP reads the layer's input, so a head feeds
the MLPs of the layers above it and not its own layer's. The hand computation
(``tests.circuits_by_hand``) wires the plain transformers model so with torch hooks, from each
family's own module names and fused row layouts, not through our module.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import mhsa
from mhsa.circuits import discovery as circuits
from tests.circuits_by_hand import hand_run, model_parts
from tests.tiny_families import loaded_tiny

CLEAN, CORRUPTED = "the cat sat on the mat and the cat", "the dog sat on the mat and the dog"
#: logit("cat") - logit("dog") moves by 0.18 to 1.3 between the texts on every tiny model here
ANSWER, WRONG = "cat", "dog"
PARALLEL = ["GPT-NeoX", "GPT-J", "Phi", "Falcon", "Falcon grouped", "Falcon per-head"]
#: sequential layouts beside GPT-2 and Llama (tests/test_circuits.py): Qwen3's per-head q/k
#: norms and window, Gemma's scaled embeddings and ``1 + w`` norms, Phi-3's fused projections
SEQUENTIAL = ["GPT-NeoX sequential", "Qwen3", "Gemma", "Phi-3"]
FAMILIES = PARALLEL + SEQUENTIAL


@pytest.fixture(params=FAMILIES)
def family(request, tmp_path_factory) -> tuple[str, mhsa.engine.LoadedModel]:
    return request.param, loaded_tiny(request.param, tmp_path_factory.mktemp)


def _metric(lm: mhsa.engine.LoadedModel, logits: torch.Tensor) -> torch.Tensor:
    a, w = (
        lm.tokenizer(" " + t, add_special_tokens=False)["input_ids"][0] for t in (ANSWER, WRONG)
    )
    return logits[:, -1, a] - logits[:, -1, w]


def _key(lm: mhsa.engine.LoadedModel, source: str, target: str, part: str) -> tuple[Any, tuple]:
    """The hand run's names of an edge: its source, and its target with key/value inputs per
    key/value head (grouped-query attention: the sum over the query heads sharing it)."""
    u: Any = source
    if source.startswith("M"):
        u = ("M", int(source[1:]))
    elif source != "input":
        u = mhsa.parse_head_label(source)
    if target == "logits":
        return u, ("logits",)
    if target.startswith("M"):
        return u, ("M", int(target[1:]))
    layer, head = mhsa.parse_head_label(target)
    p = model_parts(lm)
    return u, (part, layer, head // (p.heads // p.kv_heads) if part in "kv" else head)


def _eap_by_hand(lm: mhsa.engine.LoadedModel, steps: int | None = None) -> dict[tuple, float]:
    """``{(source, target key): (a_u(corrupted) - a_u(clean)) . dm/d(target's copy)}`` at the
    clean run (``steps``: the gradient averaged over the clean text's runs with embeddings
    ``corrupted + (k / steps) (clean - corrupted)``, k = 0 .. steps - 1: EAP-IG), by autograd
    through zeros added to every target's copy."""
    with torch.no_grad():
        _, clean = hand_run(lm, CLEAN, {})
        _, corrupted = hand_run(lm, CORRUPTED, {})
    keys = {_key(lm, "input", n, x)[1] for n, x in circuits.circuit_graph(lm).targets}
    embeddings = None
    if steps is not None:
        alphas = torch.arange(steps, dtype=torch.float32)[:, None, None] / steps
        embeddings = corrupted["input"] + alphas * (clean["input"] - corrupted["input"])
    rows = 1 if steps is None else steps
    shape = (rows, *clean["input"].shape[1:])
    zeros = {k: torch.zeros(shape, requires_grad=True) for k in keys}
    logits, _ = hand_run(lm, CLEAN, zeros, embeddings)
    grads = torch.autograd.grad(_metric(lm, logits).sum(), list(zeros.values()))
    grads = tuple(g.sum(0, keepdim=True) / rows for g in grads)
    return {
        (u, k): float(((corrupted[u] - clean[u]) * g).sum())
        for u in clean
        for k, g in zip(zeros, grads, strict=True)
    }


def _compare(lm: mhsa.engine.LoadedModel, frame, hand: dict[tuple, float]) -> None:
    """Our scores equal the hand's to 1e-4 of the largest (grouped k/v: our per query head
    scores summed over the query heads sharing a key/value head)."""
    ours: dict[tuple, float] = {}
    for row in frame.itertuples():
        key = _key(lm, row.source, row.target, row.input)
        ours[key] = ours.get(key, 0.0) + row.score
    scale = max(abs(v) for v in ours.values())
    assert scale > 1e-2
    for key, value in ours.items():
        assert value == pytest.approx(hand[key], abs=1e-4 * scale), key


# --- the graph ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("layers", "heads"), [(2, 4), (3, 2), (12, 12)])
def test_a_parallel_graph_has_no_edge_from_a_head_into_its_own_layers_mlp(layers, heads):
    parallel = circuits.CircuitGraph(layers, heads, parallel=True)
    # written out: head l's q, k and v each read the input and the l layers below (H heads and
    # an MLP each); MLP l reads the same (not layer l's heads); the logits read every node
    below = [1 + layer * (heads + 1) for layer in range(layers)]
    count = sum(3 * heads * n + n for n in below) + 1 + layers * (heads + 1)
    assert parallel.n_edges == count
    assert circuits.CircuitGraph(layers, heads).n_edges == count + layers * heads
    edges = set(parallel.edges()[["source", "target"]].itertuples(index=False, name=None))
    own = {(f"L{i}H{h}", f"M{i}") for i in range(layers) for h in range(heads)}
    above = {(f"L{i}H{h}", f"M{j}") for j in range(layers) for i in range(j) for h in range(heads)}
    assert not own & edges and above <= edges
    with pytest.raises(mhsa.InputError, match="no edge L1H0 -> M1"):
        parallel.edge("L1H0", "M1")


def test_each_familys_graph_follows_its_wiring(family):
    name, lm = family
    graph = circuits.circuit_graph(lm)
    assert graph.parallel == (name in PARALLEL) == model_parts(lm).parallel
    assert (graph.layers, graph.heads) == (2, 4)


# --- faithfulness at its two ends, and the runs against the plain model -------------------------


def test_every_edge_is_faithful_and_no_edge_is_the_corrupted_run(family):
    _, lm = family
    kw = {"model": lm, "answer": ANSWER, "wrong": WRONG}
    every = circuits.circuit_graph(lm).edges()
    # no edge: every receiver reads the corrupted sources, which is the corrupted run only if
    # the graph's wiring is the model's
    assert mhsa.circuits.circuit_faithfulness(CLEAN, CORRUPTED, [], **kw) == pytest.approx(
        0, abs=1e-4
    )
    assert mhsa.circuits.circuit_faithfulness(CLEAN, CORRUPTED, every, **kw) == pytest.approx(
        1, abs=1e-4
    )


# --- scores against the hand computation --------------------------------------------------------


@pytest.mark.parametrize("one_pass", [True, False], ids=["pair's pass", "tapped"])
def test_eap_equals_autograd_by_hand(family, one_pass, monkeypatch):
    """Both ways to the gradients: the pair's own pass with a zero on every target's copy (small
    models), and a plain pass with taps (``mhsa.circuits.taps``, above ``EAP_ONE_PASS_MAX``)."""
    _, lm = family
    if not one_pass:
        monkeypatch.setattr(mhsa.circuits.pairs, "EAP_ONE_PASS_MAX", 0)
    frame = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, model=lm, answer=ANSWER, wrong=WRONG)
    with torch.no_grad():
        logits, _ = hand_run(lm, CLEAN, {})
        corrupted_logits, _ = hand_run(lm, CORRUPTED, {})
    assert frame.attrs["clean"] == pytest.approx(float(_metric(lm, logits)[0]), abs=1e-4)
    assert frame.attrs["corrupted"] == pytest.approx(
        float(_metric(lm, corrupted_logits)[0]), abs=1e-4
    )
    _compare(lm, frame, _eap_by_hand(lm))


@pytest.mark.parametrize("name", ["GPT-NeoX", "Falcon grouped"])
def test_eap_ig_averages_the_gradients_along_the_embeddings_by_hand(name, tmp_path_factory):
    lm = loaded_tiny(name, tmp_path_factory.mktemp)
    kw = {"model": lm, "answer": ANSWER, "wrong": WRONG, "method": "eap-ig", "steps": 3}
    frame = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, **kw)
    _compare(lm, frame, _eap_by_hand(lm, steps=3))


#: a head -> head key edge, and a head -> MLP edge of the layer above
EDGES = (("L0H1", "L1H2", "k"), ("L0H3", "M1", ""))


def test_exact_scores_equal_path_patching_by_hand(family):
    """``EDGES`` patched alone. Grouped-query attention: the hand run's key copy is the key
    head's, so the edges into every query head sharing it are patched together
    (``circuit_faithfulness`` of all the other edges)."""
    name, lm = family
    kw = {"model": lm, "answer": ANSWER, "wrong": WRONG}
    graph, p = circuits.circuit_graph(lm), model_parts(lm)
    every = list(graph.edges().itertuples(index=False, name=None))
    exact = mhsa.circuits.edge_attribution(CLEAN, CORRUPTED, method="exact", batch_size=128, **kw)
    with torch.no_grad():
        logits, clean = hand_run(lm, CLEAN, {})
        corrupted_logits, corrupted = hand_run(lm, CORRUPTED, {})
    m_clean, m_corrupted = (float(_metric(lm, x)[0]) for x in (logits, corrupted_logits))
    for sender, receiver, part in EDGES:
        u, target = _key(lm, sender, receiver, part)
        with torch.no_grad():
            patched = hand_run(lm, CLEAN, {target: corrupted[u] - clean[u]})[0]
        m_patched = float(_metric(lm, patched)[0])
        assert abs(m_patched - m_clean) > 1e-4  # an edge that carries something
        group = [e for e in every if e[0] == sender and e[2] == part and _key(lm, *e)[1] == target]
        assert len(group) == (p.heads // p.kv_heads if part == "k" else 1)
        if len(group) == 1:  # one edge alone: path patching and the exact score
            one = mhsa.circuits.path_patch(CLEAN, CORRUPTED, sender, receiver, part, **kw)
            assert one.patched == pytest.approx(m_patched, abs=1e-5)
            row = exact[
                (exact.source == sender) & (exact.target == receiver) & (exact.input == part)
            ]
            assert float(row["score"].iloc[0]) == pytest.approx(m_patched - m_clean, abs=1e-5)
        else:
            rest = [e for e in every if e not in group]
            f = mhsa.circuits.circuit_faithfulness(CLEAN, CORRUPTED, rest, **kw)
            assert m_corrupted + f * (m_clean - m_corrupted) == pytest.approx(m_patched, abs=1e-4)
    own = ("L1H0", "M1")  # a head into its own layer's MLP: only where the MLP reads it
    if name in PARALLEL:
        with pytest.raises(mhsa.InputError, match="no edge L1H0 -> M1"):
            mhsa.circuits.path_patch(CLEAN, CORRUPTED, *own, **kw)
    else:
        assert graph.mask[graph.edge(*own)]


@pytest.mark.parametrize("name", ["OPT", "Gemma 2", "Gemma 3 (text)", "OLMo 2"])
def test_decoders_whose_residual_is_no_plain_sum_are_refused_by_name(name, tmp_path_factory):
    """OPT keeps no ``mlp`` module (fc1/fc2 inline, its norms now found through its layout);
    Gemma 2/3 and OLMo 2 norm the attention's
    and the MLP's outputs before the residual sum, so an edge's difference is not what the
    receiver reads."""
    lm = loaded_tiny(name, tmp_path_factory.mktemp)
    reason = "no module of its own" if name == "OPT" else "norms after attention or the MLP"
    with pytest.raises(mhsa.UnsupportedModelError, match=reason) as e:
        circuits.circuit_graph(lm)
    assert "Circuits (edge attribution" in str(e.value) and "Falcon" in str(e.value)

"""Circuits on the parallel-block decoder families (GPT-J, GPT-NeoX/Pythia with
``use_parallel_residual``, Phi, Falcon in its three attention layouts), on sequential GPT-NeoX,
and on Qwen3 (per-head q/k norms, grouped-query attention, a sliding window), Gemma and Phi-3,
each a tiny random model (``tests.tiny_families``).

A parallel layer computes ``x + attn(ln_a(x)) + mlp(ln_m(x))`` (EAP-IG's ``parallel_attn_mlp``
graphs, hannamw/EAP-IG ``src/eap/graph.py``): its MLP reads the layer's input, so a head feeds
the MLPs of the layers above it and not its own layer's. The hand computation here wires the
plain transformers model so with torch hooks, from each family's own module names and fused
row layouts (read from transformers' ``modeling_gpt_neox.py``, ``modeling_gptj.py``,
``modeling_phi.py``, ``modeling_falcon.py``, ``modeling_qwen3.py``, ``modeling_phi3.py``),
not through our module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

import mhsa
from mhsa import circuits
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
def family(request, tmp_path_factory) -> tuple[str, mhsa.LoadedModel]:
    return request.param, loaded_tiny(request.param, tmp_path_factory.mktemp)


# --- the plain model's parts, by family ---------------------------------------------------------

Rows = Callable[[str, int], slice]  # (part, head or key/value head) -> output features


@dataclass(frozen=True)
class Parts:
    """Where a family keeps what the hand run touches.

    Attributes:
        layers: the decoder layers.
        norms: per layer, the norm its attention reads and the norm its MLP reads.
        parallel: the MLP reads ``ln_m(x)`` of the layer's input ``x`` (else of the residual
            after attention).
        final: the final norm.
        projection: per layer and part ("q", "k", "v"), the module computing it.
        rows: which output features of that module are a head's part.
        out: per layer, the output projection (``nn.Linear``).
        heads, kv_heads, d_head: the attention's sizes.
    """

    layers: list[nn.Module]
    norms: list[tuple[nn.Module, nn.Module]]
    parallel: bool
    final: nn.Module
    projection: Callable[[int, str], nn.Module]
    rows: Rows
    out: list[nn.Linear]
    heads: int
    kv_heads: int
    d_head: int


def _block(d_head: int, index: int) -> slice:
    return slice(index * d_head, (index + 1) * d_head)


def _falcon_rows(attention: nn.Module, heads: int, d: int) -> Rows:
    """``FalconAttention._split_heads``: per key/value group its queries then K then V
    (new architecture); all queries then one K and one V (multi-query); per head q, k, v."""
    if attention.new_decoder_architecture:
        n = heads // attention.num_kv_heads  # queries per group

        def grouped(part: str, h: int) -> slice:
            return _block(
                d, (h // n) * (n + 2) + h % n if part == "q" else h * (n + 2) + n + "kv".index(part)
            )

        return grouped
    if attention.multi_query:
        return lambda part, h: _block(d, h if part == "q" else heads + "kv".index(part))
    return lambda part, h: _block(d, 3 * h + "qkv".index(part))


def _parts(lm: mhsa.LoadedModel) -> Parts:
    cfg, base = lm.config, lm.model
    kind = cfg.model_type
    heads = cfg.num_attention_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv = heads
    if kind == "gpt_neox":  # fused per head: [q k v] of head 0, then of head 1, ...
        layers, attn = list(base.layers), [layer.attention for layer in base.layers]
        norms = [(layer.input_layernorm, layer.post_attention_layernorm) for layer in layers]
        parallel, final, out = cfg.use_parallel_residual, base.final_layer_norm, "dense"

        def projection(i: int, _part: str) -> nn.Module:
            return attn[i].query_key_value

        def rows(part: str, h: int) -> slice:
            return _block(d, 3 * h + "qkv".index(part))

    elif kind == "falcon":
        layers, attn = list(base.h), [layer.self_attention for layer in base.h]
        norms = [
            (layer.ln_attn, layer.ln_mlp)
            if hasattr(layer, "ln_mlp")
            else (layer.input_layernorm, layer.input_layernorm)
            for layer in layers
        ]
        parallel, final, out = True, base.ln_f, "dense"
        kv = attn[0].num_kv_heads if attn[0].new_decoder_architecture else heads
        kv = 1 if attn[0].multi_query and not attn[0].new_decoder_architecture else kv

        def projection(i: int, _part: str) -> nn.Module:
            return attn[i].query_key_value

        rows = _falcon_rows(attn[0], heads, d)
    elif kind == "phi3":  # fused: every query head, then every key head, then every value head
        layers, attn = list(base.layers), [layer.self_attn for layer in base.layers]
        norms = [(layer.input_layernorm, layer.post_attention_layernorm) for layer in layers]
        parallel, final, out = False, base.norm, "o_proj"
        kv = cfg.num_key_value_heads

        def projection(i: int, _part: str) -> nn.Module:
            return attn[i].qkv_proj

        def rows(part: str, h: int) -> slice:
            return _block(d, h + {"q": 0, "k": heads, "v": heads + kv}[part])

    else:  # separate q_proj, k_proj, v_proj
        layers = list(base.h if kind == "gptj" else base.layers)
        attn = [layer.attn if kind == "gptj" else layer.self_attn for layer in layers]
        if kind == "gptj":
            norms = [(layer.ln_1, layer.ln_1) for layer in layers]
            parallel, final, out = True, base.ln_f, "out_proj"
        elif kind == "phi":
            norms = [(layer.input_layernorm, layer.input_layernorm) for layer in layers]
            parallel, final, out = True, base.final_layernorm, "dense"
        else:
            assert kind in ("qwen3", "gemma"), kind
            norms = [(layer.input_layernorm, layer.post_attention_layernorm) for layer in layers]
            parallel, final, out = False, base.norm, "o_proj"
            kv = cfg.num_key_value_heads

        def projection(i: int, part: str) -> nn.Module:
            return getattr(attn[i], f"{part}_proj")

        def rows(_part: str, h: int) -> slice:
            return _block(d, h)

    outs = [getattr(a, out) for a in attn]
    return Parts(layers, norms, parallel, final, projection, rows, outs, heads, kv, d)


# --- the hand run -------------------------------------------------------------------------------


def _hand_run(
    lm: mhsa.LoadedModel,
    text: str,
    added: Mapping[tuple, torch.Tensor],
    embeddings: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[Any, torch.Tensor]]:
    """The plain model on ``text`` with ``added[target]`` added to that target's own copy of
    the residual it reads: ``("q"|"k"|"v", layer, head or key/value head)``, ``("M", layer)``
    or ``("logits",)``; ``embeddings [rows, T, D]``: in place of the residual entering layer 0,
    one row each. Returns the logits and every source's output."""
    p = _parts(lm)
    rows = 1 if embeddings is None else len(embeddings)
    inputs = {k: v.expand(rows, -1) for k, v in lm.tokenizer(text, return_tensors="pt").items()}
    acts: dict[Any, torch.Tensor] = {}
    x: dict[int, torch.Tensor] = {}
    handles = []

    def layer_pre(i: int):
        def hook(_m, args, kwargs):
            x[i] = args[0] if args else kwargs["hidden_states"]
            if i == 0:
                if embeddings is not None:
                    x[i] = embeddings
                    if args:
                        args = (embeddings, *args[1:])
                    else:
                        kwargs = {**kwargs, "hidden_states": embeddings}
                acts["input"] = x[i]
            return args, kwargs

        return hook

    def split_input(i: int, part: str, module: nn.Module):
        def hook(_m, _args, out):
            keys = [k for k in added if k[:2] == (part, i)]
            if not keys:
                return None
            out = out.clone()
            for key in keys:  # this head's features from its own copy of the residual
                cols = p.rows(part, key[2])
                out[..., cols] = module.forward(p.norms[i][0](x[i] + added[key]))[..., cols]
            return out

        return hook

    def head_outputs(i: int):
        def hook(module, args):
            for h in range(p.heads):
                cols = _block(p.d_head, h)
                acts[(i, h)] = args[0][..., cols] @ module.weight[:, cols].T

        return hook

    def parallel_mlp_input(i: int):  # the MLP reads ln_m(x) of the layer's input x
        def hook(_m, args):
            if ("M", i) in added:
                return (p.norms[i][1](x[i] + added[("M", i)]), *args[1:])
            return None

        return hook

    def add(key: tuple):
        return lambda _m, args: (args[0] + added[key], *args[1:]) if key in added else None

    def mlp_out(i: int):  # a copy: Falcon adds the attention's output to it in place
        return lambda _m, _a, out: acts.__setitem__(("M", i), out.clone())

    try:
        for i, layer in enumerate(p.layers):
            handles.append(layer.register_forward_pre_hook(layer_pre(i), with_kwargs=True))
            for part in {part: p.projection(i, part) for part in "qkv"}.items():
                handles.append(part[1].register_forward_hook(split_input(i, *part)))
            handles.append(p.out[i].register_forward_pre_hook(head_outputs(i)))
            if p.parallel:
                handles.append(layer.mlp.register_forward_pre_hook(parallel_mlp_input(i)))
            else:
                handles.append(p.norms[i][1].register_forward_pre_hook(add(("M", i))))
            handles.append(layer.mlp.register_forward_hook(mlp_out(i)))
        handles.append(p.final.register_forward_pre_hook(add(("logits",))))
        logits = lm.head_model(**inputs).logits
    finally:
        for handle in handles:
            handle.remove()
    return logits, acts


def _metric(lm: mhsa.LoadedModel, logits: torch.Tensor) -> torch.Tensor:
    a, w = (
        lm.tokenizer(" " + t, add_special_tokens=False)["input_ids"][0] for t in (ANSWER, WRONG)
    )
    return logits[:, -1, a] - logits[:, -1, w]


def _key(lm: mhsa.LoadedModel, source: str, target: str, part: str) -> tuple[Any, tuple]:
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
    p = _parts(lm)
    return u, (part, layer, head // (p.heads // p.kv_heads) if part in "kv" else head)


def _eap_by_hand(lm: mhsa.LoadedModel, steps: int | None = None) -> dict[tuple, float]:
    """``{(source, target key): (a_u(corrupted) - a_u(clean)) . dm/d(target's copy)}`` at the
    clean run (``steps``: the gradient averaged over the clean text's runs with embeddings
    ``corrupted + (k / steps) (clean - corrupted)``, k = 0 .. steps - 1: EAP-IG), by autograd
    through zeros added to every target's copy."""
    with torch.no_grad():
        _, clean = _hand_run(lm, CLEAN, {})
        _, corrupted = _hand_run(lm, CORRUPTED, {})
    keys = {_key(lm, "input", n, x)[1] for n, x in circuits.circuit_graph(lm).targets}
    embeddings = None
    if steps is not None:
        alphas = torch.arange(steps, dtype=torch.float32)[:, None, None] / steps
        embeddings = corrupted["input"] + alphas * (clean["input"] - corrupted["input"])
    rows = 1 if steps is None else steps
    shape = (rows, *clean["input"].shape[1:])
    zeros = {k: torch.zeros(shape, requires_grad=True) for k in keys}
    logits, _ = _hand_run(lm, CLEAN, zeros, embeddings)
    grads = torch.autograd.grad(_metric(lm, logits).sum(), list(zeros.values()))
    grads = tuple(g.sum(0, keepdim=True) / rows for g in grads)
    return {
        (u, k): float(((corrupted[u] - clean[u]) * g).sum())
        for u in clean
        for k, g in zip(zeros, grads, strict=True)
    }


def _compare(lm: mhsa.LoadedModel, frame, hand: dict[tuple, float]) -> None:
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
    assert graph.parallel == (name in PARALLEL) == _parts(lm).parallel
    assert (graph.layers, graph.heads) == (2, 4)


# --- faithfulness at its two ends, and the runs against the plain model -------------------------


def test_every_edge_is_faithful_and_no_edge_is_the_corrupted_run(family):
    _, lm = family
    kw = {"model": lm, "answer": ANSWER, "wrong": WRONG}
    every = circuits.circuit_graph(lm).edges()
    # no edge: every receiver reads the corrupted sources, which is the corrupted run only if
    # the graph's wiring is the model's
    assert mhsa.circuit_faithfulness(CLEAN, CORRUPTED, [], **kw) == pytest.approx(0, abs=1e-4)
    assert mhsa.circuit_faithfulness(CLEAN, CORRUPTED, every, **kw) == pytest.approx(1, abs=1e-4)


# --- scores against the hand computation --------------------------------------------------------


def test_eap_equals_autograd_by_hand(family):
    _, lm = family
    frame = mhsa.edge_attribution(CLEAN, CORRUPTED, model=lm, answer=ANSWER, wrong=WRONG)
    with torch.no_grad():
        logits, _ = _hand_run(lm, CLEAN, {})
        corrupted_logits, _ = _hand_run(lm, CORRUPTED, {})
    assert frame.attrs["clean"] == pytest.approx(float(_metric(lm, logits)[0]), abs=1e-4)
    assert frame.attrs["corrupted"] == pytest.approx(
        float(_metric(lm, corrupted_logits)[0]), abs=1e-4
    )
    _compare(lm, frame, _eap_by_hand(lm))


@pytest.mark.parametrize("name", ["GPT-NeoX", "Falcon grouped"])
def test_eap_ig_averages_the_gradients_along_the_embeddings_by_hand(name, tmp_path_factory):
    lm = loaded_tiny(name, tmp_path_factory.mktemp)
    kw = {"model": lm, "answer": ANSWER, "wrong": WRONG, "method": "eap-ig", "steps": 3}
    frame = mhsa.edge_attribution(CLEAN, CORRUPTED, **kw)
    _compare(lm, frame, _eap_by_hand(lm, steps=3))


#: a head -> head key edge, and a head -> MLP edge of the layer above
EDGES = (("L0H1", "L1H2", "k"), ("L0H3", "M1", ""))


def test_exact_scores_equal_path_patching_by_hand(family):
    """``EDGES`` patched alone. Grouped-query attention: the hand run's key copy is the key
    head's, so the edges into every query head sharing it are patched together
    (``circuit_faithfulness`` of all the other edges)."""
    name, lm = family
    kw = {"model": lm, "answer": ANSWER, "wrong": WRONG}
    graph, p = circuits.circuit_graph(lm), _parts(lm)
    every = list(graph.edges().itertuples(index=False, name=None))
    exact = mhsa.edge_attribution(CLEAN, CORRUPTED, method="exact", batch_size=128, **kw)
    with torch.no_grad():
        logits, clean = _hand_run(lm, CLEAN, {})
        corrupted_logits, corrupted = _hand_run(lm, CORRUPTED, {})
    m_clean, m_corrupted = (float(_metric(lm, x)[0]) for x in (logits, corrupted_logits))
    for sender, receiver, part in EDGES:
        u, target = _key(lm, sender, receiver, part)
        with torch.no_grad():
            patched = _hand_run(lm, CLEAN, {target: corrupted[u] - clean[u]})[0]
        m_patched = float(_metric(lm, patched)[0])
        assert abs(m_patched - m_clean) > 1e-4  # an edge that carries something
        group = [e for e in every if e[0] == sender and e[2] == part and _key(lm, *e)[1] == target]
        assert len(group) == (p.heads // p.kv_heads if part == "k" else 1)
        if len(group) == 1:  # one edge alone: path patching and the exact score
            one = mhsa.path_patch(CLEAN, CORRUPTED, sender, receiver, part, **kw)
            assert one.patched == pytest.approx(m_patched, abs=1e-5)
            row = exact[
                (exact.source == sender) & (exact.target == receiver) & (exact.input == part)
            ]
            assert float(row["score"].iloc[0]) == pytest.approx(m_patched - m_clean, abs=1e-5)
        else:
            rest = [e for e in every if e not in group]
            f = mhsa.circuit_faithfulness(CLEAN, CORRUPTED, rest, **kw)
            assert m_corrupted + f * (m_clean - m_corrupted) == pytest.approx(m_patched, abs=1e-4)
    own = ("L1H0", "M1")  # a head into its own layer's MLP: only where the MLP reads it
    if name in PARALLEL:
        with pytest.raises(mhsa.InputError, match="no edge L1H0 -> M1"):
            mhsa.path_patch(CLEAN, CORRUPTED, *own, **kw)
    else:
        assert graph.mask[graph.edge(*own)]


@pytest.mark.parametrize("name", ["OPT", "Gemma 2", "Gemma 3 (text)", "OLMo 2"])
def test_decoders_whose_residual_is_no_plain_sum_are_refused_by_name(name, tmp_path_factory):
    """OPT keeps no ``mlp`` module (fc1/fc2 inline); Gemma 2/3 and OLMo 2 norm the attention's
    and the MLP's outputs before the residual sum, so an edge's difference is not what the
    receiver reads."""
    lm = loaded_tiny(name, tmp_path_factory.mktemp)
    reason = "a layer without ln_1" if name == "OPT" else "norms after attention or the MLP"
    with pytest.raises(mhsa.UnsupportedModelError, match=reason) as e:
        circuits.circuit_graph(lm)
    assert "Circuits (edge attribution" in str(e.value) and "Falcon" in str(e.value)

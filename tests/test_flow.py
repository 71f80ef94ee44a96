"""Information flow routes (``mhsa.causal.flow``): contributions on hand-made vectors, a one-layer
graph
computed by hand with explicit loops, the threshold, and the toy induction model's route."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import mhsa
from mhsa.causal.attribution import ResidualPass, residual_pass
from mhsa.causal.flow import (
    EPS,
    FlowNode,
    block_contributions,
    contributions,
    flow_contributions,
    flow_graph,
    information_flow,
    threshold_and_renormalize,
)
from tests.tiny import perturbed_biases

TOY_TEXT = "ba ke mo di lu ba ke mo"


def test_contributions_of_hand_made_parts():
    whole = torch.tensor([3.0, 1.0])  # ||whole||_1 = 4
    parts = torch.tensor([[3.0, 0.0], [0.0, 1.0], [-5.0, 0.0]])
    # 4 - ||(0, -1)|| = 3; 4 - ||(-3, 0)|| = 1; 4 - ||(-8, -1)|| < 0: the floor
    expected = torch.tensor([3.0, 1.0, EPS]) / (4.0 + EPS)
    assert torch.allclose(contributions(parts, whole), expected, atol=1e-5)


def test_threshold_and_renormalize_by_hand():
    blocks = np.array([[0.5, 0.03], [0.02, 0.01]])  # two wholes, two parts each
    residual = np.array([0.47, 0.97])
    kept, res = threshold_and_renormalize(0.04, blocks, residual)
    assert np.allclose(kept, [[0.5 / 0.97, 0.0], [0.0, 0.0]])
    assert np.allclose(res, [0.47 / 0.97, 1.0])
    nothing, none = threshold_and_renormalize(0.99, blocks, residual)
    assert not nothing.any() and not none.any()  # nothing above: zeros, not NaN


def _hand_run() -> ResidualPass:
    """One layer, two heads of one dimension, three tokens, d_model 2, explicit numbers."""
    pre = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])  # (T, D)
    attention = torch.tensor(
        [
            [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.0, 0.8]],  # head 0
            [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.9, 0.1]],  # head 1
        ]
    )
    values = torch.tensor([[[1.0], [2.0], [-1.0]], [[0.5], [3.0], [1.0]]])  # (H, T, Dh=1)
    b_v = torch.tensor([[0.5], [0.0]])  # head 0's value bias: in every value of head 0
    w_o = torch.tensor([[[2.0, 0.0]], [[0.0, 1.0]]])  # (H, Dh, D)
    b_o = torch.tensor([0.1, -0.2])
    context = attention @ values  # (H, T, 1)
    attn_out = torch.einsum("htd,hdm->tm", context, w_o) + b_o
    mlp_out = torch.tensor([[0.0, 0.5], [3.0, 0.0], [1.0, 0.5]])
    mid = pre + attn_out
    return ResidualPass(
        tokens=("a", "b", "c"),
        ids=(0, 1, 2),
        resid_pre=(pre,),
        probabilities=(attention,),
        values=(values,),
        b_v=(b_v,),
        context=(context,),
        w_o=(w_o,),
        b_o=(b_o,),
        attn_out=(attn_out,),
        mlp_out=(mlp_out,),
        resid_post=(mid + mlp_out,),
        logits=torch.zeros(3, 4),
        final_norm=nn.Identity(),
        unembed=nn.Linear(2, 4, bias=False),
    )


def _by_hand(parts: list[torch.Tensor], whole: torch.Tensor) -> list[float]:
    norm = float(whole.abs().sum())
    raw = [max(norm - float((p - whole).abs().sum()), EPS) for p in parts]
    return [r / sum(raw) for r in raw]


def test_a_one_layer_graph_computed_by_hand():
    run = _hand_run()
    flow = block_contributions(run)
    pre, attention = run.resid_pre[0], run.probabilities[0]
    values = run.values[0] - run.b_v[0][:, None]  # the value bias is in no part (folded)
    w_o, whole = run.w_o[0], pre + run.attn_out[0]
    for i in range(3):
        parts = [attention[h, i, j] * (values[h, j] @ w_o[h]) for j in range(3) for h in range(2)]
        expected = _by_hand([*parts, pre[i]], whole[i])
        assert np.allclose(flow.attention[0, i].reshape(-1), expected[:-1], atol=1e-5)
        assert abs(flow.attention_residual[0, i] - expected[-1]) < 1e-5
        mlp = _by_hand([run.mlp_out[0][i], whole[i]], run.resid_post[0][i])
        assert np.allclose([flow.mlp[0, i], flow.mlp_residual[0, i]], mlp, atol=1e-5)

    graph = flow_graph(flow, threshold=0.1, renormalize=False)
    # by hand, from the output node I0_2: each edge with weight over 0.1
    a, m, out = FlowNode("A", 0, 2), FlowNode("M", 0, 2), FlowNode("I", 0, 2)
    expected_edges = set()
    mlp = _by_hand([run.mlp_out[0][2], whole[2]], run.resid_post[0][2])
    if mlp[1] > 0.1:
        expected_edges.add((a, out))
    if mlp[0] > 0.1:
        expected_edges |= {(m, out), (a, m)}
    terms = [attention[h, 2, j] * (values[h, j] @ w_o[h]) for j in range(3) for h in range(2)]
    into_a = _by_hand([*terms, pre[2]], whole[2])
    for j in range(3):
        weight = into_a[2 * j] + into_a[2 * j + 1] + (into_a[-1] if j == 2 else 0.0)
        if weight > 0.1 and (a, out) in expected_edges | {(a, m)}:
            expected_edges.add((FlowNode("X", 0, j), a))
    assert {(e.source, e.target) for e in graph.edges} == expected_edges
    assert len(expected_edges) >= 3  # the example has a route worth checking
    heads = {e.source.token: e.heads for e in graph.edges if e.target == a}
    for j, shares in heads.items():
        assert np.allclose(shares, [into_a[2 * j], into_a[2 * j + 1]], atol=1e-5)


@pytest.mark.parametrize("path", ["tiny_gpt2_path", "tiny_llama_path"])
def test_the_key_head_terms_are_the_attention_blocks_output(
    path: str, request: pytest.FixtureRequest
):
    """Summed over keys and heads, the terms A_h[i, j] v_j W_O^h plus the output bias are the
    attention block's output the model added to its residual (GPT-2: biases; Llama: grouped
    key/value heads shared by two query heads each)."""
    lm = perturbed_biases(mhsa.load_model(request.getfixturevalue(path), device="cpu"))
    run = residual_pass("the cat sat on the mat", model=lm)
    assert (run.b_v[0] is not None) == (path == "tiny_gpt2_path")
    for layer in range(run.layers):
        carried = torch.einsum("htd,hdm->htm", run.values[layer], run.w_o[layer])
        terms = torch.einsum("hij,hjm->im", run.probabilities[layer], carried)
        bias = 0 if run.b_o[layer] is None else run.b_o[layer]
        assert torch.allclose(terms + bias, run.attn_out[layer], atol=1e-5)
        if run.b_v[layer] is not None:  # GPT-2: b_V W_O folded into the output bias
            unbiased = run.values[layer] - run.b_v[layer][:, None]
            carried = torch.einsum("htd,hdm->htm", unbiased, run.w_o[layer])
            terms = torch.einsum("hij,hjm->im", run.probabilities[layer], carried)
            folded = bias + torch.einsum("hd,hdm->m", run.b_v[layer], run.w_o[layer])
            assert torch.allclose(terms + folded, run.attn_out[layer], atol=1e-5)
    assert run.values[0].shape[0] == lm.config.num_attention_heads


@pytest.fixture(scope="module")
def toy() -> mhsa.engine.LoadedModel:
    return mhsa.load_model("toy:induction", device="cpu")


def test_threshold_drops_edges(toy: mhsa.engine.LoadedModel):
    flow = flow_contributions(TOY_TEXT, model=toy)
    low = flow_graph(flow, threshold=0.01, renormalize=False)
    high = flow_graph(flow, threshold=0.3, renormalize=False)
    assert all(e.weight > 0.3 for e in high.edges)
    assert any(e.weight <= 0.3 for e in low.edges)
    assert {(e.source, e.target) for e in high.edges} < {(e.source, e.target) for e in low.edges}
    # renormalised (the tool's default): every kept contribution re-scaled to sum 1
    renormalized = flow_graph(flow, threshold=0.3)
    into = [e for e in renormalized.edges if e.target.kind == "A"]
    by_target: dict[FlowNode, float] = {}
    for e in into:
        by_target[e.target] = by_target.get(e.target, 0.0) + e.weight
    assert all(abs(total - 1) < 1e-5 for total in by_target.values())


def test_the_toy_models_induction_route(toy: mhsa.engine.LoadedModel):
    """[BOS] ba ke mo di lu ba ke mo: the last "mo" (8) reads, in layer 1, the token after the
    earlier "mo", "di" (4); "di" read the token before it, "mo" (3), in layer 0."""
    graph = information_flow(TOY_TEXT, model=toy)
    attention = {(e.source, e.target): e for e in graph.edges if e.kind == "attention"}
    assert (FlowNode("I", 0, 4), FlowNode("A", 1, 8)) in attention
    assert (FlowNode("X", 0, 3), FlowNode("A", 0, 4)) in attention
    assert graph.promoted["I1_8"][0] == "di"
    assert graph.nodes[-1] == FlowNode("I", 1, 8)


def test_flow_refuses_post_norm_models(tiny_bert_mlm_path: str):
    bert = mhsa.load_model(tiny_bert_mlm_path, device="cpu")
    with pytest.raises(mhsa.UnsupportedModelError, match="post-norm"):
        information_flow("the cat sat", model=bert)


def test_flow_graph_rejects_bad_arguments(toy: mhsa.engine.LoadedModel):
    flow = flow_contributions("ba ke", model=toy)
    with pytest.raises(mhsa.InputError, match="threshold"):
        flow_graph(flow, threshold=1.5)
    with pytest.raises(mhsa.InputError, match="Output positions"):
        flow_graph(flow, outputs=[7])


def _tool_threshold_and_renormalize(
    threshold: float, c_blocks: torch.Tensor, c_residual: torch.Tensor, *, per_token: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The LLM Transparency Tool's ``apply_threshold_and_renormalize``
    (llm_transparency_tool/routes/contributions.py) written again from its source;
    ``per_token`` is the fix: with one block per whole (an MLP) there are no block dimensions
    to sum, where the tool's ``c_blocks.sum(dim=())`` sums every dimension (pytorch 29137)."""
    resid_dims = c_residual.dim()
    bound_dims = c_blocks.dim() - resid_dims
    c_blocks = c_blocks * (c_blocks > threshold)
    c_residual = c_residual * (c_residual > threshold)
    dims = tuple(range(resid_dims, c_blocks.dim()))
    summed = c_blocks if per_token and not dims else c_blocks.sum(dim=dims)
    denom = c_residual + summed
    return c_blocks / denom.reshape(denom.shape + (1,) * bound_dims), c_residual / denom


def test_the_tools_function_with_the_per_token_fix_gives_our_edges(tmp_path_factory):
    """Our MLP and attention edges are the tool's, once its MLP sum is per token; without the
    fix its MLP edges differ on a model whose MLPs write something (the toy models' do not)."""
    from tests.tiny_families import loaded_tiny

    lm = loaded_tiny("GPT-NeoX sequential", tmp_path_factory.mktemp)
    flow = flow_contributions("The quick brown fox jumps over the lazy dog", model=lm)
    as_torch = {k: torch.from_numpy(v) for k, v in vars(flow).items() if isinstance(v, np.ndarray)}
    for threshold in (0.0, 0.04):
        mlp, mlp_res = threshold_and_renormalize(threshold, flow.mlp, flow.mlp_residual)
        attn, attn_res = threshold_and_renormalize(
            threshold, flow.attention, flow.attention_residual
        )
        for per_token in (True, False):
            t_mlp, t_mlp_res = _tool_threshold_and_renormalize(
                threshold, as_torch["mlp"], as_torch["mlp_residual"], per_token=per_token
            )
            t_attn, t_attn_res = _tool_threshold_and_renormalize(
                threshold,
                as_torch["attention"],
                as_torch["attention_residual"],
                per_token=per_token,
            )
            np.testing.assert_allclose(t_attn.numpy(), attn, atol=1e-6)  # no difference there
            np.testing.assert_allclose(t_attn_res.numpy(), attn_res, atol=1e-6)
            if per_token:
                np.testing.assert_allclose(t_mlp.numpy(), mlp, atol=1e-6)
                np.testing.assert_allclose(t_mlp_res.numpy(), mlp_res, atol=1e-6)
            elif threshold == 0.0:  # every MLP contribution kept: the sum over tokens shows
                assert np.abs(t_mlp.numpy() - mlp).max() > 0.3
    # a graph's MLP edges carry these per-token weights
    graph = flow_graph(flow, threshold=threshold)
    for edge in graph.edges:
        if edge.kind == "mlp" and edge.target.kind == "M":
            assert edge.weight == pytest.approx(float(mlp[edge.target.layer, edge.target.token]))

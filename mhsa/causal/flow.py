"""Information flow routes (Ferrando & Voita 2024), as the LLM Transparency Tool computes them
(facebookresearch/llm-transparency-tool, ``routes/contributions.py`` and ``routes/graph.py``).

Contribution of a part to a whole (``get_contributions``): ``c = max(||whole||_1 -
||part - whole||_1, 1e-5)``, normalised to sum 1 over the parts of each whole. The distance is
torch's ``pairwise_distance`` as there (it adds its eps of 1e-6 to each coordinate of
``part - whole``).

- Attention block of layer l, query token i (``get_attention_contributions``): the parts are
  every (key token j, head h) term ``A_h[i, j] (x_j W_V^h) W_O^h`` and the residual entering
  the layer; the whole is the residual after the attention block. The value bias is in no part:
  the tool runs TransformerLens's ``from_pretrained`` with its default ``fold_value_biases``,
  which moves ``b_V W_O`` (the same for every key, as each query's weights sum to 1) into the
  output bias, and the output bias is in no part either (it is in the whole). Every key token is
  a part, the masked later ones too (their zero vectors get the floor 1e-5), as there. Where the
  layer puts a norm after the attention output (Gemma 2/3, OLMo 2), each term goes through it
  with its scale frozen at the whole attention output of its query (TransformerLens's
  ``apply_ln_to_stack`` convention), and the whole is the residual after that norm's output.
- MLP block (``get_mlp_contributions``): the parts are the MLP's output and the residual after
  attention; the whole is the residual after the layer.
- Threshold (``apply_threshold_and_renormalize``, the tool's default "renormalize after
  threshold"): contributions not above the threshold are set to 0, per part (per head and token
  for attention), and the rest renormalised to sum 1 per whole; the graph then keeps edges of
  weight above 0. Without renormalising, the graph keeps edges of weight above the threshold.
  The MLP's edges are renormalised per token, as the tool's docstring intends ("to sum up to 1
  for each representation") but not as its code computes: for an MLP block it calls
  ``c_blocks.sum(dim=())``, which torch reads as a sum over every dimension (pytorch issue
  29137), so the tool divides each token's MLP contribution by its residual's contribution plus
  the MLP contributions of all tokens. The two differ wherever the MLPs write anything (the toy
  models' MLPs write zeros and hide it).
- Graph (``GraphBuilder``, ``build_full_graph``): nodes ``X0_t`` (the embeddings), ``A{l}_t``
  (the residual after attention), ``M{l}_t`` (the MLP), ``I{l}_t`` (the residual after the
  layer). An attention edge ``I{l-1}_j -> A{l}_i`` weighs the sum over heads of the (j, h)
  contributions; the residual's contribution is added to the edge from the same token (one
  edge, as there); ``A -> M`` and ``M -> I`` weigh the MLP's contribution, ``A -> I`` the
  residual's. In a parallel layer (GPT-NeoX's ``use_parallel_residual``, GPT-J, Phi, Falcon:
  the MLP reads the layer's input, not the residual after attention) the MLP's incoming edge
  is ``I{l-1} -> M{l}`` (``X0 -> M0`` in layer 0) instead; the contributions are the same
  (the MLP's output and the residual after attention still sum to the layer's output).
- Routes (``build_paths_to_predictions``): from the output node ``I{L-1}_t`` of the chosen
  token(s), every edge reachable backwards through edges over the graph's threshold.

Each node also gets its promoted tokens: its vector (a residual, or the MLP's output) through
the final norm and the unembedding (the tool's "top tokens" with "normalize before unembedding").
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from mhsa.causal.attribution import ResidualPass, residual_pass, token_strings
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.runs.generation import Generation
from mhsa.errors import InputError

__all__ = [
    "EPS",
    "FlowContributions",
    "FlowEdge",
    "FlowGraph",
    "FlowNode",
    "block_contributions",
    "contributions",
    "flow_contributions",
    "flow_graph",
    "information_flow",
    "threshold_and_renormalize",
]

#: the floor of a contribution (the LLM Transparency Tool's EPS)
EPS = 1e-5
#: elements of one chunk of the attention block's (query, key, head, d_model) terms
_CHUNK = 1 << 22


def contributions(parts: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """Each part's contribution to ``whole``: ``max(||whole||_1 - ||part - whole||_1, EPS)``,
    normalised over the parts (``get_contributions``).

    Args:
        parts: ``[P..., N..., D]``: the leading dimensions list the parts.
        whole: ``[N..., D]``.

    Returns:
        ``[P..., N...]``, summing to 1 over the part dimensions.
    """
    k = parts.dim() - whole.dim()
    distance = F.pairwise_distance(parts, whole.expand(parts.shape), p=1)
    closeness = (torch.linalg.vector_norm(whole, ord=1, dim=-1) - distance).clip(min=EPS)
    return closeness / closeness.sum(dim=tuple(range(k)), keepdim=True)


def _attention_contributions(run: ResidualPass, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """``([T query, T key, H], [T])``: each (key, head) term's and the residual's contribution
    to the residual after layer ``layer``'s attention, per query."""
    pre = run.resid_pre[layer]  # (T, D)
    whole = pre + run.attn_out[layer]  # (T, D): the residual after attention
    values = run.values[layer]
    if run.b_v[layer] is not None:  # folded into the output bias, as the tool's model has it
        values = values - run.b_v[layer][:, None]
    carried = torch.einsum("htd,hdm->htm", values, run.w_o[layer])  # (H, T, D)
    attn = run.probabilities[layer]  # (H, T, T)
    h, t, d = carried.shape
    step = max(1, _CHUNK // (t * h * d))
    norm = run.post_attention_norm(layer)  # Gemma 2/3, OLMo 2: frozen at each query
    heads, residual = [], []
    for start in range(0, t, step):
        rows = slice(start, start + step)
        terms = attn[:, rows, :, None] * carried[:, None]  # (H, q, T, D)
        if norm is not None:
            frozen = norm.at(rows)
            terms = dataclasses.replace(frozen, inverse_scale=frozen.inverse_scale[:, None])(terms)
        terms = terms.permute(2, 0, 1, 3)  # (key, head, q, D): parts first
        parts = torch.cat([terms.reshape(t * h, -1, d), pre[None, rows]])  # (T H + 1, q, D)
        c = contributions(parts, whole[rows])  # (T H + 1, q)
        heads.append(c[:-1].reshape(t, h, -1).permute(2, 0, 1))  # (q, key, head)
        residual.append(c[-1])
    return torch.cat(heads).cpu().numpy(), torch.cat(residual).cpu().numpy()


def _mlp_contributions(run: ResidualPass, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """``([T], [T])``: the MLP's and the residual's contribution to the residual after
    layer ``layer``."""
    mid = run.resid_pre[layer] + run.attn_out[layer]
    c = contributions(torch.stack([run.mlp_out[layer], mid]), run.resid_post[layer])
    return c[0].cpu().numpy(), c[1].cpu().numpy()


@dataclass(frozen=True)
class FlowContributions:
    """Every block's contributions for one text (before any threshold), and each node's
    promoted tokens. L layers, H heads, T tokens.

    Attributes:
        text: the text.
        model: the model's name.
        tokens: the tokens (T).
        attention: ``[L, T query, T key, H]`` each (key token, head) term's contribution to the
            residual after attention.
        attention_residual: ``[L, T]`` the residual's contribution there.
        mlp: ``[L, T]`` the MLP's contribution to the residual after the layer.
        mlp_residual: ``[L, T]`` the residual's contribution there.
        promoted: node name (``X0_3``, ``A1_2``, ``M1_2``, ``I1_2``) -> its top tokens.
        parallel: per layer, whether its MLP reads the layer's input (a parallel layer);
            empty: no layer does.
    """

    text: str
    model: str
    tokens: tuple[str, ...]
    attention: np.ndarray
    attention_residual: np.ndarray
    mlp: np.ndarray
    mlp_residual: np.ndarray
    promoted: dict[str, tuple[str, ...]] = field(default_factory=dict)
    parallel: tuple[bool, ...] = ()

    @property
    def layers(self) -> int:
        return self.attention.shape[0]

    @property
    def heads(self) -> int:
        return self.attention.shape[3]


def _promoted(lm: LoadedModel, run: ResidualPass, top_k: int) -> dict[str, tuple[str, ...]]:
    """Each node's top tokens through the final norm and the unembedding (an all-zero vector,
    such as the output of an MLP fixed at zero, promotes nothing)."""
    names, vectors = [], []
    t = len(run.tokens)
    for token in range(t):
        names.append(f"X0_{token}")
        vectors.append(run.resid_pre[0][token])
    for layer in range(run.layers):
        mid = run.resid_pre[layer] + run.attn_out[layer]
        for token in range(t):
            names += [f"A{layer}_{token}", f"M{layer}_{token}", f"I{layer}_{token}"]
            vectors += [mid[token], run.mlp_out[layer][token], run.resid_post[layer][token]]
    stacked = torch.stack(vectors)
    out: dict[str, tuple[str, ...]] = {}
    step = 256
    for start in range(0, len(names), step):
        chunk = stacked[start : start + step]
        logits = run.unembed_vectors(chunk.to(run.unembed.weight.dtype)).float()
        ids = logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices
        strings = token_strings(lm, ids)
        zero = chunk.abs().amax(-1) == 0
        for i, name in enumerate(names[start : start + step]):
            out[name] = () if bool(zero[i]) else tuple(strings[i])
    return out


def flow_contributions(
    text: str | Generation,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    max_tokens: int | None = None,
    top_k: int = 3,
) -> FlowContributions:
    """Every attention and MLP block's contributions for ``text`` (``contributions``), and
    each node's promoted tokens; ``flow_graph`` draws the routes from them. A ``Generation``
    runs over exactly the ids the model chose.

    Raises:
        UnsupportedModelError: post-norm encoders (BERT, MiniLM) and models without a
            next-token head.
        InputError: the text.
    """
    lm = resolve_model(model)
    run = residual_pass(text, model=lm, max_tokens=max_tokens)
    with torch.inference_mode():
        promoted = _promoted(lm, run, top_k)
    shown = text.text if isinstance(text, Generation) else text
    return block_contributions(run, text=shown, model=lm.display_name, promoted=promoted)


def block_contributions(
    run: ResidualPass,
    *,
    text: str = "",
    model: str = "",
    promoted: dict[str, tuple[str, ...]] | None = None,
) -> FlowContributions:
    """Every attention and MLP block's contributions in a recorded pass (``residual_pass``),
    with ``promoted`` tokens as given (``flow_contributions`` computes them)."""
    with torch.inference_mode():
        attention = [_attention_contributions(run, layer) for layer in range(run.layers)]
        mlp = [_mlp_contributions(run, layer) for layer in range(run.layers)]
    return FlowContributions(
        text=text,
        model=model,
        tokens=run.tokens,
        attention=np.stack([a for a, _ in attention]).astype(np.float32),
        attention_residual=np.stack([r for _, r in attention]).astype(np.float32),
        mlp=np.stack([m for m, _ in mlp]).astype(np.float32),
        mlp_residual=np.stack([r for _, r in mlp]).astype(np.float32),
        promoted=promoted or {},
        parallel=run.parallel,
    )


def threshold_and_renormalize(
    threshold: float, blocks: np.ndarray, residual: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Contributions not above ``threshold`` set to 0 and the rest renormalised to sum 1 per
    whole (``apply_threshold_and_renormalize``); a whole left with nothing gets zeros (there:
    a division by zero). Per whole also when ``blocks`` has one block per whole (an MLP): the
    tool's code divides those by the sum over all tokens (``sum(dim=())``, pytorch/pytorch#29137;
    module docstring), its docstring by each token's own, as here.

    Args:
        threshold: the threshold.
        blocks: ``[N..., P...]`` the blocks' contributions; ``residual``'s shape is a prefix.
        residual: ``[N...]`` the residual's contribution.
    """
    blocks = np.where(blocks > threshold, blocks, 0.0)
    residual = np.where(residual > threshold, residual, 0.0)
    extra = blocks.ndim - residual.ndim
    denom = residual + blocks.sum(axis=tuple(range(residual.ndim, blocks.ndim)))
    safe = np.where(denom > 0, denom, 1.0)
    scale = np.where(denom > 0, 1.0 / safe, 0.0)
    return blocks * scale.reshape(scale.shape + (1,) * extra), residual * scale


@dataclass(frozen=True)
class FlowNode:
    """A point of the graph: ``kind`` ``"X"`` (embeddings), ``"A"`` (residual after
    attention), ``"M"`` (MLP), ``"I"`` (residual after the layer); ``layer`` (0 for X) and
    ``token``."""

    kind: str
    layer: int
    token: int

    @property
    def name(self) -> str:
        """The LLM Transparency Tool's name: ``X0_3``, ``A1_2``, ``M1_2``, ``I1_2``."""
        return f"{self.kind}{self.layer}_{self.token}"

    @property
    def level(self) -> float:
        """Height in a drawing: embeddings 0, after layer l's attention 2 l + 1, its MLP
        2 l + 1.5, after layer l 2 l + 2."""
        if self.kind == "X":
            return 0.0
        return 2 * self.layer + {"A": 1.0, "M": 1.5, "I": 2.0}[self.kind]


@dataclass(frozen=True)
class FlowEdge:
    """An edge of the routes.

    Attributes:
        source: where the information comes from (lower layer).
        target: where it goes.
        weight: its contribution (after the threshold's renormalisation, if any).
        kind: ``"attention"`` (from another token), ``"residual"`` (the same token's residual,
            with attention to itself added, as the tool does), ``"mlp"`` (into or out of an
            MLP).
        heads: for an attention step, each head's share of ``weight``; else empty.
        residual: the residual's share of ``weight``.
    """

    source: FlowNode
    target: FlowNode
    weight: float
    kind: str
    heads: tuple[float, ...] = ()
    residual: float = 0.0


@dataclass(frozen=True)
class FlowGraph:
    """The information flow routes to the chosen output tokens.

    Attributes:
        tokens: the text's tokens.
        layers: the model's layers.
        outputs: the tokens whose routes are drawn (their ``I{L-1}`` nodes).
        threshold: the contribution threshold.
        renormalize: whether contributions were renormalised after the threshold.
        nodes: every node on a route, sorted by level then token.
        edges: every edge of the routes.
        promoted: each node's promoted tokens (node name -> tokens).
    """

    tokens: tuple[str, ...]
    layers: int
    outputs: tuple[int, ...]
    threshold: float
    renormalize: bool
    nodes: tuple[FlowNode, ...]
    edges: tuple[FlowEdge, ...]
    promoted: dict[str, tuple[str, ...]]


def _layer_input(layer: int, token: int) -> FlowNode:
    """The node a layer reads at ``token``: the previous layer's output, or the embeddings."""
    return FlowNode("I", layer - 1, token) if layer > 0 else FlowNode("X", 0, token)


def _incoming(
    node: FlowNode,
    attn: np.ndarray,
    attn_res: np.ndarray,
    mlp: np.ndarray,
    mlp_res: np.ndarray,
    parallel: tuple[bool, ...] = (),
) -> list[FlowEdge]:
    """The edges into ``node`` of the full graph (``build_full_graph``; a parallel layer's MLP
    reads the layer's input)."""
    layer, i = node.layer, node.token
    if node.kind == "A":
        edges = []
        for j in range(attn.shape[2]):
            source = _layer_input(layer, j)
            heads = attn[layer, i, j]
            res = float(attn_res[layer, i]) if j == i else 0.0
            kind = "residual" if j == i else "attention"
            weight = float(heads.sum()) + res
            edges.append(FlowEdge(source, node, weight, kind, tuple(map(float, heads)), res))
        return edges
    a, m = FlowNode("A", layer, i), FlowNode("M", layer, i)
    if node.kind == "M":
        reads = _layer_input(layer, i) if layer < len(parallel) and parallel[layer] else a
        return [FlowEdge(reads, node, float(mlp[layer, i]), "mlp")]
    if node.kind == "I":
        res = float(mlp_res[layer, i])
        return [
            FlowEdge(a, node, res, "residual", residual=res),
            FlowEdge(m, node, float(mlp[layer, i]), "mlp"),
        ]
    return []


def flow_graph(
    flow: FlowContributions,
    *,
    threshold: float = 0.04,
    renormalize: bool = True,
    outputs: Sequence[int] | None = None,
) -> FlowGraph:
    """The routes to ``outputs`` (default: the last token) through edges over the threshold.

    Args:
        flow: the contributions (``flow_contributions``).
        threshold: contributions up to this are dropped (the tool's default 0.04).
        renormalize: as the tool's default: threshold each contribution, renormalise the rest,
            keep edges above 0; False: keep edges above ``threshold``.
        outputs: token positions whose routes to draw.

    Raises:
        InputError: a threshold outside [0, 1) or an output position outside the text.
    """
    if not 0 <= threshold < 1:
        raise InputError(f"The threshold must be at least 0 and below 1, got {threshold}.")
    t = len(flow.tokens)
    outputs = (t - 1,) if outputs is None else tuple(int(o) for o in outputs)
    if not outputs or any(not 0 <= o < t for o in outputs):
        raise InputError(f"Output positions must lie in 0..{t - 1}, got {outputs}.")
    attn, attn_res = flow.attention, flow.attention_residual
    mlp, mlp_res = flow.mlp, flow.mlp_residual
    keep_above = threshold
    if renormalize:
        attn, attn_res = threshold_and_renormalize(threshold, attn, attn_res)
        mlp, mlp_res = threshold_and_renormalize(threshold, mlp, mlp_res)
        keep_above = 0.0
    seen = {FlowNode("I", flow.layers - 1, o) for o in outputs}
    todo = deque(sorted(seen, key=lambda n: n.token))
    edges: list[FlowEdge] = []
    while todo:
        node = todo.popleft()
        for edge in _incoming(node, attn, attn_res, mlp, mlp_res, flow.parallel):
            if edge.weight > keep_above:
                edges.append(edge)
                if edge.source not in seen:
                    seen.add(edge.source)
                    todo.append(edge.source)
    nodes = tuple(sorted(seen, key=lambda n: (n.level, n.token)))
    return FlowGraph(
        tokens=flow.tokens,
        layers=flow.layers,
        outputs=outputs,
        threshold=threshold,
        renormalize=renormalize,
        nodes=nodes,
        edges=tuple(edges),
        promoted={n.name: flow.promoted.get(n.name, ()) for n in nodes},
    )


def information_flow(
    text: str | Generation,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    threshold: float = 0.04,
    renormalize: bool = True,
    outputs: Sequence[int] | None = None,
    max_tokens: int | None = None,
    top_k: int = 3,
) -> FlowGraph:
    """The information flow routes of ``text`` to its last token (or ``outputs``): the LLM
    Transparency Tool's contribution graph (``flow_contributions`` then ``flow_graph``).

    Raises:
        UnsupportedModelError: post-norm encoders (BERT, MiniLM) and models without a
            next-token head.
        InputError: the text, the threshold or the output positions.
    """
    flow = flow_contributions(text, model=model, max_tokens=max_tokens, top_k=top_k)
    return flow_graph(flow, threshold=threshold, renormalize=renormalize, outputs=outputs)

"""The Information flow page: the routes to a token drawn across layers and tokens (the LLM
Transparency Tool's contribution graph), direct logit attribution and the logit lens."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from mhsa.causal.attribution import HeadAttribution, LogitLens
from mhsa.causal.flow import FlowGraph, FlowNode
from mhsa.plots.alt import plain, set_alt
from mhsa.plots.common import apply_layout, label, signed_scale

__all__ = ["attribution_figure", "flow_figure", "logit_lens_figure"]

_EDGE_COLORS = {"attention": "#0068c9", "residual": "#83c9ff", "mlp": "#ff8700"}
_NODE_NAMES = {"X": "embeddings", "A": "after attention", "M": "MLP", "I": "after layer"}


def _node_xy(node: FlowNode) -> tuple[float, float]:
    """x: the token (an MLP a little to its right), y: the level (embeddings at the bottom)."""
    return node.token + (0.3 if node.kind == "M" else 0.0), node.level


def _node_hover(graph: FlowGraph, node: FlowNode) -> str:
    where = "embeddings" if node.kind == "X" else f"layer {node.layer}, {_NODE_NAMES[node.kind]}"
    promoted = graph.promoted.get(node.name, ())
    tokens = ", ".join(label(t, 20) for t in promoted) if promoted else "(nothing)"
    return f"{label(graph.tokens[node.token], 30)} #{node.token}, {where}<br>promotes: {tokens}"


def _edge_hover(graph: FlowGraph, edge) -> str:
    text = (
        f"{label(graph.tokens[edge.source.token], 20)} #{edge.source.token} → "
        f"{label(graph.tokens[edge.target.token], 20)} #{edge.target.token}"
        f"<br>{edge.kind}, layer {edge.target.layer}: {edge.weight:.3f}"
    )
    shares = sorted(enumerate(edge.heads), key=lambda hv: -hv[1])
    heads = [f"L{edge.target.layer}H{h} {v:.3f}" for h, v in shares if v > 0.005][:6]
    if heads:
        text += "<br>heads: " + ", ".join(heads)
    if edge.residual > 0 and edge.heads:
        text += f"<br>residual {edge.residual:.3f}"
    return text


def flow_figure(graph: FlowGraph, *, title: str | None = None) -> go.Figure:
    """The routes: tokens across (x), the residual stream rising through the layers (y);
    each edge a line whose width and opacity grow with its contribution (attention blue,
    residual light blue, MLP orange), its midpoint naming its heads on hover; each node
    naming its promoted tokens on hover."""
    fig = go.Figure()
    for edge in sorted(graph.edges, key=lambda e: e.weight):
        (x0, y0), (x1, y1) = _node_xy(edge.source), _node_xy(edge.target)
        fig.add_trace(
            go.Scatter(
                x=[x0, x1],
                y=[y0, y1],
                mode="lines",
                line={"width": 1 + 7 * edge.weight, "color": _EDGE_COLORS[edge.kind]},
                opacity=0.25 + 0.75 * min(1.0, edge.weight),
                hoverinfo="skip",
                showlegend=False,
            )
        )
    fig.add_trace(  # edge midpoints carry the hover (lines have none in plotly)
        go.Scatter(
            x=[(_node_xy(e.source)[0] + _node_xy(e.target)[0]) / 2 for e in graph.edges],
            y=[(_node_xy(e.source)[1] + _node_xy(e.target)[1]) / 2 for e in graph.edges],
            mode="markers",
            marker={"size": 6, "color": "rgba(0,0,0,0.15)"},
            customdata=[_edge_hover(graph, e) for e in graph.edges],
            hovertemplate="%{customdata}<extra></extra>",
            name="edges",
            showlegend=False,
        )
    )
    nodes = graph.nodes
    fig.add_trace(
        go.Scatter(
            x=[_node_xy(n)[0] for n in nodes],
            y=[_node_xy(n)[1] for n in nodes],
            mode="markers",
            marker={
                "size": 11,
                "color": [_EDGE_COLORS["mlp"] if n.kind == "M" else "#004280" for n in nodes],
                "symbol": ["square" if n.kind == "M" else "circle" for n in nodes],
            },
            customdata=[_node_hover(graph, n) for n in nodes],
            hovertemplate="%{customdata}<extra></extra>",
            name="nodes",
            showlegend=False,
        )
    )
    t = len(graph.tokens)
    levels = [0, *(2 * layer + 2 for layer in range(graph.layers))]
    fig.update_layout(
        xaxis={
            "tickmode": "array",
            "tickvals": list(range(t)),
            "ticktext": [label(s, 16) for s in graph.tokens],
            "range": [-0.6, t - 0.4],
            "showgrid": False,
            "title": {"text": "token"},
        },
        yaxis={
            "tickmode": "array",
            "tickvals": levels,
            "ticktext": ["embeddings", *(f"after L{layer}" for layer in range(graph.layers))],
            "showgrid": True,
            "zeroline": False,
        },
    )
    how = "renormalised after the threshold" if graph.renormalize else "no renormalisation"
    to = ", ".join(f"{graph.tokens[o]} #{o}" for o in graph.outputs)
    last = graph.outputs == (t - 1,)
    where = "the last token" if last else to
    shown = title or f"Information flow to {where} (threshold {graph.threshold:g}, {how})"
    apply_layout(fig, shown, height=min(900, 160 + 70 * (2 * graph.layers + 1)))
    if not graph.edges:
        return set_alt(fig, f"{plain(shown)}: no route above the threshold.")
    top = max(graph.edges, key=lambda e: e.weight)
    kinds = sorted({e.kind for e in graph.edges})
    return set_alt(
        fig,
        f"{plain(shown)}: {len(graph.edges)} edges ({', '.join(kinds)}) between "
        f"{len(graph.nodes)} nodes; the strongest, {top.kind} from {top.source.name} "
        f"({graph.tokens[top.source.token]!r}) to {top.target.name}, carries {top.weight:.2f}.",
    )


def attribution_figure(attribution: HeadAttribution) -> go.Figure:
    """Direct logit attribution: each head's contribution as a layers x heads map (red below 0,
    blue above, centred on 0) beside bars for the other components."""
    from plotly.subplots import make_subplots

    a = attribution
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.5, 0.5],
        subplot_titles=["heads", "other components"],
        horizontal_spacing=0.3,  # room for the colour bar and the bars' names between them
    )
    fig.add_trace(
        go.Heatmap(
            z=a.heads.astype(np.float32),
            x=list(range(a.heads.shape[1])),
            y=list(range(a.heads.shape[0])),
            **signed_scale(a.heads),
            colorbar={
                "thickness": 12,
                "title": {"text": "logit diff"},
                "x": 0.37,
                "xanchor": "left",
                "len": 0.9,
            },
            hovertemplate="L%{y}H%{x}: %{z:.4f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    frame = a.frame()
    others = frame[frame["kind"] != "head"]
    fig.add_trace(
        go.Bar(
            x=others["contribution"].to_numpy(),
            y=others["component"].tolist(),
            orientation="h",
            marker={"color": ["#0068c9" if v >= 0 else "#ff4b4b" for v in others["contribution"]]},
            hovertemplate="%{y}: %{x:.4f}<extra></extra>",
            showlegend=False,
        ),
        row=1,
        col=2,
    )
    fig.update_xaxes(title="head", row=1, col=1, tickmode="linear")
    fig.update_yaxes(title="layer", row=1, col=1, autorange="reversed", tickmode="linear")
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_xaxes(title="logit difference", row=1, col=2)
    title = (
        f"Direct logit attribution of logit({a.answer}) − logit({a.wrong}) = "
        f"{a.logit_diff:.3f} (components sum to {a.total:.3f})"
    )
    return apply_layout(fig, title, height=max(380, 60 + 34 * len(others)))


def logit_lens_figure(lens: LogitLens) -> go.Figure:
    """The logit lens: stages (the embeddings, after each layer) x positions, each cell the top
    token's probability, written with the token; hover lists the top tokens. With an answer
    pair, the colour is ``logit(answer) - logit(wrong)`` instead."""
    stages, t = lens.top_tokens.shape[:2]
    text = [[label(lens.top_tokens[s, i, 0], 12) for i in range(t)] for s in range(stages)]
    hover = [
        [
            "<br>".join(
                f"{label(tok, 20)} {p:.3f}"
                for tok, p in zip(lens.top_tokens[s, i], lens.top_probs[s, i], strict=True)
            )
            for i in range(t)
        ]
        for s in range(stages)
    ]
    columns = [f"{label(tok, 16)} #{i}" for i, tok in enumerate(lens.tokens)]
    signed = lens.logit_diff is not None
    z = lens.logit_diff if signed else lens.top_probs[:, :, 0]
    heatmap = go.Heatmap(
        z=np.asarray(z, dtype=np.float32),
        x=columns,
        y=list(lens.stages),
        text=text,
        texttemplate="%{text}",
        customdata=hover,
        **(signed_scale(z) if signed else {"colorscale": "Blues", "zmin": 0.0, "zmax": 1.0}),
        hovertemplate="%{y}, %{x}<br>%{customdata}<extra></extra>",
        colorbar={
            "thickness": 12,
            "title": {"text": "logit diff" if signed else "top probability"},
        },
    )
    fig = go.Figure(heatmap)
    fig.update_layout(
        xaxis={"type": "category", "side": "top", "showgrid": False},
        yaxis={"type": "category", "autorange": "reversed", "showgrid": False},
    )
    what = (
        f"logit({lens.answer}) − logit({lens.wrong})" if signed else "the top token's probability"
    )
    return apply_layout(
        fig, f"Logit lens: the top token at each layer and position; colour {what}", height=None
    )

"""Circuit runs by hand: the plain transformers model with torch hooks (its own attention blocks,
not our module), every receiver input reading its own copy of the residual (TransformerLens's
split q/k/v input) with something added to it, for checking ``mhsa.circuits`` against.

A sequential layer's MLP reads ``ln_2`` of the residual after attention; a parallel layer
(GPT-J, GPT-NeoX/Pythia with ``use_parallel_residual``, Phi, Falcon) computes ``x +
attn(ln_a(x)) + mlp(ln_m(x))`` (EAP-IG's ``parallel_attn_mlp``): its MLP reads the layer's
input. Each family's module names and fused row layouts are written out here from transformers'
own code (``modeling_gpt2.py``, ``modeling_llama.py``, ``modeling_gpt_neox.py``,
``modeling_gptj.py``, ``modeling_phi.py``, ``modeling_falcon.py``, ``modeling_qwen3.py``,
``modeling_gemma.py``, ``modeling_phi3.py``), not read from ``mhsa``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import mhsa

__all__ = ["Parts", "hand_run", "model_parts"]

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
        out: per layer, the output projection (``nn.Linear``, or GPT-2's ``Conv1D``).
        heads, kv_heads, d_head: the attention's sizes.
    """

    layers: list[nn.Module]
    norms: list[tuple[nn.Module, nn.Module]]
    parallel: bool
    final: nn.Module
    projection: Callable[[int, str], nn.Module]
    rows: Rows
    out: list[nn.Module]
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


def model_parts(lm: mhsa.engine.LoadedModel) -> Parts:
    """Where ``lm``'s family keeps what the hand run touches."""
    cfg, base = lm.config, lm.model
    kind = cfg.model_type
    heads = cfg.num_attention_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv = heads
    if kind == "gpt2":  # Conv1D c_attn: every query head, then every key head, then every value
        layers, attn = list(base.h), [layer.attn for layer in base.h]
        norms = [(layer.ln_1, layer.ln_2) for layer in layers]
        parallel, final, out = False, base.ln_f, "c_proj"

        def projection(i: int, _part: str) -> nn.Module:
            return attn[i].c_attn

        def rows(part: str, h: int) -> slice:
            return _block(d, "qkv".index(part) * heads + h)

    elif kind == "gpt_neox":  # fused per head: [q k v] of head 0, then of head 1, ...
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
        else:  # the Llama layout (Llama, Qwen3, Gemma)
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


def hand_run(
    lm: mhsa.engine.LoadedModel,
    text: str,
    added: Mapping[tuple, torch.Tensor],
    embeddings: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[Any, torch.Tensor]]:
    """The plain model on ``text`` with ``added[target]`` added to that target's own copy of
    the residual it reads: ``("q"|"k"|"v", layer, head or key/value head)``, ``("M", layer)``
    or ``("logits",)``; ``embeddings [rows, T, D]``: in place of the residual entering layer 0,
    one row each. Returns the logits and every source's output."""
    p = model_parts(lm)
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
                linear = isinstance(module, nn.Linear)  # else GPT-2's Conv1D: [in, out]
                w_o = module.weight[:, cols].T if linear else module.weight[cols]  # (Dh, D)
                acts[(i, h)] = args[0][..., cols] @ w_o

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

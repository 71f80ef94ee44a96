"""The residual stream of a post-norm encoder (BERT, RoBERTa, ELECTRA, MiniLM, DistilBERT,
ALBERT), part by part, through its chain of norms with their scales frozen
(``PostNormPass``, ``postnorm_pass``, ``PostNormPass.sources``).

A post-norm layer ``l`` with input ``x_l`` (``x_0``: the embeddings' output) computes::

    y_l     = LN_a(x_l + sum_h a_{l,h} + b_O)      a_{l,h} = z_h W_O^h
    x_{l+1} = LN_m(y_l + mlp_l(y_l))

so the stream is not a sum of the heads' and MLPs' outputs (Kobayashi et al. 2021 decompose it
through the norms). With each LayerNorm's scale ``1 / sigma`` frozen per position at the real
forward (TransformerLens's ``apply_ln_to_stack``: the norm becomes affine), every LayerNorm is
linear (centre, times the frozen ``1 / sigma`` and the weight ``gamma``) plus its bias
``beta``, and the stream entering layer ``L`` is a sum of parts, each pushed through every norm
after the point where it was written: ``input`` (the embeddings' LayerNorm of token, position
and token-type embeddings, its ``beta`` left out; the whole ``x_0`` where a projection follows
that norm, as ELECTRA's and ALBERT's), each earlier head ``L{l}H{h}``, each earlier MLP's output
``M{l}`` (nonlinear in its input: one part as the real forward computed it, its output bias
included, as TransformerLens's ``get_full_resid_decomposition`` keeps ``mlp_out``), and ``bias``
(the attention output biases ``b_O`` and every norm's ``beta``, pushed through the norms after
them). The parts are recorded through our module (``mhsa.engine.runs.swap``) with the model's own
LayerNorms observed in the order the forward calls them, and checked to rebuild every layer's
input.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mhsa.engine.encoding import check_text, encode
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks, run_with_our_blocks
from mhsa.engine.stream.frozen_norm import FrozenNorm, frozen_norm
from mhsa.errors import UnsupportedModelError

__all__ = ["INPUT_PART", "POSTNORM_BIAS", "PostNormPass", "postnorm_pass"]

#: the names of the parts besides heads (``L{l}H{h}``) and MLPs (``M{l}``)
INPUT_PART, POSTNORM_BIAS = "input", "bias"

#: a rebuilt stream may differ from the recorded one by this much of its largest value
_TOLERANCE = 1e-4


@dataclass(frozen=True, eq=False)
class PostNormPass:
    """One text's pass through a post-norm encoder (batch 1, float32, on the model's device).
    L layers, H heads, T tokens, D = d_model, Dh = d_head.

    Attributes:
        tokens: the tokens as the model sees them.
        resid_pre: per layer, the stream entering it ``[T, D]`` (layer 0: the embeddings'
            output), and last the encoder's output: ``L + 1`` of them.
        input_part: the ``input`` part of ``x_0`` ``[T, D]`` (``x_0`` less the embedding
            LayerNorm's bias); embedding_bias: that bias ``[D]`` (zeros where a projection
            follows the norm, or there is none).
        context: per layer, each head's context ``[H, T, Dh]``.
        w_o: per layer, each head's slice of the output projection ``[H, Dh, D]``.
        b_o: per layer, the output projection's bias ``[D]`` (zeros where it has none).
        ln_attn, ln_mlp: per layer, its LayerNorm after the attention (``LN_a``) and after
            the MLP (``LN_m``), each frozen per position at what it normalised.
        mlp_out: per layer, its MLP's output ``[T, D]`` (``LN_m``'s input less ``LN_a``'s
            output).
    """

    tokens: tuple[str, ...]
    resid_pre: tuple[torch.Tensor, ...]
    input_part: torch.Tensor
    embedding_bias: torch.Tensor
    context: tuple[torch.Tensor, ...]
    w_o: tuple[torch.Tensor, ...]
    b_o: tuple[torch.Tensor, ...]
    ln_attn: tuple[FrozenNorm, ...]
    ln_mlp: tuple[FrozenNorm, ...]
    mlp_out: tuple[torch.Tensor, ...]

    @property
    def layers(self) -> int:
        return len(self.context)

    @property
    def heads(self) -> int:
        return self.context[0].shape[0]

    def names(self, layer: int) -> list[str]:
        """The parts' names of the stream entering ``layer``, in ``sources``' order."""
        names = [INPUT_PART]
        for j in range(layer):
            names += [f"L{j}H{h}" for h in range(self.heads)] + [f"M{j}"]
        return [*names, POSTNORM_BIAS]

    def sources(self, layer: int) -> torch.Tensor:
        """The parts of the stream entering ``layer`` ``[S, T, D]`` (float64), in ``names``'
        order: each written part pushed through every frozen norm after it (centred, times
        ``1 / sigma`` and ``gamma``), each norm's ``beta`` added to ``bias``.

        Raises:
            UnsupportedModelError: they do not add up to the recorded stream.
        """
        heads = self.heads
        first = self.input_part
        count = len(self.names(layer))
        parts = first.new_zeros((count, *first.shape), dtype=torch.float64)  # (S, T, D)
        parts[0] = first.double()
        parts[-1] = self.embedding_bias.double()
        row = 1
        for j in range(layer):
            out = torch.einsum("htd,hdm->htm", self.context[j].double(), self.w_o[j].double())
            parts[row : row + heads] = out  # (H, T, D)
            parts[-1] += self.b_o[j].double()
            row += heads
            _through(self.ln_attn[j], parts, row)
            parts[row] = self.mlp_out[j].double()
            row += 1
            _through(self.ln_mlp[j], parts, row)
        whole = self.resid_pre[layer].double()
        gap = float((parts.sum(0) - whole).abs().max())
        if gap > _TOLERANCE * (1.0 + float(whole.abs().max())):
            raise UnsupportedModelError(
                f"the stream entering layer {layer} is not the sum of its parts through the "
                f"frozen norms (off by {gap:.3g}): this model's layout is not covered."
            )
        return parts


def _through(norm: FrozenNorm, parts: torch.Tensor, written: int) -> None:
    """The written parts ``parts[:written]`` and ``bias`` (the last) through ``norm``'s
    linear part in place; its bias added to ``bias``."""
    scale = torch.as_tensor(norm.inverse_scale).to(parts)  # (T, 1)
    weight = norm.weight.to(parts)
    for rows in (parts[:written], parts[-1:]):
        rows -= rows.mean(-1, keepdim=True)
        rows *= scale
        rows *= weight
    if norm.bias is not None:
        parts[-1] += norm.bias.to(parts)


def _named_inputs(lm: LoadedModel, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs the base model's forward names (a saved tokenizer may give more)."""
    params = inspect.signature(lm.model.forward).parameters
    named = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    return {k: v for k, v in inputs.items() if k in named}


def _refusal(lm: LoadedModel, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{lm.display_name}: {why}. Splitting a post-norm encoder's stream follows the BERT "
        "family's layers (BERT, RoBERTa, ELECTRA, MiniLM, DistilBERT, ALBERT): the attention "
        "block's output added to its input and put through a LayerNorm, then the MLP's output "
        "added to that and put through a second LayerNorm."
    )


def postnorm_pass(
    text: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    max_tokens: int | None = None,
) -> PostNormPass:
    """``text`` through a post-norm encoder (our module in every attention block), its stream
    recorded in parts: each layer's input and heads' contexts from our module, the model's own
    LayerNorms as the forward calls them (after each attention and each MLP), frozen there.

    Raises:
        UnsupportedModelError: not an encoder, or layers that are not post-norm (ModernBERT is
            a pre-norm encoder: ``residual_pass(..., with_head=False)`` records its stream).
        InputError: the text is empty or too long.
    """
    text = check_text(text)
    lm = resolve_model(model)
    with lm.lock, torch.inference_mode():
        blocks = our_blocks(lm)
        if lm.is_encoder_decoder or not blocks or blocks[0].causal:
            raise _refusal(lm, "not an encoder")
        encoded = encode(lm, text, None, max_tokens)
        events: list[tuple[Any, ...]] = []
        handles = [
            m.register_forward_hook(
                lambda mod, args, out: events.append(("norm", mod, args[0], out))
            )
            for m in lm.model.modules()
            if isinstance(m, nn.LayerNorm)
        ]
        try:
            observers = {b.layer: _observer(events, b.layer) for b in blocks}
            inputs = _named_inputs(lm, encoded.inputs_on(lm.device))
            out = run_with_our_blocks(lm, blocks, OurPass(observers=observers), inputs)
        finally:
            for handle in handles:
                handle.remove()
        last = out.last_hidden_state[0].float()
        return _assembled(lm, blocks, tuple(encoded.tokens.strings), events, last)


def _observer(events: list[tuple[Any, ...]], layer: int):
    def observe(name: str, tensor: torch.Tensor) -> None:
        if name in ("X", "concatenated heads"):
            events.append((name, layer, tensor[0].float()))

    return observe


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    return bool(torch.allclose(a, b, atol=_TOLERANCE * (1.0 + float(b.abs().max()))))


def _assembled(
    lm: LoadedModel,
    blocks: list[OurBlock],
    tokens: tuple[str, ...],
    events: list[tuple[Any, ...]],
    last: torch.Tensor,
) -> PostNormPass:
    """The recorded events in layers: before layer 0's input the embeddings' norms; in each
    layer, after its heads, exactly two LayerNorms (``LN_a``, ``LN_m``), checked."""
    starts = [i for i, e in enumerate(events) if e[0] == "X"]
    if len(starts) != len(blocks):
        raise _refusal(lm, "its attention blocks do not each read the stream once")
    x0 = events[starts[0]][2]
    embedding = [e for e in events[: starts[0]] if e[0] == "norm"]
    input_part, embedding_bias = x0, torch.zeros_like(x0[0])
    if embedding and embedding[-1][1].bias is not None and _close(embedding[-1][3][0], x0):
        embedding_bias = embedding[-1][1].bias.detach().float()
        input_part = x0 - embedding_bias
    resid, context, w_o, b_o, ln_attn, ln_mlp, mlp_out = [], [], [], [], [], [], []
    for j, block in enumerate(blocks):
        end = starts[j + 1] if j + 1 < len(starts) else len(events)
        span = events[starts[j] : end]
        x = span[0][2]
        merged = next((e[2] for e in span if e[0] == "concatenated heads"), None)
        norms = [e for e in span if e[0] == "norm"]
        if merged is None or len(norms) != 2:
            raise _refusal(lm, f"layer {j} calls {len(norms)} LayerNorms after its attention")
        ours = block.ours
        h, dh = ours.num_heads, ours.d_head
        weight = ours.out.weight.detach().float()  # (D, H Dh)
        heads_w_o = weight.view(weight.shape[0], h, dh).permute(1, 2, 0)  # (H, Dh, D)
        bias = ours.out.bias
        bias = torch.zeros_like(x[0]) if bias is None else bias.detach().float()
        (_, attn_norm, attn_in, attn_out), (_, mlp_norm, mlp_in, mlp_normed) = norms
        attn_in, attn_out = attn_in[0].float(), attn_out[0].float()
        mlp_in, mlp_normed = mlp_in[0].float(), mlp_normed[0].float()
        written = merged @ weight.T + bias
        following = starts[j + 1] if j + 1 < len(starts) else None
        x_next = last if following is None else events[following][2]
        if not _close(x + written, attn_in) or not _close(mlp_normed, x_next):
            raise _refusal(
                lm,
                f"layer {j} does not put the sum of its input and its attention output through "
                "a LayerNorm (a pre-norm encoder such as ModernBERT normalises before its "
                "attention: its stream is split by mhsa.engine.stream.residual's pre-norm pass, as "
                "qk_attribution does)",
            )
        resid.append(x)
        context.append(merged.view(-1, h, dh).transpose(0, 1))  # (H, T, Dh)
        w_o.append(heads_w_o)
        b_o.append(bias)
        ln_attn.append(frozen_norm(attn_norm, attn_in))
        ln_mlp.append(frozen_norm(mlp_norm, mlp_in))
        mlp_out.append(mlp_in - attn_out)
    return PostNormPass(
        tokens=tokens,
        resid_pre=(*resid, last),
        input_part=input_part,
        embedding_bias=embedding_bias,
        context=tuple(context),
        w_o=tuple(w_o),
        b_o=tuple(b_o),
        ln_attn=tuple(ln_attn),
        ln_mlp=tuple(ln_mlp),
        mlp_out=tuple(mlp_out),
    )

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
them). The parts are read from one pass of the stream recorder
(``mhsa.engine.stream.recorder.recorded``: each layer's ``resid_pre``, ``z`` and ``resid_post``,
with every call of the model's own LayerNorms in the order the forward makes them), and checked
to rebuild every layer's input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mhsa.engine.encoding import check_text, encode
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.runs.swap import OurBlock, our_blocks
from mhsa.engine.stream.frozen_norm import FrozenNorm, frozen_norm
from mhsa.engine.stream.points import layer_of
from mhsa.engine.stream.recorder import Recording, recorded
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
    recorded in parts by the stream recorder: each layer's input and heads' contexts, the
    model's own LayerNorms as the forward calls them (after each attention and each MLP),
    frozen there.

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
        norms = [m for m in lm.model.modules() if isinstance(m, nn.LayerNorm)]
        # the pattern too: the heads' contexts from the eager steps, as the scores are read
        names = [f"L{b.layer}.{p}" for b in blocks for p in _POINTS]
        kept = recorded(lm, blocks, encoded.inputs, names, on_device=True, calls=norms)
        return _assembled(lm, blocks, tuple(encoded.tokens.strings), kept)


#: the recorder's points ``postnorm_pass`` reads of each layer (``L{l}.<point>``)
_POINTS = ("resid_pre", "pattern", "z", "resid_post")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    return bool(torch.allclose(a, b, atol=_TOLERANCE * (1.0 + float(b.abs().max()))))


def _assembled(
    lm: LoadedModel, blocks: list[OurBlock], tokens: tuple[str, ...], kept: Recording
) -> PostNormPass:
    """The recorded pass in layers: before layer 0's input the embeddings' norms; in each
    layer, after its heads, exactly two LayerNorms (``LN_a``, ``LN_m``), checked."""
    values = kept.values
    if any(f"L{b.layer}.{p}" not in values for b in blocks for p in _POINTS):
        raise _refusal(lm, "its attention blocks do not each read the stream once")

    def at(layer: int, point: str) -> torch.Tensor:
        return values[f"L{layer}.{point}"].float()

    x0, last = at(blocks[0].layer, "resid_pre"), at(blocks[-1].layer, "resid_post")
    embedding = [c for c in kept.calls if c.after is None]  # the embeddings' norms
    norm = embedding[-1] if embedding else None
    input_part, embedding_bias = x0, torch.zeros_like(x0[0])
    if norm is not None and norm.module.bias is not None and _close(norm.gave[0].float(), x0):
        embedding_bias = norm.module.bias.detach().float()
        input_part = x0 - embedding_bias

    resid, context, w_o, b_o, ln_attn, ln_mlp, mlp_out = [], [], [], [], [], [], []
    for j, block in enumerate(blocks):
        x = at(block.layer, "resid_pre")
        ours = block.ours
        h, dh = ours.num_heads, ours.d_head
        z = at(block.layer, "z")  # (H, T, Dh)
        merged = z.transpose(0, 1).reshape(z.shape[1], h * dh)  # (T, H Dh)
        norms = [c for c in kept.calls if c.after and layer_of(c.after) == block.layer]
        if len(norms) != 2:
            raise _refusal(lm, f"layer {j} calls {len(norms)} LayerNorms after its attention")
        weight = ours.out.weight.detach().float()  # (D, H Dh)
        heads_w_o = weight.view(weight.shape[0], h, dh).permute(1, 2, 0)  # (H, Dh, D)
        bias = ours.out.bias
        bias = torch.zeros_like(x[0]) if bias is None else bias.detach().float()
        after_attention, after_mlp = norms
        attn_in, attn_out = after_attention.given[0].float(), after_attention.gave[0].float()
        mlp_in, mlp_normed = after_mlp.given[0].float(), after_mlp.gave[0].float()
        written = merged @ weight.T + bias
        following = blocks[j + 1].layer if j + 1 < len(blocks) else None
        x_next = last if following is None else at(following, "resid_pre")
        if not _close(x + written, attn_in) or not _close(mlp_normed, x_next):
            raise _refusal(
                lm,
                f"layer {j} does not put the sum of its input and its attention output through "
                "a LayerNorm (a pre-norm encoder such as ModernBERT normalises before its "
                "attention: its stream is split by mhsa.engine.stream.residual's pre-norm pass, as "
                "qk_attribution does)",
            )
        resid.append(x)
        context.append(z)
        w_o.append(heads_w_o)
        b_o.append(bias)
        ln_attn.append(frozen_norm(after_attention.module, attn_in))
        ln_mlp.append(frozen_norm(after_mlp.module, mlp_in))
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

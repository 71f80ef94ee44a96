"""The residual stream of a pre-norm decoder, part by part (``ResidualPass``, ``residual_pass``):
the embeddings, each head's output (its context through its slice of ``W_O``), each attention
block's output bias, each MLP's output, read from one pass of the stream recorder
(``mhsa.engine.stream.recorder.recorded``: its ``resid_pre``, ``v``, ``pattern``, ``z``,
``attn_out``, ``mlp_out``, ``resid_post`` and ``logits`` points, kept on the model's device) and
checked to sum to each layer's output. Direct logit attribution and the logit lens
(``mhsa.causal.attribution``) and the residual flow (``mhsa.causal.flow``) read it;
``mhsa.causal.attribution`` re-exports both names.

Parallel layers (GPT-NeoX with ``use_parallel_residual``, GPT-J, Phi, Falcon) feed attention and
MLP the same input and add both outputs to it: the MLP reads the layer's input rather than the
residual after attention (``ResidualPass.parallel``). A pre-norm encoder (ModernBERT: the same
sum, every key read) runs with ``residual_pass(..., with_head=False)``, which records the
stream alone (no logits). Post-norm models are refused (``UnsupportedModelError``); a post-norm
encoder's stream is split through its frozen norms by ``mhsa.engine.stream.postnorm``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mhsa.engine.encoding import Encoded, check_text, encode
from mhsa.engine.families.layout import (
    attention_norm_of,
    check_layer_norms,
    check_sums,
    final_norm_of,
    mlp_of,
    post_norm_error,
)
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.runs.generation import Generation, generation_encoded
from mhsa.engine.runs.swap import OurBlock, our_blocks
from mhsa.engine.stream.frozen_norm import FrozenNorm, frozen_norm
from mhsa.engine.stream.recorder import NORMED_POINTS, Recording, recorded
from mhsa.errors import UnsupportedModelError

__all__ = ["ResidualPass", "residual_pass"]


@dataclass(frozen=True, eq=False)
class ResidualPass:
    """One text's pass through a pre-norm decoder, its residual stream in parts (batch 1, on
    the model's device). L layers, H heads, T tokens, D = d_model, Dh = d_head.

    Attributes:
        tokens: the tokens as the model sees them.
        ids: their ids.
        resid_pre: per layer, the residual entering it ``[T, D]`` (layer 0: the embeddings).
        probabilities: per layer, each head's attention ``[H, T, T]``.
        values: per layer, each head's values ``[H, T, Dh]`` (bias included; grouped-query
            values repeated for the query heads that share them).
        b_v: per layer, each head's value bias ``[H, Dh]`` (None where there is none).
        context: per layer, each head's context ``[H, T, Dh]`` (attention times values).
        w_o: per layer, each head's slice of the output projection ``[H, Dh, D]``.
        b_o: per layer, the output projection's bias ``[D]`` (None where it has none).
        attn_out: per layer, the attention block's output ``[T, D]``.
        mlp_out: per layer, the MLP's output ``[T, D]``.
        resid_post: per layer, the residual leaving it ``[T, D]``.
        logits: the model's logits ``[T, V]`` (``residual_pass(..., all_logits=False)``: the
            last position's only, ``[1, V]``, where the model's head can skip the others;
            ``with_head=False``: none, ``[0, 0]``).
        final_norm: the model's final norm.
        unembed: the unembedding (``lm_head``); None for a pass without the head
            (``with_head=False``).
        attn_norm: per layer, the norm the layer puts after its attention output before the
            residual sum (Gemma 2/3, OLMo 2), frozen at each position of the whole attention
            output (``apply_ln_to_stack``'s convention), or None; empty: none anywhere.
            ``attn_out`` is then that norm's output (what the residual receives), and
            ``mlp_out`` likewise the output of a norm after the MLP.
        logit_softcap: the model's final soft-cap of the logits, ``c * tanh(logits / c)``
            (Gemma 2's ``final_logit_softcapping``), or None. ``logits`` are the capped ones.
        parallel: per layer, whether its MLP reads the layer's input (a parallel layer) rather
            than the residual after attention.
    """

    tokens: tuple[str, ...]
    ids: tuple[int, ...]
    resid_pre: tuple[torch.Tensor, ...]
    probabilities: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    b_v: tuple[torch.Tensor | None, ...]
    context: tuple[torch.Tensor, ...]
    w_o: tuple[torch.Tensor, ...]
    b_o: tuple[torch.Tensor | None, ...]
    attn_out: tuple[torch.Tensor, ...]
    mlp_out: tuple[torch.Tensor, ...]
    resid_post: tuple[torch.Tensor, ...]
    logits: torch.Tensor
    final_norm: nn.Module
    unembed: nn.Module | None
    attn_norm: tuple[FrozenNorm | None, ...] = ()
    logit_softcap: float | None = None
    parallel: tuple[bool, ...] = ()

    @property
    def layers(self) -> int:
        return len(self.resid_pre)

    @property
    def heads(self) -> int:
        return self.probabilities[0].shape[0]

    def post_attention_norm(self, layer: int) -> FrozenNorm | None:
        """The frozen norm after ``layer``'s attention output (per position), or None."""
        return self.attn_norm[layer] if self.attn_norm else None

    def head_outputs(self, layer: int, position: int) -> torch.Tensor:
        """Each head's part of what ``layer``'s attention adds to the residual at
        ``position`` ``[H, D]``: its context through its slice of ``W_O`` (the output bias
        left out), then through the frozen norm after the attention output if the layer has
        one."""
        ctx = self.context[layer][:, position]  # (H, Dh)
        out = torch.einsum("hd,hdm->hm", ctx, self.w_o[layer])
        norm = self.post_attention_norm(layer)
        return out if norm is None else norm.at(position)(out)

    def attn_bias(self, layer: int, position: int) -> torch.Tensor:
        """The rest of what ``layer``'s attention adds at ``position`` ``[D]``: its output
        bias (through the frozen norm after the attention, if any) and that norm's bias; zeros
        where there are none."""
        b_o = self.b_o[layer]
        norm = self.post_attention_norm(layer)
        part = torch.zeros_like(self.attn_out[layer][position]) if b_o is None else b_o
        if norm is None:
            return part
        norm = norm.at(position)
        return norm(part) + (0 if norm.bias is None else norm.bias)

    def unembed_vectors(self, vectors: torch.Tensor) -> torch.Tensor:
        """``vectors [..., D]`` through the final norm (their own statistics), the
        unembedding and the model's final soft-cap (if any): the logit lens."""
        if self.unembed is None:
            raise UnsupportedModelError("this pass was recorded without the model's head")
        logits = self.unembed(self.final_norm(vectors))
        cap = self.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap


def _checked_decoder(lm: LoadedModel, with_head: bool = True) -> list[OurBlock]:
    """Our blocks of ``lm``, a pre-norm decoder with a next-token head (``with_head=False``:
    any pre-norm stack, an encoder's too, with or without a head).

    Raises:
        UnsupportedModelError: an encoder-decoder, a post-norm encoder, or a model without a
            next-token head.
    """
    if lm.is_encoder_decoder:
        raise UnsupportedModelError(
            f"{lm.display_name} is an encoder-decoder: its decoder also reads the encoder's "
            "output through cross attention, a second residual stream that this decomposition "
            "does not follow. Use a causal language model with pre-norm layers: GPT-2, the "
            "Llama family (Llama, Qwen2/3, Mistral, Gemma 1-3, OLMo 2, Phi-3) or a toy model "
            "such as toy:induction."
        )
    blocks = our_blocks(lm)
    if not blocks[0].causal and (
        with_head or all(attention_norm_of(_layer(b)) is None for b in blocks)
    ):
        raise post_norm_error(lm)
    if with_head and (lm.lm_head != "causal" or lm.head_model is None):
        raise UnsupportedModelError(
            f"{lm.display_name} has no next-token (language-model) head: load a causal LM "
            "checkpoint (GPT-2, Llama, Qwen2, a toy model)."
        )
    check_layer_norms(lm)
    for block in blocks:
        if mlp_of(_layer(block)) is None:
            raise UnsupportedModelError(
                f"{lm.display_name}: a layer without an mlp (or fc2): the decomposition covers "
                "pre-norm decoders whose layers hold one."
            )
    return blocks


def _layer(block: OurBlock) -> nn.Module:
    """The whole layer around ``block``'s attention block."""
    outer, name = block.layer_place
    return getattr(outer, name)


#: the recorder's points ``residual_pass`` reads of each layer (``L{l}.<point>``); an
#: ``attn_normed`` / ``mlp_normed`` is there only where the layer norms a block's output
_POINTS = (
    "resid_pre",
    "v",
    "pattern",
    "z",
    "attn_out",
    *NORMED_POINTS.values(),
    "mlp_out",
    "resid_post",
)
_LOGIT_SOFTCAP = "final_logit_softcapping"


def residual_pass(
    text: str | Generation,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    max_tokens: int | None = None,
    all_logits: bool = True,
    with_head: bool = True,
) -> ResidualPass:
    """``text`` through a pre-norm decoder (our module in every attention block), its residual
    stream recorded in parts. A ``Generation`` (``generate_ids``) runs over exactly the ids the
    model chose, not its text tokenized again. ``all_logits=False``: the unembedding of the
    last position only (what reads only the stream saves the vocabulary-wide product).
    ``with_head=False``: the base model alone, no logits; a pre-norm encoder (ModernBERT) too.

    Raises:
        UnsupportedModelError: a post-norm encoder (BERT), a model without a next-token head,
            or a layout outside GPT-2 and the Llama family.
        InputError: the text is empty or too long.
    """
    if not isinstance(text, Generation):
        text = check_text(text)
    lm = resolve_model(model)
    with lm.lock, torch.inference_mode():
        blocks = _checked_decoder(lm, with_head)
        if isinstance(text, Generation):
            encoded = generation_encoded(lm, text, max_tokens)
        else:
            encoded = encode(lm, text, None, max_tokens)
        names = [f"L{b.layer}.{p}" for b in blocks for p in _POINTS]
        kept = recorded(
            lm,
            blocks,
            encoded.inputs,
            [*names, "logits"] if with_head else names,
            on_device=True,
            last_logits=not all_logits,
        )
        return _assembled(lm, blocks, encoded, kept, with_head)


def _assembled(
    lm: LoadedModel,
    blocks: list[OurBlock],
    encoded: Encoded,
    kept: Recording,
    with_head: bool = True,
) -> ResidualPass:
    """The ``ResidualPass`` of the recorder's points: what the residual receives from a block is
    the output of the norm after it where the layer has one (``attn_normed``, ``mlp_normed``),
    that norm after the attention frozen at the block's own output."""
    values = kept.values

    def per_layer(point: str) -> tuple[torch.Tensor, ...]:
        return tuple(values[f"L{b.layer}.{point}"].float() for b in blocks)

    def received(point: str) -> tuple[torch.Tensor, ...]:
        normed = NORMED_POINTS[point]
        return tuple(
            values.get(f"L{b.layer}.{normed}", values[f"L{b.layer}.{point}"]).float()
            for b in blocks
        )

    w_o, b_o, heads_v, b_v = [], [], [], []
    for block in blocks:
        ours = block.ours
        weight = ours.out.weight.float()  # (D, H Dh)
        w_o.append(weight.view(weight.shape[0], ours.num_heads, ours.d_head).permute(1, 2, 0))
        b_o.append(None if ours.out.bias is None else ours.out.bias.float())
        v = values[f"L{block.layer}.v"].float()  # (G, T, Dh)
        heads_v.append(v.repeat_interleave(ours.groups, dim=0))  # (H, T, Dh)
        bias = ours.projections()[1][2]
        per_head = None if bias is None else bias.float().view(ours.num_kv_heads, ours.d_head)
        b_v.append(None if per_head is None else per_head.repeat_interleave(ours.groups, dim=0))
    attn_norm = tuple(
        None
        if (norm := kept.norms.get(f"L{b.layer}.{NORMED_POINTS['attn_out']}")) is None
        else frozen_norm(norm, values[f"L{b.layer}.attn_out"])
        for b in blocks
    )
    cap = getattr(lm.config, _LOGIT_SOFTCAP, None)
    run = ResidualPass(
        tokens=tuple(encoded.tokens.strings),
        ids=tuple(encoded.inputs["input_ids"][0].tolist()),
        resid_pre=per_layer("resid_pre"),
        probabilities=per_layer("pattern"),
        values=tuple(heads_v),
        b_v=tuple(b_v),
        context=per_layer("z"),
        w_o=tuple(w_o),
        b_o=tuple(b_o),
        attn_out=received("attn_out"),
        mlp_out=received("mlp_out"),  # OPT's flattened [T, D] MLP output: one sequence
        resid_post=per_layer("resid_post"),
        logits=values["logits"].float() if with_head else torch.zeros(0, 0),
        final_norm=final_norm_of(lm),
        unembed=lm.head_model.get_output_embeddings() if with_head else None,
        attn_norm=attn_norm if any(n is not None for n in attn_norm) else (),
        logit_softcap=None if cap is None else float(cap),
        parallel=tuple(
            b.family.parallel is not None and b.family.parallel(b.original) for b in blocks
        ),
    )
    check_sums(lm.display_name, run.resid_pre, run.attn_out, run.mlp_out, run.resid_post)
    return run

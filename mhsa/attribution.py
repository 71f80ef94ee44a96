"""Direct logit attribution and the logit lens for pre-norm decoders (GPT-2, the Llama family,
Qwen3, Gemma 1-3, OLMo 2, Phi-3, the toy models).

A pre-norm decoder's last residual stream is a sum: the embeddings, each head's output (its
context through its slice of ``W_O``), each attention block's output bias, each MLP's output.
The final norm is linear once its scale is frozen at the value it takes on the whole residual
(TransformerLens's ``apply_ln_to_stack``): LayerNorm centres each part and divides it by the
whole residual's standard deviation (with the model's eps) before its weight; RMSNorm divides by
the whole residual's root mean square, without centring. Each part, through the frozen norm and
the unembedding, projected on ``W_U[answer] - W_U[wrong]``, is its direct contribution to the
logit difference (TransformerLens's ``logit_attrs``); the norm's bias and the unembedding's bias
are parts of their own. The parts sum to the model's logit difference.

The logit lens (TransformerLens's ``accumulated_resid`` with ``apply_ln=True``, then the
unembedding) reads the residual after the embeddings and after each layer through the final
norm (its own statistics) and the unembedding.

Parallel layers (GPT-NeoX with ``use_parallel_residual``, GPT-J, Phi, Falcon) feed attention and
MLP the same input and add both outputs to it: the residual is the same sum of parts, only the
MLP reads the layer's input rather than the residual after attention (``ResidualPass.parallel``).
The MLP's output is the layer's ``mlp`` (OPT: its ``fc2``). Every recorded layer's output is
checked to equal its input plus its attention and MLP outputs: a layer doing anything else is
refused, never decomposed wrongly.

Post-norm models (BERT, DistilBERT, the embedded MiniLM, OPT with ``do_layer_norm_before=False``)
put a LayerNorm after every residual sum, inside each layer: the last residual is no sum of the
components' outputs, so neither applies (``UnsupportedModelError``).

Everything runs through our module (``mhsa.swap``), whose observation points give each head's
attention, values and context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from mhsa.encoding import Encoded, check_text, encode
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.frozen_norm import FrozenNorm, follow_norms_after, frozen_final_norm, frozen_norm
from mhsa.generation import Generation, forward_inputs, generation_encoded
from mhsa.heads import head_label
from mhsa.layer_parts import check_layer_norms, check_sums, final_norm_of, mlp_of, post_norm_error
from mhsa.metrics import answer_direction, answer_tokens, logit_difference
from mhsa.models import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.swap import OurBlock, OurPass, our_blocks, run_with_our_blocks

__all__ = [
    "FrozenNorm",
    "HeadAttribution",
    "LogitLens",
    "ResidualPass",
    "answer_tokens",
    "frozen_final_norm",
    "head_attribution",
    "logit_lens",
    "predicted_words",
    "residual_pass",
    "token_strings",
]


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
        logits: the model's logits ``[T, V]``.
        final_norm: the model's final norm.
        unembed: the unembedding (``lm_head``).
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
    unembed: nn.Module
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
        logits = self.unembed(self.final_norm(vectors))
        cap = self.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap


def _checked_decoder(lm: LoadedModel) -> list[OurBlock]:
    """Our blocks of ``lm``, a pre-norm decoder with a next-token head.

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
    if not blocks[0].causal:
        raise post_norm_error(lm)
    if lm.lm_head != "causal" or lm.head_model is None:
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


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _recording(
    blocks: list[OurBlock],
    record: dict[tuple[str, int], torch.Tensor],
    after: dict[int, list[tuple[nn.Module, Any, torch.Tensor]]],
) -> list[Any]:
    """Hooks that put each layer's input, output and MLP output into ``record``, and what
    each other module of the layer with a weight (its norms) took and gave into ``after``
    (``frozen_norm.follow_norms_after`` finds among them a norm after the attention or the
    MLP); handles."""

    def seen(layer: int, module: nn.Module) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple, out: Any) -> None:
            after.setdefault(layer, []).append((module, args[0] if args else None, _first(out)))

        return hook

    def keep(name: str, layer: int, pre: bool) -> Callable[..., None]:
        if pre:
            return lambda _m, args, kwargs: record.__setitem__((name, layer), _hidden(args, kwargs))

        def hook(_m: nn.Module, _args: Any, out: Any) -> None:
            # a copy: Falcon adds the attention output into its MLP's output in place; the
            # tensor itself too, for finding the norm that takes it (Gemma 2/3, OLMo 2)
            record[(name, layer)] = _first(out).clone()
            record[(f"{name} itself", layer)] = _first(out)

        return hook

    handles = []
    for block in blocks:
        layer = _layer(block)
        handles.append(
            layer.register_forward_pre_hook(keep("pre", block.layer, True), with_kwargs=True)
        )
        handles.append(layer.register_forward_hook(keep("post", block.layer, False)))
        mlp = mlp_of(layer)
        assert mlp is not None  # _checked_decoder saw it
        handles.append(mlp.register_forward_hook(keep("mlp", block.layer, False)))
        for child in layer.children():
            if child is not block.original and child is not mlp and hasattr(child, "weight"):
                handles.append(child.register_forward_hook(seen(block.layer, child)))
    return handles


_OBSERVED = {"probabilities", "per-head V", "per-head context", "output"}
_LOGIT_SOFTCAP = "final_logit_softcapping"


def _observer(record: dict[tuple[str, int], torch.Tensor], layer: int) -> Callable[..., None]:
    def observe(name: str, tensor: torch.Tensor) -> None:
        if name in _OBSERVED:
            record[(name, layer)] = tensor

    return observe


def residual_pass(
    text: str | Generation,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    max_tokens: int | None = None,
) -> ResidualPass:
    """``text`` through a pre-norm decoder (our module in every attention block), its residual
    stream recorded in parts. A ``Generation`` (``generate_ids``) runs over exactly the ids the
    model chose, not its text tokenized again.

    Raises:
        UnsupportedModelError: a post-norm encoder (BERT), a model without a next-token head,
            or a layout outside GPT-2 and the Llama family.
        InputError: the text is empty or too long.
    """
    if not isinstance(text, Generation):
        text = check_text(text)
    lm = resolve_model(model)
    record: dict[tuple[str, int], torch.Tensor] = {}
    after: dict[int, list[tuple[nn.Module, Any, torch.Tensor]]] = {}
    with lm.lock, torch.inference_mode():
        blocks = _checked_decoder(lm)
        if isinstance(text, Generation):
            encoded = generation_encoded(lm, text, max_tokens)
        else:
            encoded = encode(lm, text, None, max_tokens)
        inputs = forward_inputs(lm, encoded.inputs_on(lm.device))
        observers = {b.layer: _observer(record, b.layer) for b in blocks}
        handles = _recording(blocks, record, after)
        try:
            out = run_with_our_blocks(
                lm, blocks, OurPass(observers=observers), inputs, with_head=True
            )
        finally:
            for handle in handles:
                handle.remove()
        follow_norms_after(blocks, record, after)
        return _assembled(lm, blocks, encoded, record, out.logits[0])


def _assembled(
    lm: LoadedModel,
    blocks: list[OurBlock],
    encoded: Encoded,
    record: dict[tuple[str, int], torch.Tensor],
    logits: torch.Tensor,
) -> ResidualPass:
    def per_layer(name: str) -> tuple[torch.Tensor, ...]:
        return tuple(record[(name, b.layer)][0].float() for b in blocks)

    w_o, b_o, values, b_v = [], [], [], []
    for block in blocks:
        ours = block.ours
        weight = ours.out.weight.float()  # (D, H Dh)
        w_o.append(weight.view(weight.shape[0], ours.num_heads, ours.d_head).permute(1, 2, 0))
        b_o.append(None if ours.out.bias is None else ours.out.bias.float())
        v = record[("per-head V", block.layer)][0].float()  # (G, T, Dh)
        values.append(v.repeat_interleave(ours.groups, dim=0))  # (H, T, Dh)
        bias = ours.projections()[1][2]
        per_head = None if bias is None else bias.float().view(ours.num_kv_heads, ours.d_head)
        b_v.append(None if per_head is None else per_head.repeat_interleave(ours.groups, dim=0))
    attn_norm = tuple(
        None
        if ("norm after attention", b.layer) not in record
        else frozen_norm(
            record[("norm after attention", b.layer)], record[("raw output", b.layer)][0]
        )
        for b in blocks
    )
    cap = getattr(lm.config, _LOGIT_SOFTCAP, None)
    run = ResidualPass(
        tokens=tuple(encoded.tokens.strings),
        ids=tuple(encoded.inputs["input_ids"][0].tolist()),
        resid_pre=per_layer("pre"),
        probabilities=per_layer("probabilities"),
        values=tuple(values),
        b_v=tuple(b_v),
        context=per_layer("per-head context"),
        w_o=tuple(w_o),
        b_o=tuple(b_o),
        attn_out=per_layer("output"),
        # OPT runs its MLP on the tokens flattened to [B T, D]
        mlp_out=tuple(
            record[("mlp", b.layer)].reshape(record[("pre", b.layer)].shape)[0].float()
            for b in blocks
        ),
        resid_post=per_layer("post"),
        logits=logits.float(),
        final_norm=final_norm_of(lm),
        unembed=lm.head_model.get_output_embeddings(),
        attn_norm=attn_norm if any(n is not None for n in attn_norm) else (),
        logit_softcap=None if cap is None else float(cap),
        parallel=tuple(
            b.family.parallel is not None and b.family.parallel(b.original) for b in blocks
        ),
    )
    check_sums(lm.display_name, run.resid_pre, run.attn_out, run.mlp_out, run.resid_post)
    return run


@dataclass(frozen=True)
class HeadAttribution:
    """Each component's direct contribution to ``logit(answer) - logit(wrong)`` at the last
    position (direct logit attribution, TransformerLens's ``logit_attrs``).

    Attributes:
        text: the text.
        model: the model's name.
        tokens: the text's tokens.
        answer: the answer as given; ``answer_id`` its token.
        wrong: the wrong answer as given; ``wrong_id`` its token.
        answer_id: see ``answer``.
        wrong_id: see ``wrong``.
        norm: ``"LayerNorm"`` or ``"RMSNorm"`` (the final norm).
        embed: the embeddings' contribution (token plus position embeddings).
        heads: ``[L, H]``, each head's contribution.
        attn_bias: ``[L]``, each attention block's output bias (0 where there is none).
        mlp: ``[L]``, each MLP's contribution.
        final_norm_bias: the final LayerNorm's bias (0 for RMSNorm).
        unembed_bias: the unembedding's bias (0 without one).
        logit_diff: the model's own ``logit(answer) - logit(wrong)``; the components sum to it.
            With a final soft-cap of the logits (Gemma 2) the difference before the cap:
            attribution is linear only there.
        logit_softcap: the model's final soft-cap ``c`` of ``c * tanh(logits / c)``, or None.
    """

    text: str
    model: str
    tokens: tuple[str, ...]
    answer: str
    wrong: str
    answer_id: int
    wrong_id: int
    norm: str
    embed: float
    heads: np.ndarray
    attn_bias: np.ndarray
    mlp: np.ndarray
    final_norm_bias: float
    unembed_bias: float
    logit_diff: float
    logit_softcap: float | None = None

    @property
    def total(self) -> float:
        """The sum of every component's contribution (equals ``logit_diff`` up to rounding)."""
        return float(
            self.embed
            + self.heads.sum(dtype=np.float64)
            + self.attn_bias.sum(dtype=np.float64)
            + self.mlp.sum(dtype=np.float64)
            + self.final_norm_bias
            + self.unembed_bias
        )

    def frame(self) -> pd.DataFrame:
        """One row per component: ``component``, ``kind`` (embed, head, attn bias, mlp,
        final norm bias, unembed bias), ``layer``, ``head`` (-1 where none),
        ``contribution``."""
        rows: list[tuple[str, str, int, int, float]] = [("embed", "embed", -1, -1, self.embed)]
        layers, heads = self.heads.shape
        for layer in range(layers):
            for head in range(heads):
                rows.append((head_label(layer, head), "head", layer, head, self.heads[layer, head]))
            rows.append((f"L{layer} attn bias", "attn bias", layer, -1, self.attn_bias[layer]))
            rows.append((f"L{layer} MLP", "mlp", layer, -1, self.mlp[layer]))
        rows.append(("final norm bias", "final norm bias", -1, -1, self.final_norm_bias))
        rows.append(("unembed bias", "unembed bias", -1, -1, self.unembed_bias))
        frame = pd.DataFrame(rows, columns=["component", "kind", "layer", "head", "contribution"])
        frame["contribution"] = frame["contribution"].astype(float)
        return frame


def head_attribution(
    text: str | Generation,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str,
    wrong: str,
    max_tokens: int | None = None,
) -> HeadAttribution:
    """Direct logit attribution of ``logit(answer) - logit(wrong)`` at the text's last token.

    Each component (embeddings, every head, every attention output bias, every MLP, the final
    norm's bias, the unembedding's bias) goes through the final norm with its scale frozen at
    the whole residual (TransformerLens's ``apply_ln_to_stack``; RMSNorm without centring) and
    the unembedding, projected on ``W_U[answer] - W_U[wrong]`` (``logit_attrs``).

    Args:
        text: the text, or a ``Generation`` (over the ids the model chose); the prediction
            after its last token is attributed.
        model: a causal pre-norm decoder (GPT-2, the Llama family, ``toy:<task>``).
        answer: a word that is one token after a space (``answer_tokens``).
        wrong: the competing word, likewise.
        max_tokens: keep the first this many tokens.

    Raises:
        UnsupportedModelError: post-norm encoders (BERT, MiniLM) and models without a
            next-token head.
        InputError: the text, or the answer words (not one token each).
    """
    lm = resolve_model(model)
    answer_id, wrong_id = answer_tokens(lm, answer, wrong)
    run = residual_pass(text, model=lm, max_tokens=max_tokens)
    with torch.inference_mode():
        shown = text.text if isinstance(text, Generation) else text
        return _attribution(lm, run, shown, answer, wrong, answer_id, wrong_id)


def _attribution(
    lm: LoadedModel,
    run: ResidualPass,
    text: str,
    answer: str,
    wrong: str,
    answer_id: int,
    wrong_id: int,
) -> HeadAttribution:
    last = len(run.tokens) - 1
    frozen = frozen_final_norm(run.final_norm, run.resid_post[-1][last])
    direction = answer_direction(run.unembed.weight, answer_id, wrong_id)  # (D,)

    def attributed(parts: torch.Tensor) -> np.ndarray:
        return (frozen(parts) @ direction).double().cpu().numpy()

    heads = np.stack([attributed(run.head_outputs(layer, last)) for layer in range(run.layers)])
    biases = torch.stack([run.attn_bias(layer, last) for layer in range(run.layers)])
    mlps = torch.stack([m[last] for m in run.mlp_out])
    u_bias = getattr(run.unembed, "bias", None)
    logits = run.logits  # (T, V)
    if run.logit_softcap is not None:  # attribution is linear before the cap only
        final = run.final_norm(run.resid_post[-1][last:].to(run.unembed.weight.dtype))
        logits = run.unembed(final).float()  # (1, V): the last position, before the cap
    return HeadAttribution(
        text=text,
        model=lm.display_name,
        tokens=run.tokens,
        answer=answer,
        wrong=wrong,
        answer_id=answer_id,
        wrong_id=wrong_id,
        norm=frozen.kind,
        embed=float(attributed(run.resid_pre[0][last])),
        heads=heads,
        attn_bias=attributed(biases),
        mlp=attributed(mlps),
        final_norm_bias=0.0 if frozen.bias is None else float(frozen.bias @ direction),
        unembed_bias=0.0 if u_bias is None else float(u_bias[answer_id] - u_bias[wrong_id]),
        logit_diff=float(logit_difference(logits, answer_id, wrong_id, position=-1)),
        logit_softcap=run.logit_softcap,
    )


@dataclass(frozen=True)
class LogitLens:
    """The residual after the embeddings and after each layer, read through the final norm and
    the unembedding (the logit lens; TransformerLens's ``accumulated_resid(apply_ln=True)``).

    Attributes:
        tokens: the text's tokens (T).
        stages: ``"embeddings"``, then ``"L0"`` ... (the residual after that layer); S of them.
        top_tokens: ``[S, T, k]`` the top tokens (strings) at each stage and position.
        top_logits: ``[S, T, k]`` their logits.
        top_probs: ``[S, T, k]`` their probabilities (softmax over the vocabulary).
        answer: the answer word, or None.
        wrong: the wrong answer word, or None.
        logit_diff: ``[S, T]`` ``logit(answer) - logit(wrong)`` at each stage and position, or
            None without answer and wrong.
    """

    tokens: tuple[str, ...]
    stages: tuple[str, ...]
    top_tokens: np.ndarray
    top_logits: np.ndarray
    top_probs: np.ndarray
    answer: str | None = None
    wrong: str | None = None
    logit_diff: np.ndarray | None = None


def predicted_words(lens: LogitLens, count: int = 2) -> tuple[str, ...]:
    """The model's top predictions after the last token (the lens's last stage), as words:
    the tokenizers' marks of a word after a space (GPT-2's ``Ġ``, SentencePiece's ``▁``)
    removed, empty ones (whitespace, control tokens) left out. Candidates for ``answer`` and
    ``wrong``."""
    words = (str(t).replace("Ġ", " ").replace("▁", " ").strip() for t in lens.top_tokens[-1, -1])
    return tuple(w for w in words if w)[:count]


def token_strings(lm: LoadedModel, ids: torch.Tensor) -> np.ndarray:
    """The tokenizer's strings of ``ids`` (any shape), as an object array of that shape."""
    flat = ids.reshape(-1).tolist()
    with lm.lock:
        strings = lm.tokenizer.convert_ids_to_tokens(flat)
    return np.array([str(s) for s in strings], dtype=object).reshape(tuple(ids.shape))


def logit_lens(
    text: str | Generation,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    top_k: int = 5,
    max_tokens: int | None = None,
) -> LogitLens:
    """The logit lens: each layer's residual at each position through the final norm (its own
    statistics) and the unembedding; the last stage is the model's own logits.

    Args:
        text: the text, or a ``Generation`` (over the ids the model chose).
        model: a causal pre-norm decoder.
        answer: with ``wrong``: also the logit difference at each stage and position.
        wrong: see ``answer``.
        top_k: top tokens kept per stage and position.
        max_tokens: keep the first this many tokens.

    Raises:
        UnsupportedModelError: post-norm encoders and models without a next-token head.
        InputError: the text, ``top_k`` below 1, or answer words that are not one token each.
    """
    lm = resolve_model(model)
    if top_k < 1:
        raise InputError(f"top_k must be at least 1, got {top_k}.")
    pair = None if answer is None and wrong is None else answer_tokens(lm, answer, wrong)
    run = residual_pass(text, model=lm, max_tokens=max_tokens)
    ids, values, probs, diffs = [], [], [], []
    with torch.inference_mode():
        # one stage at a time: the logits of every stage at once are stages x tokens x vocabulary
        for residual in (run.resid_pre[0], *run.resid_post):  # (T, D)
            logits = run.unembed_vectors(residual.to(run.unembed.weight.dtype)).float()  # (T, V)
            top = logits.topk(min(top_k, logits.shape[-1]), dim=-1)
            ids.append(top.indices)
            values.append(top.values.cpu())
            probs.append(logits.softmax(-1).gather(-1, top.indices).cpu())
            if pair is not None:
                diffs.append(logit_difference(logits, *pair, position=None).cpu())
    return LogitLens(
        tokens=run.tokens,
        stages=("embeddings", *(f"L{i}" for i in range(run.layers))),
        top_tokens=token_strings(lm, torch.stack(ids)),
        top_logits=torch.stack(values).numpy(),
        top_probs=torch.stack(probs).numpy(),
        answer=answer if pair else None,
        wrong=wrong if pair else None,
        logit_diff=torch.stack(diffs).numpy() if diffs else None,
    )

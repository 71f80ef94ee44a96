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

Everything runs through our module (``mhsa.engine.runs.swap``), whose observation points give each
head's
attention, values and context.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from mhsa.causal.metrics import answer_direction, answer_tokens, logit_difference
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.runs.generation import Generation
from mhsa.engine.stream.frozen_norm import FrozenNorm, frozen_final_norm
from mhsa.engine.stream.residual import ResidualPass, residual_pass
from mhsa.errors import InputError
from mhsa.heads import head_label

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

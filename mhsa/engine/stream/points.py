"""The stream recorder's point names (``mhsa.engine.stream.record``) and their validation.

The names follow TransformerLens's hook points (``blocks.{l}.hook_resid_pre``,
``blocks.{l}.attn.hook_pattern``, ``hook_z``, ``hook_attn_out``... in Nanda & Bloom 2022,
https://github.com/TransformerLensOrg/TransformerLens), shortened to ``L{l}.<point>``: one name
for the same tensor in every family, whatever the model's own modules are called. An
encoder-decoder's points are ``E{l}.<point>`` (its encoder's layers), ``D{l}.<point>`` (its
decoder's layers, their self-attention) and ``C{l}.<point>`` (decoder layer l's
cross-attention: ``q``, ``k``, ``v``, ``pattern`` ``[H, T_dec, T_enc]``, ``z``, ``attn_out``;
keys and values from the encoder's output).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

from mhsa.errors import InputError

__all__ = [
    "LAYER_POINTS",
    "MODEL_POINTS",
    "REPLACEABLE",
    "TRANSFORMER_LENS",
    "layer_of",
    "point_of",
    "selected",
]

#: each layer's points, in the order a sequential layer's forward pass reaches them, with the
#: tensor each is in the model's own terms (shapes with the batch dimension dropped; T tokens,
#: D = d_model, H query heads, G key/value heads, d_head a head's width)
LAYER_POINTS: dict[str, str] = {
    "resid_pre": "[T, D]: the layer's input, the residual stream entering it (layer 0: the "
    "embeddings, after any scaling and embedding projection the model applies)",
    "q": "[H, T, d_head]: each head's queries as the scores read them: X W_Q + b_Q split into "
    "heads, after the q norm (Qwen3, Gemma 3, OLMo 2) and the rotary positions (Llama, GPT-NeoX, "
    "GPT-J, Phi, Falcon, Gemma, ModernBERT...) where the model has them",
    "k": "[G, T, d_head]: each key/value head's keys as the scores read them: X W_K + b_K split "
    "into heads, after the k norm and the rotary positions where the model has them",
    "v": "[G, T, d_head]: each key/value head's values X W_V + b_V (bias included)",
    "pattern": "[H, T, T]: each head's attention probabilities A_h = softmax(scores + mask) over "
    "the keys (rows: queries, columns: keys)",
    "z": "[H, T, d_head]: each head's context A_h V_g(h), before the output projection W_O",
    "attn_out": "[T, D]: the attention block's output W_O z + b_O, before any dropout, residual "
    "sum or norm after it (BERT's and ALBERT's LayerNorm, Gemma 2/3's and OLMo 2's "
    "post-attention norm)",
    "mlp_in": "[T, D]: what the layer's MLP module (``mlp``) receives: the normed residual in a "
    "pre-norm layer, the layer's input normed in a parallel one; models whose MLP module takes "
    "another width (OPT's fc2) have none",
    "mlp_out": "[T, D]: what the layer's MLP module (``mlp``; OPT's ``fc2``) returns, before any "
    "residual sum or norm after it; encoders whose feed-forward block has no such module (BERT, "
    "DistilBERT, ALBERT) have none",
    "resid_post": "[T, D]: the layer's output, the residual stream leaving it (post-norm "
    "encoders: after the layer's last LayerNorm)",
}

#: the points of the model as a whole
MODEL_POINTS: dict[str, str] = {
    "final_norm_in": "[T, D]: what the model's final norm receives (models with one: decoders "
    "and pre-norm encoders): the last layer's output",
    "logits": "[T, V]: the checkpoint's head's output over the vocabulary (a causal or masked "
    "LM head, after any final soft-cap); models loaded without a head have none",
}

#: each point's nearest TransformerLens hook point (``{l}``: the layer), for readers who know
#: those names. Ours are per sequence (no batch axis) and heads first (``[H, T, d_head]``, where
#: TransformerLens has ``[batch, pos, head, d_head]``); our q and k are after the rotary
#: positions (its ``hook_rot_q`` / ``hook_rot_k``) and the q/k norms, where the model has them.
TRANSFORMER_LENS: dict[str, str] = {
    "resid_pre": "blocks.{l}.hook_resid_pre",
    "q": "blocks.{l}.attn.hook_rot_q (blocks.{l}.attn.hook_q without rotary positions)",
    "k": "blocks.{l}.attn.hook_rot_k (blocks.{l}.attn.hook_k without rotary positions)",
    "v": "blocks.{l}.attn.hook_v",
    "pattern": "blocks.{l}.attn.hook_pattern",
    "z": "blocks.{l}.attn.hook_z",
    "attn_out": "blocks.{l}.hook_attn_out",
    "mlp_in": "blocks.{l}.hook_mlp_in",
    "mlp_out": "blocks.{l}.hook_mlp_out",
    "resid_post": "blocks.{l}.hook_resid_post",
    "final_norm_in": "the input of ln_final (the last layer's blocks.{l}.hook_resid_post)",
    "logits": "the logits run_with_cache returns",
}

#: the points a replacement may change (the logits are the pass's end: nothing reads them)
REPLACEABLE = frozenset(LAYER_POINTS) | {"final_norm_in"}


def point_of(name: str) -> str:
    """The point of a full name: ``"L3.pattern"`` -> ``"pattern"``, ``"logits"`` as it is."""
    return name.rpartition(".")[2]


def layer_of(name: str) -> int | None:
    """The layer of a full name (``"L3.pattern"`` -> 3), None for a model point."""
    prefix, dot, _ = name.partition(".")
    return int(prefix[1:]) if dot else None


def _listing(valid: Sequence[str]) -> str:
    """The valid names for a message: each kind of layer's first layer in full (``L``, or an
    encoder-decoder's ``E``, ``D``, ``C``), the others by their range."""
    prefixes = list(dict.fromkeys(n.partition(".")[0] for n in valid if "." in n))
    parts = []
    for letter in dict.fromkeys(p[0] for p in prefixes):
        of_kind = [p for p in prefixes if p[0] == letter]
        names = ", ".join(n for n in valid if n.partition(".")[0] == of_kind[0])
        more = f" (and the same points of {of_kind[1]}..{of_kind[-1]})" if len(of_kind) > 1 else ""
        parts.append(names + more)
    parts += [n for n in valid if "." not in n]
    return "; ".join(parts) + "; patterns such as '*.z' or 'L1.*' match several"


def selected(asked: Iterable[str] | str | None, valid: Sequence[str], what: str) -> list[str]:
    """The names of ``valid`` that ``asked`` names (each an exact name or an ``fnmatch``
    pattern), in ``valid``'s order; every name when ``asked`` is None.

    Raises:
        InputError: a name or pattern that matches no valid name (the message lists them), or
            ``asked`` is a bare string (one name must come as a list: a string is a sequence of
            letters).
    """
    if asked is None:
        return list(valid)
    if isinstance(asked, str):
        raise InputError(f"{what} must be a list of point names, e.g. [{asked!r}], not a string.")
    chosen: set[str] = set()
    for pattern in asked:
        if not isinstance(pattern, str):
            raise InputError(f"{what}: {pattern!r} is not a point name.")
        hits = [n for n in valid if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise InputError(
                f"{what}: no point {pattern!r} in this model; it has {_listing(valid)}."
            )
        chosen.update(hits)
    return [n for n in valid if n in chosen]

"""Head composition (Elhage et al. 2021, as TransformerLens computes it): how strongly a head's
output feeds a later head's queries, keys or values, from the weights alone.

The scores follow ``HookedTransformer.all_composition_scores`` and ``composition_scores`` in
``transformer_lens/utilities/matrix.py`` (``FactoredMatrix`` in ``transformer_lens/
FactoredMatrix.py``). ``mhsa.analysis.roles`` re-exports these names (they lived there first).
"""

from __future__ import annotations

import pandas as pd
import torch

from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.runs.swap import our_blocks
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.heads import head_label, parse_head_label

__all__ = ["COMPOSITION_KINDS", "head_composition", "strongest_inputs"]

#: the kinds of composition: into a later head's queries, keys or values
COMPOSITION_KINDS = ("Q", "K", "V")


def _r_factor(x: torch.Tensor) -> torch.Tensor:
    """A ``[..., Dh, Dh]`` factor F of ``x`` ``[..., D, Dh]`` with ``||F M||_F = ||x M||_F`` for
    every M: ``F = S^(1/2) U^T`` from ``x^T x = U S U^T`` (as ``R`` of ``x = Q R``, without the
    orthonormal Q). A ``[D, D]`` product of low rank is so measured on ``[Dh, Dh]`` factors,
    as TransformerLens's ``FactoredMatrix.collapse_l`` / ``collapse_r`` measure it after an
    SVD."""
    s, u = torch.linalg.eigh(x.transpose(-2, -1) @ x)  # (..., Dh), (..., Dh, Dh)
    return s.clamp(min=0).sqrt()[..., :, None] * u.transpose(-2, -1)


def _head_factors(lm: LoadedModel, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per layer and head, the OV circuit's left factor ``[L, H, Dh, D]`` and the reading
    circuit's right factor ``[L, H, D, Dh]`` of ``kind``, in TransformerLens's convention
    (row vectors: ``x @ W_Q``), in float64, with the orthonormal factors dropped."""
    if lm.is_encoder_decoder:
        # its encoder and decoder write to two residual streams: "a later layer" is not defined
        raise UnsupportedModelError(
            f"Head composition reads one residual stream; {lm.display_name} is an "
            "encoder-decoder model (two streams). Choose an encoder or a decoder model."
        )
    with lm.lock:
        modules = [block.ours for block in our_blocks(lm)]
    lefts, rights = [], []
    for ours in modules:
        # nn.Linear layout [out, in], on the CPU in float64 (a few matrices per layer)
        w_q, w_k, w_v, w_o = (w.to("cpu", torch.float64) for w in ours.projections()[0])
        h, g, dh = ours.num_heads, ours.num_kv_heads, ours.d_head
        per_kv = ours.groups
        # TransformerLens's W_Q [H, D, Dh], W_O [H, Dh, D]; a key/value head serves per_kv heads
        q = w_q.view(h, dh, -1).transpose(1, 2)  # (H, D, Dh)
        k = w_k.view(g, dh, -1).transpose(1, 2).repeat_interleave(per_kv, 0)
        v = w_v.view(g, dh, -1).transpose(1, 2).repeat_interleave(per_kv, 0)
        o = w_o.view(-1, h, dh).permute(1, 2, 0)  # (H, Dh, D)
        lefts.append(_r_factor(v) @ o)  # OV = W_V W_O -> (H, Dh, D)
        # Q: QK = W_Q W_K^T; K: QK^T = W_K W_Q^T; V: OV = W_V W_O (all [D, D], D = d_model)
        reader = {"Q": (q, k), "K": (k, q), "V": (v, o.transpose(1, 2))}[kind]
        rights.append(reader[0] @ _r_factor(reader[1]).transpose(1, 2))  # (H, D, Dh)
    return torch.stack(lefts), torch.stack(rights)


def head_composition(model: str | LoadedModel = DEFAULT_MODEL, kind: str = "K") -> pd.DataFrame:
    """Q-, K- or V-composition scores between every head and every head of a later layer, from
    the weights alone (Elhage et al. 2021), as TransformerLens's
    ``HookedTransformer.all_composition_scores(mode)`` computes them: with ``OV = W_V W_O`` and
    ``QK = W_Q W_K^T`` (``[d_model, d_model]``, row vectors),
    ``||OV_A @ M_B||_F / (||OV_A||_F ||M_B||_F)`` with ``M_B = QK_B`` (Q), ``QK_B^T`` (K) or
    ``OV_B`` (V): how much of what head A writes head B reads into its queries, keys or values.

    Weights are read from our module (``mhsa.engine.runs.swap.our_blocks``: the model's attention
    blocks
    loaded into ``MultiHeadSelfAttention``); biases are left out, as in TransformerLens;
    grouped-query heads share their K and V. The scores equal TransformerLens's on a model
    loaded without weight processing (``from_pretrained_no_processing``): its default folds
    layer norms into the weights. Rotary positions are left out (as TransformerLens's ``QK``
    does), so for rotary models Q and K composition describe the weights, not one position;
    q/k norms (Qwen3, Gemma 3, OLMo 2) are left out likewise (they are not linear).

    Args:
        model: a model name or folder, or a loaded model (one that the ``mhsa`` engine runs).
        kind: ``"Q"``, ``"K"`` or ``"V"``.

    Returns:
        ``[heads, heads]``: rows the writing head A, columns the reading head B, both labelled
        ``L{l}H{h}``; 0 where B's layer is not after A's (TransformerLens's mask).

    Raises:
        InputError: an unknown kind.
        UnsupportedModelError: our module does not run this model.
    """
    if kind not in COMPOSITION_KINDS:
        raise InputError(f"Unknown composition {kind!r}: choose one of Q, K, V.")
    lm = resolve_model(model)
    left, right = _head_factors(lm, kind)  # (L, H, Dh, D), (L, H, D, Dh)
    layers, heads = left.shape[:2]
    a = left.reshape(layers * heads, *left.shape[2:])  # (N, Dh, D)
    b = right.reshape(layers * heads, *right.shape[2:])  # (N, D, Dh)
    product = torch.einsum("aik,bkj->abij", a, b)  # (N, N, Dh, Dh)
    scores = product.square().sum((-2, -1)).sqrt()
    scores = scores / a.square().sum((-2, -1)).sqrt()[:, None] / b.square().sum((-2, -1)).sqrt()
    layer = torch.arange(layers).repeat_interleave(heads)
    scores = torch.where(layer[:, None] < layer[None, :], scores, torch.zeros_like(scores))
    labels = [head_label(li, h) for li in range(layers) for h in range(heads)]
    return pd.DataFrame(
        scores.numpy(),
        index=pd.Index(labels, name="writer"),
        columns=pd.Index(labels, name="reader"),
    )


def strongest_inputs(scores: pd.DataFrame, head: str, top: int = 5) -> pd.DataFrame:
    """The heads whose output ``head`` reads most strongly: the ``top`` largest scores of its
    column in ``head_composition``'s table, largest first (heads of earlier layers only).

    Returns:
        Rows indexed by the writing head, with ``score``.

    Raises:
        InputError: ``head`` is not a head label of the table.
    """
    try:
        layer, _ = parse_head_label(head)
    except ValueError as e:
        raise InputError(str(e)) from e
    if head not in scores.columns:
        raise InputError(f"{head} is not a head of this model (it has {len(scores.columns)}).")
    writers = [label for label in scores.index if parse_head_label(label)[0] < layer]
    column = scores.loc[writers, head].sort_values(ascending=False, kind="stable")
    return column.head(max(top, 0)).to_frame("score")

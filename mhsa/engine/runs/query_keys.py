"""Each head's query and key vectors, the two sides of its scores (``attend(qk=True)``), for
BertViz's neuron view (Vig 2019, "A Multiscale Visualization of Attention in the Transformer
Model", §3.3): the weight of key j for query i is ``softmax_j(q_i . k_j * scale)`` over the keys
the mask leaves, ``scale = 1 / sqrt(d_head)`` unless the model says otherwise.

The vectors are the ones the dot product takes: after the per-head split, the q/k norms
(Qwen3, Gemma 3, OLMo 2) and the rotary positions (Llama family), as our module computes them
(its observation points "per-head Q", "normed Q", "rotated Q" and likewise for K; grouped-query
keys repeated for the query heads that read them). Both engines read them from our module
loaded with the model's weights (the ``mhsa`` engines from the very pass they ran; ours equals
the model's own attention: ``attend(engine="mhsa", verify=True)``), in one pass that stops after
the last layer asked for. Models whose scores hold more than ``q . k`` (T5's relative position
bias, Gemma 2's soft-capping) are refused: the neuron view's sum would not make their weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.result import AttentionResult
from mhsa.engine.runs.forward import run_until
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks
from mhsa.errors import UnsupportedModelError

__all__ = ["KEY_POINTS", "QUERY_POINTS", "query_key_fields", "with_query_keys"]

#: the observation points that hold the queries, in the order the pass reaches them: the
#: last one seen is what the scores take
QUERY_POINTS = ("per-head Q", "normed Q", "rotated Q")
KEY_POINTS = ("per-head K", "normed K", "rotated K")


def _check(lm: LoadedModel, blocks: list[OurBlock]) -> None:
    if lm.is_encoder_decoder or blocks[0].kind != "self":
        raise UnsupportedModelError(
            "Query and key vectors (qk=True) are kept for encoders and decoders, not yet for "
            "encoder-decoder models: leave qk off."
        )
    for block in blocks:
        if block.family.score_bias is not None or block.ours.softcap is not None:
            raise UnsupportedModelError(
                f"{lm.display_name!r} adds a position bias or soft-caps its attention scores: "
                "q . k alone does not make its weights, so the neuron view would mislead. "
                "Leave qk off."
            )
    scales = {float(b.ours.scale) for b in blocks}
    if len(scales) != 1:
        raise UnsupportedModelError(
            "The layers scale their scores differently; qk=True keeps one scale: leave qk off."
        )


def query_key_fields(
    lm: LoadedModel,
    blocks: list[OurBlock],
    inputs: dict[str, torch.Tensor],
    layers: Sequence[int],
    heads: Sequence[int],
) -> dict[str, Any]:
    """``AttentionResult``'s ``q``, ``k`` (float32 ``[len(layers), len(heads), T, d_head]``)
    and ``qk_scale`` for one text (batch 1) through ``blocks`` (our module in every block: the
    model's weights, or ``mhsa-random``'s). The caller holds ``lm.lock``.

    Raises:
        UnsupportedModelError: an encoder-decoder model, scores with a bias or a cap.
    """
    _check(lm, blocks)
    seen: dict[tuple[int, str], torch.Tensor] = {}
    chosen = [blocks[layer] for layer in layers]

    def observer(block: OurBlock) -> Any:
        def observe(name: str, tensor: torch.Tensor) -> None:
            if name in QUERY_POINTS:
                seen[(block.layer, "q")] = tensor
            elif name in KEY_POINTS:  # (B, G, S, Dh): each key head serves `groups` query heads
                seen[(block.layer, "k")] = tensor.repeat_interleave(block.ours.groups, dim=1)

        return observe

    with torch.inference_mode():
        our_pass = OurPass(need_weights=False, observers={b.layer: observer(b) for b in chosen})
        run_until(lm, blocks, our_pass, inputs, max(chosen, key=lambda b: b.layer))
    index = list(heads)

    def stacked(side: str) -> np.ndarray:
        per_layer = [seen[(b.layer, side)][0, index].float().cpu().numpy() for b in chosen]
        return np.stack(per_layer).astype(np.float32)  # (L, H, T, Dh)

    return {"q": stacked("q"), "k": stacked("k"), "qk_scale": float(blocks[0].ours.scale)}


def with_query_keys(
    lm: LoadedModel, result: AttentionResult, inputs: dict[str, torch.Tensor], seed: int | None
) -> AttentionResult:
    """``result`` with the query and key vectors of the layers and heads it holds
    (``attend(qk=True)``), from our module loaded with the model's weights (``seed``: the
    ``mhsa-random`` engine's fresh ones). The caller holds ``lm.lock``; ``inputs`` are the
    ones the result was computed from."""
    blocks = our_blocks(lm, seed)
    fields = query_key_fields(lm, blocks, inputs, result.layers, result.heads)
    return dataclasses.replace(result, **fields)

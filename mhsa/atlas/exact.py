"""The heads' true outputs, recomputed for the few corpus texts that a query needs: the atlas
keeps its texts and names its model, so a context search (exBERT's, Hoover et al. 2020) can rank
its candidates by the model's own values rather than by their 4-bit codes.

A head's output z at a token is its context before the output projection W_O (TransformerLens's
``hook_z``: ``z_h = A_h V_h``, Vaswani et al. 2017), here taken at the input of our module's
output projection, as the stream recorder's ``L{l}.z`` takes it. Texts are tokenized and cut as
the build read them (``mhsa.atlas.build``), so the tokens are the atlas's.

- ``true_outputs(lm, plan, texts, heads)``: each text's z of the chosen heads, float32.
- ``rerank(...)``: candidates from the codes, re-ranked exactly (what ``Atlas.similar`` calls).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.runs.batches import length_batches, pad_inputs
from mhsa.engine.runs.forward import run_until
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks
from mhsa.engine.stream.hooks import before, hooked

__all__ = ["CANDIDATES", "MIN_CANDIDATES", "candidate_count", "exact_top", "true_outputs"]

#: candidates from the 4-bit codes re-ranked on the true outputs, per result asked
CANDIDATES = 8
#: and at least this many (a few texts: each costs a forward pass up to the deepest head)
MIN_CANDIDATES = 96


def candidate_count(k: int) -> int:
    """How many of the codes' nearest tokens are re-ranked on their true outputs for a query
    of ``k`` results (``bench/bench_atlas.py`` measures the recall this keeps)."""
    return max(MIN_CANDIDATES, CANDIDATES * k)


def true_outputs(
    lm: LoadedModel, plan: dict[str, Any], texts: Sequence[str], heads: Sequence[int]
) -> list[np.ndarray]:
    """The output z of the atlas's heads ``heads`` (indices into its labels, layer-major as the
    build orders them) at every token of each text: ``[len(heads), n, d_head]`` float32 per
    text (n: the text's tokens as the atlas holds them; 0 for a blank text).

    Args:
        lm: the atlas's model, loaded.
        plan: the atlas's plan (its manifest's ``plan``: model, layers, heads, part, ...).
        texts: corpus texts, each as the atlas read it.
        heads: the atlas's head indices wanted.
    """
    from mhsa.atlas.build import _encode, _Stream

    part = plan.get("part", "self")
    per_layer = len(plan["heads"])
    layers = sorted({int(plan["layers"][i // per_layer]) for i in heads})
    with lm.lock:
        encoded = _encode(lm, list(texts), int(plan["max_tokens"]))
        streams = [None if e is None else _Stream.of(lm, e, part) for e in encoded]
    lengths = [0 if s is None else len(s.ids) for s in streams]
    d_head = int(plan["d_head"])
    out = [np.zeros((len(heads), n, d_head), np.float32) for n in lengths]
    usable = [i for i, n in enumerate(lengths) if n > 0]
    # atlas head index -> (layer, head within the layer)
    where = [
        (int(plan["layers"][i // per_layer]), int(plan["heads"][i % per_layer])) for i in heads
    ]
    batch_tokens = max(int(plan.get("batch_tokens", 4096)), max(lengths, default=1))
    for batch in length_batches([lengths[i] for i in usable], batch_tokens):
        rows = [usable[j] for j in batch]
        got = _run(lm, part, layers, [encoded[i].inputs for i in rows])
        for slot, (layer, h) in enumerate(where):
            z = got[layer]  # [B, H, T, Dh]
            for b, i in enumerate(rows):
                out[i][slot] = z[b, h, : lengths[i]].numpy()
    return out


def _run(
    lm: LoadedModel, part: str, layers: list[int], inputs: list[dict[str, torch.Tensor]]
) -> dict[int, torch.Tensor]:
    """One padded batch up to the deepest of ``layers``: each one's z ``[B, H, T, Dh]``."""
    seen: dict[int, torch.Tensor] = {}

    def keep(layer: int, heads: int, d_head: int) -> Callable[..., None]:
        def hook(_module: Any, args: tuple[torch.Tensor, ...]) -> None:
            merged = args[0]  # [B, T, H d_head]: the heads' contexts side by side
            b, t, _ = merged.shape
            seen[layer] = merged.detach().float().view(b, t, heads, d_head).transpose(1, 2).cpu()

        return hook

    with lm.lock, torch.inference_mode():
        blocks = our_blocks(lm)
        chosen: list[OurBlock] = [b for b in blocks if b.kind == part]
        wanted = [chosen[layer] for layer in layers]
        hooks = [before(b.ours.out, keep(b.index, b.ours.num_heads, b.ours.d_head)) for b in wanted]
        with hooked(hooks):
            run_until(lm, blocks, OurPass(need_weights=False), pad_inputs(lm, inputs), wanted[-1])
    return seen


def exact_top(
    rows: np.ndarray, tokens: np.ndarray, query: np.ndarray, k: int, exclude: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` tokens of ``tokens`` whose rows (true outputs ``[n, dims]``) are nearest
    ``query`` by cosine, ``exclude`` left out, ties by token: ``(tokens, similarities)``."""
    norms = np.maximum(np.linalg.norm(rows, axis=1), 1e-12)
    unit = query / max(float(np.linalg.norm(query)), 1e-12)
    sims = (rows @ unit) / norms
    keep = tokens != exclude
    tokens, sims = tokens[keep], sims[keep].astype(np.float32)
    order = np.lexsort((tokens, -sims))[:k]
    return tokens[order], sims[order]

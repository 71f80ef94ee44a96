"""The heads' true outputs, recomputed for the few corpus texts that a query needs: the atlas
keeps its texts and names its model, so a context search (exBERT's, Hoover et al. 2020) can rank
its candidates by the model's own values rather than by their 5-bit codes.

A head's output z at a token is its context before the output projection W_O (TransformerLens's
``hook_z``: ``z_h = A_h V_h``, Vaswani et al. 2017), here taken at the input of our module's
output projection, as the stream recorder's ``L{l}.z`` takes it. Texts are tokenized and cut as
the build read them (``mhsa.atlas.build``), so the tokens are the atlas's.

- ``true_outputs(lm, plan, texts, heads)``: each text's z of the chosen heads, float32.
- ``rerank(...)``: candidates from the codes, re-ranked on their true outputs, a few texts at a
  time, until no candidate left could enter the top k (what ``Atlas.similar`` calls).

A candidate's coded cosine differs from its true one by the codes' error: each stored number is
within half its width of the model's (``mhsa.atlas.index.ZCodes.widths``: in an atlas of format
4 to 6 its cell's width, narrow where outputs crowd; before, its span's step; format 6 codes a
head's direction and norm apart, and a norm's error moves the head's numbers together:
``cosine_bound``); take the error ``e``
of a number as uniform on that interval (standard deviation ``width / sqrt(12)``). The cosine of
the unit query q and a vector c is ``q . c / ||c||``; its first-order change under ``e`` is
``w . e / ||c||`` with ``w = q - cos * c / ||c||``, the part of q orthogonal to c (the gradient
of the cosine), so ``sigma = sqrt(sum_d w_d^2 width_d^2 / 12) / ||c||``: small for a candidate
nearly parallel to the query, where ``||w|| = sin(angle)``. The second-order change is at most
about ``||e||^2 / ||c||^2`` (the cosine's curvature), ``sum_d width_d^2 / 12 / ||c||^2`` on
average. A candidate is re-ranked while its coded cosine plus ``MARGIN * sigma`` plus
``CURVATURE`` times that second-order term reaches the k-th true cosine found so far.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from mhsa.engine.models.loading import LoadedModel
from mhsa.engine.runs.batches import length_batches, pad_inputs
from mhsa.engine.runs.swap import OurBlock, OurPass, our_blocks, run_with_our_blocks
from mhsa.engine.stream.hooks import before, hooked, stop_before

__all__ = [
    "CANDIDATES",
    "CURVATURE",
    "MARGIN",
    "MAX_TEXTS",
    "MIN_CANDIDATES",
    "ROUND_TEXTS",
    "candidate_count",
    "code_error",
    "cosine_bound",
    "exact_top",
    "rerank",
    "text_budget",
    "true_outputs",
]

#: the codes' nearest tokens a query considers, per result asked (their bounds decide which
#: texts are recomputed: many candidates cost a decode, not a model run)
CANDIDATES = 200
#: and at least this many
MIN_CANDIDATES = 2000
#: standard deviations of the codes' cosine error a candidate may be below the k-th true cosine
#: and still be re-ranked (``bench/bench_atlas.py --recall`` measures the recall it keeps)
MARGIN = 2.0
#: multiples of the codes' mean second-order cosine error added to that margin
CURVATURE = 0.25
#: texts recomputed at a time (one padded batch each round)
ROUND_TEXTS = 12
#: texts recomputed at most per query besides its own, for heads of the model's last layer:
#: the time a query may take (a forward pass up to the deepest head asked over each: shallower
#: heads get as many more texts as their pass is shorter, ``text_budget``); a query whose
#: candidates within the margin lie in more texts is ranked exactly among the nearest
#: candidates' texts
MAX_TEXTS = 36
#: padded tokens of one batch of recomputed texts (batches of like length: little padding)
BATCH_TOKENS = 1024


def candidate_count(k: int) -> int:
    """How many of the codes' nearest tokens are re-ranked on their true outputs for a query
    of ``k`` results (``bench/bench_atlas.py`` measures the recall this keeps)."""
    return max(MIN_CANDIDATES, CANDIDATES * k)


def text_budget(lm: LoadedModel, plan: dict[str, Any], heads: Sequence[int]) -> int:
    """Texts a query of ``heads`` (atlas head indices) may recompute besides its own: a
    recomputation runs the model's layers up to the deepest head's (``_run``), so the time of
    ``MAX_TEXTS`` full passes buys ``MAX_TEXTS * layers / (deepest + 1)`` texts."""
    part = plan.get("part", "self")
    layers = sum(1 for b in our_blocks(lm) if b.kind == part)
    per_layer = len(plan["heads"])
    deepest = max(int(plan["layers"][i // per_layer]) for i in heads)
    return max(MAX_TEXTS, MAX_TEXTS * layers // (deepest + 1))


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
    batch_tokens = max(BATCH_TOKENS, max(lengths, default=1))
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
        # the deepest head's z is the input of its layer's output projection: nothing after
        # it (that projection, the layer's MLP, the layers above) is run
        hooks.append(stop_before(wanted[-1].ours.out))
        with hooked(hooks, stop=True):
            run_with_our_blocks(lm, blocks, OurPass(need_weights=False), pad_inputs(lm, inputs))
    return seen


def cosine_bound(
    unit_query: np.ndarray,
    widths: np.ndarray,
    coded: np.ndarray,
    cosines: np.ndarray,
    norms: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """How far above its coded cosine each candidate's true cosine may lie (see the module's
    docstring): ``MARGIN`` standard deviations of the first-order error plus ``CURVATURE``
    times the mean second-order one. ``unit_query [dims]``; ``widths [n, dims]``, each
    candidate's numbers' widths (``ZCodes.widths``; or ``[dims]``, one for all); ``coded
    [n, dims]`` the candidates' coded vectors; ``cosines [n]`` their coded cosines.

    ``norms`` (format 6, over several heads: a head's output is its direction ``u_h`` times its norm
    ``s_h``, coded apart): ``(directions [n, Hs, Dh], norm_widths [n, Hs])``, and ``widths`` then
    the directions' widths times the norms at their largest, ``(s_h + v_h / 2) w`` (not
    ``ZCodes.widths``, which counts the norm's error in each number). A norm's error ``e_h`` moves
    the head's numbers together, ``e_h u_h``: its gradient term is ``(g_h . u_h)^2 v_h^2 / 12`` (g
    the cosine's gradient), its second-order one ``v_h^2 ||u_h||^2 / 12``."""
    norm = np.maximum(np.linalg.norm(coded, axis=1), 1e-12)
    widths = np.broadcast_to(widths, coded.shape)
    gradient = unit_query[None] - cosines[:, None] * (coded / norm[:, None])  # [n, dims]
    spread = ((gradient * widths) ** 2).sum(1)
    second = (widths**2).sum(1)
    if norms is not None:
        directions, norm_widths = norms
        per_head = gradient.reshape(directions.shape)
        along = (per_head * directions).sum(2)  # [n, Hs]: g_h . u_h
        spread = spread + (along**2 * norm_widths**2).sum(1)
        second = second + (norm_widths**2 * (directions**2).sum(2)).sum(1)
    first = np.sqrt(spread / 12.0) / norm
    return MARGIN * first + CURVATURE * second / 12.0 / norm**2


def code_error(
    unit_query: np.ndarray, steps: np.ndarray, coded: np.ndarray, cosines: np.ndarray
) -> np.ndarray:
    """``cosine_bound`` with one width for every candidate: the widest of ``steps [spans,
    dims]`` (the even steps of an atlas of format 3 or before, each span's), a bound for all."""
    widest = steps[np.argmax((steps**2).sum(1))]
    return cosine_bound(unit_query, widest, coded, cosines)


def rerank(
    query: np.ndarray,
    exclude: int,
    k: int,
    candidates: np.ndarray,
    bounds: np.ndarray,
    text_of: np.ndarray,
    recompute: Callable[[list[int]], tuple[np.ndarray, np.ndarray]],
    seed: tuple[np.ndarray, np.ndarray],
    seed_texts: Sequence[int],
    max_texts: int = MAX_TEXTS,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest tokens to ``query`` (a true output, not unit) by true cosine among
    every token of the texts recomputed, ``exclude`` left out: ``(tokens, similarities)``.
    Texts are recomputed, the nearest candidates' first, until no candidate whose bound
    reaches the k-th true cosine found is left in a text not yet recomputed, or ``max_texts``
    texts are done (``text_budget``).

    Args:
        query: the query token's true output over the heads asked.
        exclude: the query token.
        k: results.
        candidates: tokens proposed by the codes, nearest first.
        bounds: each candidate's coded cosine plus its margin (the most its true one may be).
        text_of: each candidate's text.
        recompute: texts -> ``(tokens, rows)``: every token of those texts and its true output.
        seed: ``(tokens, rows)`` already recomputed (the query's own text).
        seed_texts: the texts of ``seed``.
        max_texts: texts recomputed at most besides ``seed_texts``.
    """
    tokens, rows = [seed[0]], [seed[1]]
    done = set(int(t) for t in seed_texts)
    while True:
        found, sims = exact_top(np.concatenate(rows), np.concatenate(tokens), query, k, exclude)
        tenth = float(sims[k - 1]) if len(sims) >= k else -np.inf
        pending = [
            int(t)
            for t, b in zip(text_of, bounds, strict=True)
            if b >= tenth and int(t) not in done
        ]
        room = max_texts + len(seed_texts) - len(done)
        if not pending or room <= 0:
            return found, sims
        batch = list(dict.fromkeys(pending))[: min(ROUND_TEXTS, room)]  # nearest texts first
        done.update(batch)
        new_tokens, new_rows = recompute(batch)
        tokens.append(new_tokens)
        rows.append(new_rows)


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

"""Activation patching and attribution patching per head: which heads carry the difference
between a clean and a corrupted input.

Activation patching (Meng et al. 2022, "ROME"; Wang et al. 2022, "IOI"), with TransformerLens's
conventions (``transformer_lens.patching``): run the *corrupted* input, replace one head's
activation with the one the *clean* input gave at the same layer (and position), recompute the
layers above, and measure a metric. ``effect = (m_patched - m_corrupted) / (m_clean -
m_corrupted)``: 1 when that head alone restores the clean behaviour, 0 when it changes nothing.

Attribution patching (Nanda 2023, "Attribution Patching: Activation Patching At Industrial
Scale") is its first-order estimate: ``m_patched - m_corrupted ~ sum over positions of
grad(m at the corrupted run) . (clean - corrupted)``, for every head from one forward and one
backward pass on the corrupted input and one forward pass on the clean one.

Activation patching has one driver, ``generic_activation_patch`` (TransformerLens's name):
``patch_heads`` and ``patch_positions`` are ``partial``s of it with their layout of patches
(``PATCH_INDEXES``), for every activation of ``PATCH_POINTS`` (z, q, k, v, pattern). The metric
is ``mhsa.causal.metrics``'s. Everything runs through our module (``mhsa.engine.runs.swap``) with
the
model's own
weights: an activation is replaced by an observer at the named observation point of the attention
core (``mhsa.engine.attention.core``); the runs, batched, are ``mhsa.causal.patch_runs``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import torch

from mhsa.analysis.claims import Claim, count_claim
from mhsa.causal.metrics import PATCH_TARGETS
from mhsa.causal.patch_runs import (
    Cell,
    PatchPoint,
    PatchSetup,
    activation_gradients,
    check_batch_size,
    check_difference,
    clean_and_corrupted,
    effect_of,
    head_frame,
    patched_in_one_pass,
    patched_runs,
    setup_patch,
    table_attrs,
)
from mhsa.engine.models.loading import DEFAULT_MODEL, LoadedModel, resolve_model
from mhsa.engine.result import html_view
from mhsa.errors import InputError, UnsupportedModelError
from mhsa.heads import head_label
from mhsa.registry import lookup

__all__ = [
    "PATCH_INDEXES",
    "PATCH_POINTS",
    "PATCH_TARGETS",
    "PatchGrid",
    "PatchIndex",
    "PatchPoint",
    "PatchingAgreement",
    "attribution_effect",
    "attribution_patching",
    "generic_activation_patch",
    "patch_heads",
    "patch_positions",
    "patching_agreement",
    "patching_correlation",
]

Progress = Callable[[int, int], None]


#: The activations ``patch_heads`` patches, by name, in the order pickers list them.
PATCH_POINTS: Mapping[str, PatchPoint] = {
    p.name: p
    for p in (
        PatchPoint(
            "z",
            "head output (context, before W_O)",
            "per-head context",
            "get_act_patch_attn_head_out_all_pos",
            "get_act_patch_attn_head_out_by_pos",
        ),
        PatchPoint(
            "q",
            "queries",
            "per-head Q",
            "get_act_patch_attn_head_q_all_pos",
            "get_act_patch_attn_head_q_by_pos",
        ),
        PatchPoint(
            "k",
            "keys",
            "per-head K",
            "get_act_patch_attn_head_k_all_pos",
            "get_act_patch_attn_head_k_by_pos",
            kv=True,
        ),
        PatchPoint(
            "v",
            "values",
            "per-head V",
            "get_act_patch_attn_head_v_all_pos",
            "get_act_patch_attn_head_v_by_pos",
            kv=True,
        ),
        PatchPoint(
            "pattern",
            "attention pattern",
            "probabilities",
            "get_act_patch_attn_head_pattern_all_pos",
            "none in TransformerLens: here a position is the pattern's query (destination) row",
        ),
    )
}


@dataclass(frozen=True)
class PatchGrid:
    """What can be patched in one pair of runs: ``layers`` layers of ``heads`` heads (key/value
    heads for ``k`` and ``v`` of grouped-query models) at ``positions`` positions."""

    layers: int
    heads: int
    positions: int

    def check_layer(self, layer: object) -> int:
        """``layer`` as an int.

        Raises:
            InputError: the model has no such layer.
        """
        if not isinstance(layer, int | np.integer) or not 0 <= layer < self.layers:
            raise InputError(
                f"There is no layer {layer!r}: the model has layers 0 to {self.layers - 1}."
            )
        return int(layer)


def _every_head(grid: PatchGrid, layer: int | None) -> list[Cell]:
    """Each head (of ``layer`` only, when given) at every position."""
    layers = range(grid.layers) if layer is None else [grid.check_layer(layer)]
    return [(li, h, None) for li in layers for h in range(grid.heads)]


def _every_head_and_position(grid: PatchGrid, layer: int | None) -> list[Cell]:
    """Each head of ``layer`` at each position."""
    if layer is None:
        raise InputError("Patching per position needs a layer: give layer=<number>.")
    li = grid.check_layer(layer)
    return [(li, h, p) for h in range(grid.heads) for p in range(grid.positions)]


def _heads_table(
    setup: PatchSetup, cells: Sequence[Cell], patched: np.ndarray, effect: np.ndarray
) -> pd.DataFrame:
    """One row per head, index ``L{layer}H{head}`` (``patch_heads``)."""
    layers = sorted({c[0] for c in cells})
    shape = (len(layers), len(cells) // len(layers))
    frame = head_frame({"patched": patched.reshape(shape), "effect": effect.reshape(shape)})
    if len(layers) == 1 and layers[0]:  # one layer asked for: its labels
        frame["layer"] = layers[0]
        frame.index = pd.Index([head_label(layers[0], h) for h in frame["head"]], dtype=object)
    return frame


def _positions_table(
    setup: PatchSetup, cells: Sequence[Cell], patched: np.ndarray, effect: np.ndarray
) -> pd.DataFrame:
    """One row per (head, position), tidy, with the clean and corrupted tokens there
    (``patch_positions``)."""
    clean_tokens = list(setup.clean.tokens.strings)
    corrupted_tokens = list(setup.corrupted.tokens.strings)
    return pd.DataFrame(
        {
            "layer": cells[0][0],
            "head": [c[1] for c in cells],
            "position": [c[2] for c in cells],
            "token": [clean_tokens[c[2]] for c in cells],  # type: ignore[index]
            "corrupted_token": [corrupted_tokens[c[2]] for c in cells],  # type: ignore[index]
            "patched": patched,
            "effect": effect,
        }
    )


@dataclass(frozen=True)
class PatchIndex:
    """How one kind of patching lays its patches out (TransformerLens's ``index_axis_names``):
    which cells ``(layer, head, position)`` it patches, and the table of their results.

    Attributes:
        name: ``"heads"`` or ``"positions"``.
        cells: ``cells(grid, layer)``: the cells, in the table's order.
        table: ``table(setup, cells, patched, effect)``: the result's rows.
        one_pass: the clean, the corrupted and every patched run may share one forward pass
            when they fit one batch (a small model's fixed cost per pass dominates).
    """

    name: str
    cells: Callable[[PatchGrid, int | None], list[Cell]]
    table: Callable[..., pd.DataFrame]
    one_pass: bool


#: The layouts of ``generic_activation_patch``, by name.
PATCH_INDEXES: Mapping[str, PatchIndex] = {
    i.name: i
    for i in (
        PatchIndex("heads", _every_head, _heads_table, one_pass=True),
        PatchIndex("positions", _every_head_and_position, _positions_table, one_pass=False),
    )
}


def generic_activation_patch(
    clean: str,
    corrupted: str,
    layer: int | None = None,
    *,
    index: str | PatchIndex = "heads",
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    target: str | None = None,
    text_pair: str | None = None,
    what: str = "z",
    max_tokens: int | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Activation patching, clean into corrupted: the one driver that ``patch_heads`` and
    ``patch_positions`` call (as TransformerLens's ``patching.generic_activation_patch``, of
    which its ``get_act_patch_*`` functions are ``partial``s).

    For each cell of ``index`` (a head at every position, or a head at one position), the
    activation ``what`` is taken from the clean run into the corrupted run at that cell, the
    layers above are recomputed, and the metric is measured: ``effect = (m_patched -
    m_corrupted) / (m_clean - m_corrupted)``. Cells are patched ``batch_size`` side by side in
    one forward pass, fanned out above the layers they share (see the module's docstring).

    Args:
        clean, corrupted: the two texts (the same number of tokens).
        layer: the layer patched (``"positions"``: required; ``"heads"``: every layer if None).
        index: ``"heads"`` or ``"positions"`` (``PATCH_INDEXES``), or a ``PatchIndex``.
        model, answer, wrong, target, text_pair, what, max_tokens, batch_size, progress: see
            ``patch_heads``.

    Returns:
        The index's table (see ``patch_heads``, ``patch_positions``), with ``attrs``.

    Raises:
        InputError: see ``patch_heads``; a layer the model does not have.
        UnsupportedModelError: an encoder-decoder (not patched yet), or a model our module
            cannot run.
    """
    check_batch_size(batch_size)
    layout = index if isinstance(index, PatchIndex) else lookup(PATCH_INDEXES, index, "index")
    lm = resolve_model(model)
    if lm.is_encoder_decoder:
        raise UnsupportedModelError(
            f"Activation patching does not run on encoder-decoders such as {lm.display_name!r} "
            "yet: their encoder, decoder and cross attention would each need a patching "
            "convention. Attribution patching, knock-outs and head importance run on them."
        )
    with lm.lock:
        point = lookup(PATCH_POINTS, what, "activation")
        setup = setup_patch(
            clean, corrupted, lm, point, answer, wrong, target, text_pair, max_tokens
        )
        ours = setup.blocks[0].ours
        heads = ours.num_kv_heads if setup.point.kv else ours.num_heads
        grid = PatchGrid(setup.layers, heads, len(setup.clean.tokens.strings))
        cells = layout.cells(grid, layer)
        with torch.inference_mode():
            if layout.one_pass and len(cells) <= batch_size:
                m_clean, m_corrupted, patched = patched_in_one_pass(setup, cells)
                if progress is not None:
                    progress(1, 1)
            else:
                clean_acts, m_clean, records, m_corrupted = clean_and_corrupted(setup)
                patched = patched_runs(setup, clean_acts, cells, records, batch_size, progress)
    frame = layout.table(setup, cells, patched, effect_of(patched, m_clean, m_corrupted))
    frame.attrs.update(table_attrs(setup, m_clean, m_corrupted))
    return frame


#: Activation patching per head, at every position: ``generic_activation_patch`` by heads.
patch_heads = partial(generic_activation_patch, index="heads")
patch_heads.__doc__ = """Activation patching per head, at every position: clean into corrupted.

    ``generic_activation_patch`` with ``index="heads"``.

    One head at a time, its activation (``what``) at every position is taken from the clean run
    into the corrupted run, at the same layer; the layers above are recomputed. As
    TransformerLens's ``patching.get_act_patch_attn_head_out_all_pos`` (``what="z"``: the
    head's context, ``hook_z``, before W_O) and ``get_act_patch_attn_head_{q,k,v,pattern}_all_pos``
    (``hook_q``/``hook_k`` before rotary positions, ``hook_v``, ``hook_pattern``): corrupted
    run, clean activation. With grouped-query attention, keys and values are patched per
    key/value head (each serves several query heads): the table then has that many heads per
    layer and ``attrs["kv_heads"]`` is True.

    The metric m (``mhsa.causal.metrics``): for causal language models ``logit(answer) -
    logit(wrong)``
    at the last input position (the logit difference of the IOI work). For models without a
    next-token head (encoders), ``target="embedding"`` (default): the cosine similarity of the
    run's sentence embedding (mean-pooled last hidden state, as the head-importance targets) to
    the clean run's: 1 for the clean run, lower for the corrupted one, so a patch that restores
    the clean representation moves it back towards 1; the embedding-change target of head
    importance (1 - cos with the intact run) measured against the clean run instead. ``target=
    "similarity"``: the cosine similarity to ``text_pair``'s embedding (the similarity target).

    Args:
        clean: the text whose activations are patched in.
        corrupted: the text run; it must have as many tokens as ``clean``.
        layer: only this layer's heads (default: every layer).
        model: ``"default"``, ``"toy:induction"``, a model id or folder, or a ``LoadedModel``.
        answer, wrong: causal LMs: words that are each exactly one token after a space.
        target: encoders: ``"embedding"`` or ``"similarity"`` (``PATCH_TARGETS``).
        text_pair: the second sentence of ``target="similarity"``.
        what: ``"z"``, ``"q"``, ``"k"``, ``"v"`` or ``"pattern"`` (``PATCH_POINTS``).
        max_tokens: truncate both texts to this many tokens.
        batch_size: heads patched side by side in one forward pass (16).
        progress: ``progress(done, total)`` after each forward pass; raising from it stops.

    Returns:
        One row per head, index ``L{layer}H{head}``: ``layer``, ``head``, ``patched`` (m of the
        patched run) and ``effect`` = (m_patched - m_corrupted) / (m_clean - m_corrupted).
        ``attrs``: ``what``, ``metric`` (its description), ``clean`` and ``corrupted`` (m of the
        two runs), ``clean_tokens``, ``corrupted_tokens``, ``model``, ``kv_heads``.

    Raises:
        InputError: texts of different token counts (both named), an answer or wrong answer that
            is not one token (its tokens named), answer == wrong, answer/wrong for a model
            without a next-token head, an unknown activation or target, or texts that give the
            same metric.
    """

#: Activation patching per head and position, for one layer: ``generic_activation_patch`` by
#: positions.
patch_positions = partial(generic_activation_patch, index="positions", batch_size=32)
patch_positions.__doc__ = """Activation patching per head and position, for one layer: clean into
    corrupted: ``generic_activation_patch`` with ``index="positions"``, ``patch_positions(clean,
    corrupted, layer, ...)``.

    As TransformerLens's ``patching.get_act_patch_attn_head_out_by_pos`` (``what="z"``) and
    ``get_act_patch_attn_head_{q,k,v}_by_pos``, for the heads of ``layer``: one head's
    activation at one position taken from the clean run. For ``what="pattern"`` a position is
    the pattern's query (destination) row (TransformerLens has no by-position pattern patch).
    The metric and arguments are ``patch_heads``'s; ``batch_size`` defaults to 32.

    Returns:
        One row per (head, position), tidy: ``layer``, ``head``, ``position``, ``token`` (the
        clean token there), ``corrupted_token``, ``patched``, ``effect``; ``attrs`` as
        ``patch_heads``.

    Raises:
        InputError: as ``patch_heads``, and a missing layer or one the model does not have.
    """


def attribution_patching(
    clean: str,
    corrupted: str,
    *,
    model: str | LoadedModel = DEFAULT_MODEL,
    answer: str | None = None,
    wrong: str | None = None,
    target: str | None = None,
    text_pair: str | None = None,
    what: str = "z",
    max_tokens: int | None = None,
) -> pd.DataFrame:
    """Attribution patching (Nanda 2023): the first-order estimate of ``patch_heads``.

    For each head, ``sum over positions (and d_head) of grad_m(corrupted activation) *
    (clean activation - corrupted activation)``: the linear approximation of m_patched -
    m_corrupted around the corrupted run, as in Neel Nanda's attribution-patching demo for
    TransformerLens (the gradient of the metric at the corrupted run's cache, times the clean
    minus the corrupted cache, summed per head). Costs one clean forward pass and one forward
    and backward pass on the corrupted input, for every head of every layer. Arguments and
    metric as ``patch_heads``; for ``what="pattern"`` the sum runs over query and key positions.

    Returns:
        One row per head, index ``L{layer}H{head}``: ``layer``, ``head``, ``attribution`` (the
        estimate of m_patched - m_corrupted) and ``effect`` (it divided by m_clean -
        m_corrupted, comparable with ``patch_heads``'s ``effect``); ``attrs`` as there.

    Raises:
        InputError: as ``patch_heads``.
    """
    lm = resolve_model(model)
    with lm.lock:
        point = lookup(PATCH_POINTS, what, "activation")
        setup = setup_patch(
            clean, corrupted, lm, point, answer, wrong, target, text_pair, max_tokens
        )
        with torch.inference_mode():
            clean_acts, outputs = setup.activations(setup.clean.inputs)
            m_clean = float(setup.metric(outputs, setup.clean.inputs)[0])
        with torch.inference_mode(False), torch.enable_grad():
            grads, corrupted_acts, m = activation_gradients(setup)
    m_corrupted = float(m)
    check_difference(m_clean, m_corrupted, setup.metric.description)
    attribution = np.stack(
        [
            (g * (c - k)).flatten(2).sum(-1)[0].double().cpu().numpy()  # (heads,)
            for g, c, k in zip(grads, clean_acts, corrupted_acts, strict=True)
        ]
    )
    frame = head_frame(
        {"attribution": attribution, "effect": attribution / (m_clean - m_corrupted)}
    )
    frame.attrs.update(table_attrs(setup, m_clean, m_corrupted))
    return frame


def attribution_effect(attribution: pd.DataFrame) -> pd.DataFrame:
    """Attribution patching's ``effect`` as the column ``effect_attribution``, to join beside
    exact patching's ``effect``."""
    return attribution[["effect"]].rename(columns={"effect": "effect_attribution"})


def patching_correlation(exact: pd.DataFrame, attribution: pd.DataFrame) -> float:
    """Pearson's correlation between exact patching's ``effect`` and attribution patching's,
    over the heads both tables have; NaN when undefined (fewer than 3 heads, or a constant)."""
    joined = exact[["effect"]].join(attribution_effect(attribution)).dropna()
    x, y = joined["effect"].to_numpy(float), joined["effect_attribution"].to_numpy(float)
    if len(joined) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


#: at most this many heads count as "the heads that matter" when patching's two ways compare
AGREEMENT_TOP = 5
#: a head matters when its exact effect is at least this share of the largest one's
AGREEMENT_SHARE = 0.1


@dataclass(frozen=True)
class PatchingAgreement:
    """How well attribution patching ranks and sizes the heads that matter.

    A correlation over every head says little: with most heads near 0 and one far from it,
    Pearson's r is near 1 whatever the estimate says of the heads between. Instead: the heads
    whose exact effect is largest (``AGREEMENT_SHARE`` of the largest |effect| or more, at
    most ``AGREEMENT_TOP``), how many of them attribution ranks among its own as many largest
    (top-k overlap of |effect|) with the same sign as its exact effect (a head attribution
    puts among the largest with the opposite sign is not ranked alike: it says the head helps
    where it hurts), and each one's two values side by side.

    Attributes:
        heads: the heads that matter by exact patching, largest |effect| first.
        exact: their exact effects.
        estimated: attribution patching's estimates of them.
        found: how many of ``heads`` are among attribution's ``len(heads)`` largest |effect|
            with the sign of their exact effect.
        opposite: the heads of ``heads`` whose estimate has the opposite sign of their exact
            effect.
        pearson: Pearson's r over every head (``patching_correlation``), for reference.
    """

    heads: tuple[str, ...]
    exact: tuple[float, ...]
    estimated: tuple[float, ...]
    found: int
    pearson: float
    opposite: tuple[str, ...] = ()

    def claim(self) -> Claim:
        """The ranking as a claim with its support (``mhsa.analysis.claims.count_claim``): how
        many of the heads that matter attribution ranks alike (among its own as many largest,
        with the same sign), out of how many; not made on fewer than two heads (one head has no
        ranking to agree on)."""
        return count_claim(
            self.found,
            len(self.heads),
            "ranked alike, with the same sign",
            unit="heads",
            whole="the top ",
            minimum=2,
        )

    def summary(self) -> str:
        """The agreement in one sentence: the ranking, then the sizes head by head."""
        k = len(self.heads)
        if k == 0:
            return "No head has an exact effect: there is nothing to rank."
        sizes = "; ".join(
            f"{h} {e:.2f} exact, {a:.2f} estimated"
            for h, e, a in zip(self.heads, self.exact, self.estimated, strict=True)
        )
        which = "head" if k == 1 else f"{k} heads"
        opposite = f" Opposite signs: {', '.join(self.opposite)}." if self.opposite else ""
        return (
            f"Of the {which} with the largest exact effect, attribution ranks {self.found} "
            f"among its own top {k} with the same sign: {sizes}.{opposite}"
        )

    def _repr_html_(self) -> str:
        """In a notebook: exact against estimated effect as a scatter, and the table
        (``mhsa.plots.notebook_results.agreement_html``)."""
        return html_view("patching agreement")(self)


def patching_agreement(exact: pd.DataFrame, attribution: pd.DataFrame) -> PatchingAgreement:
    """``PatchingAgreement`` of exact patching's table (``patch_heads``) and attribution
    patching's (``attribution_patching``), over the heads both have."""
    joined = exact[["effect"]].join(attribution_effect(attribution)).dropna()
    size = joined["effect"].abs().sort_values(ascending=False, kind="stable")
    largest = float(size.iloc[0]) if len(size) else 0.0
    heads = [h for h, v in size.items() if largest > 0 and v >= AGREEMENT_SHARE * largest]
    heads = heads[:AGREEMENT_TOP]
    estimate = joined["effect_attribution"].abs().sort_values(ascending=False, kind="stable")
    theirs = set(estimate.index[: len(heads)])
    exact_of = [float(joined.at[h, "effect"]) for h in heads]
    estimated_of = [float(joined.at[h, "effect_attribution"]) for h in heads]
    same_sign = [e * a > 0 for e, a in zip(exact_of, estimated_of, strict=True)]
    return PatchingAgreement(
        heads=tuple(str(h) for h in heads),
        exact=tuple(exact_of),
        estimated=tuple(estimated_of),
        found=sum(h in theirs and same for h, same in zip(heads, same_sign, strict=True)),
        pearson=patching_correlation(exact, attribution),
        opposite=tuple(
            str(h) for h, e, a in zip(heads, exact_of, estimated_of, strict=True) if e * a < 0
        ),
    )

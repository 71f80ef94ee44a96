"""Figures readable on small and large models (issue 38, point 5): a least figure height, titles
wrapped rather than cut, token tick labels thinned to the room a figure has. The rendered sizes
are measured in a browser by ``tests/browser/test_readable_browser.py``."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from mhsa.plots.common import (
    COLUMN_TITLE_WIDTH,
    MAX_TICKS,
    MIN_HEIGHT,
    PAGE_PX,
    TICK_PX,
    TITLE_WIDTH,
    matrix_heatmap,
    tick_room,
    title_text,
)
from mhsa.plots.roles import composition_figure, role_maps


def _table(layers: int, heads: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [(li, h) for li in range(layers) for h in range(heads)]
    return pd.DataFrame(rows, columns=["layer", "head"]).assign(score=rng.random(len(rows)))


def test_a_two_layer_map_gets_the_least_height_and_a_deep_one_its_own() -> None:
    small = role_maps([("prev", _table(2, 4), "score")], title="Scores")
    deep = role_maps([("prev", _table(24, 16), "score")], title="Scores")
    assert small.layout.height == MIN_HEIGHT  # was 160 + 40 * 2 = 240
    assert deep.layout.height == 160 + 40 * 24


def test_a_long_title_wraps_into_lines_that_keep_every_word() -> None:
    title = "Q-composition: what each later head reads from each earlier one"
    scores = pd.DataFrame(np.eye(3), index=list("abc"), columns=list("abc"))
    text = composition_figure(scores, "Q", columns=3)
    assert composition_figure(scores, "Q").layout.title.text.count("<br>") == 1
    lines = text.layout.title.text.split(" <br>")
    assert len(lines) == 4  # drawn in a third of the page
    assert all(len(line) <= COLUMN_TITLE_WIDTH for line in lines)
    assert " ".join(lines) == title


def test_a_full_width_title_wraps_at_the_title_width() -> None:
    title = "Attention received by each position (× = a sink, above 0.3) in every head"
    lines = title_text(title).split(" <br>")
    assert len(lines) == 2 and all(len(line) <= TITLE_WIDTH for line in lines)
    assert " ".join(lines) == html.escape(title, quote=False)


def test_a_short_title_stays_one_line_and_user_text_stays_escaped() -> None:
    assert title_text("Layer 0, head 3") == "Layer 0, head 3"
    wrapped = title_text("<b>x</b> " * 12)
    assert "<b>" not in wrapped and "<br>" in wrapped
    assert html.unescape(wrapped.replace("<br>", "")).split() == ["<b>x</b>"] * 12


def test_tick_labels_are_thinned_to_the_room_of_the_figure() -> None:
    assert tick_room(None) == (450 - 160) // TICK_PX
    assert tick_room(10_000) == MAX_TICKS
    tokens = [f"t{i}" for i in range(40)]
    fig = matrix_heatmap(np.zeros((40, 40)), tokens, tokens, title="x", height=420, columns=2)
    shown = list(fig.layout.xaxis.ticktext)
    room = min((420 - 160) // TICK_PX, tick_room(PAGE_PX // 2))
    assert len(shown) <= room < len(tokens)
    every = tokens[:: -(-40 // room)]
    assert shown == [*every[:-1], tokens[-1]]  # every k-th token, the first and last kept
    assert list(fig.layout.yaxis.ticktext) == [*tokens[:: -(-40 // 16)][:-1], tokens[-1]]
    whole = matrix_heatmap(np.zeros((40, 40)), tokens, tokens, title="x", height=420)
    assert list(whole.layout.xaxis.ticktext) == tokens  # the page's width: as before


def test_a_wide_strip_keeps_its_columns_labelled() -> None:
    """Heads down the side, tokens across: the columns are not thinned by the figure's height."""
    tokens = [f"t{i}" for i in range(30)]
    heads = [f"L0H{h}" for h in range(4)]
    fig = matrix_heatmap(np.zeros((4, 30)), heads, tokens, title="x", height=200)
    assert list(fig.layout.xaxis.ticktext) == tokens


def test_a_figure_in_a_column_has_fewer_upright_column_labels() -> None:
    tokens = [f"t{i}" for i in range(25)]
    whole = matrix_heatmap(np.zeros((25, 25)), tokens, tokens, title="x", height=600)
    quarter = matrix_heatmap(np.zeros((25, 25)), tokens, tokens, title="x", height=600, columns=4)
    assert list(whole.layout.xaxis.ticktext) == tokens  # 600 px: room for every token
    room = tick_room(PAGE_PX // 4)
    every = tokens[:: -(-25 // room)]
    assert list(quarter.layout.xaxis.ticktext) == [*every[:-1], tokens[-1]]
    assert quarter.layout.xaxis.tickangle == -90 and whole.layout.xaxis.tickangle is None
    assert list(quarter.layout.yaxis.ticktext) == tokens  # 600 px tall: every row named

"""Long inputs (issue 46, item 4): advice to choose layers and heads is given only where it can
show more of the text, and a long head's map is scaled so that its structure shows."""

from __future__ import annotations

import numpy as np
import pytest

from mhsa import plots
from tests.app.test_pages import run
from tests.hostile import rendered
from tests.tiny import DECODER_SIZES, hand_result, save_tiny

HINT = "choose a layer and a range of heads under Long inputs"
WORDS = " ".join(["word"] * 600)


def _warned(at) -> str:
    return " ".join(rendered(w.value)[0] for w in at.warning)


@pytest.mark.slow
def test_the_advice_is_given_only_where_a_selection_reads_more(tmp_path, monkeypatch) -> None:
    """MiniLM reads 512 positions, this server's limit too: a selection would be cut at the
    same place, so no advice (main gave it). A model of 1,024 positions: the advice."""
    said = _warned(run("pages/1_Heads.py", text=WORDS))
    assert "The text was cut to 512 tokens" in said and HINT not in said
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**{**DECODER_SIZES, "max_position_embeddings": 1024})
    path = save_tiny(tmp_path / "long", LlamaForCausalLM(config))
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", path)
    said = _warned(run("pages/1_Heads.py", model=path, text=WORDS))
    assert "The text was cut to 512 tokens, this server's limit" in said and HINT in said


def _long_head(n: int) -> np.ndarray:
    """Each query: 0.4 on the token before, the rest spread evenly over the keys up to it."""
    a = np.zeros((n, n))
    for i in range(n):
        a[i, : i + 1] = (0.6 if i else 1.0) / (i + 1)
        if i:
            a[i, i - 1] += 0.4
    return a


def test_a_long_map_is_scaled_to_where_its_rows_look() -> None:
    n = 300
    a = _long_head(n)
    fig = plots.head_heatmap(hand_result(a[None, None], [f"t{i}" for i in range(n)]), 0, 0)
    top = fig.data[0].zmax
    by_hand = sum(max(row) for row in a) / n  # the mean of the rows' largest weights
    assert top == pytest.approx(by_hand, rel=1e-5) and top < 0.5
    assert "scale to" in fig.data[0].colorbar.title.text
    # the stripe below the diagonal is at the top of the scale; the spread weights far below
    assert a[200, 199] >= 0.8 * top and a[200, 10] < 0.01 * top
    short = plots.head_heatmap(hand_result(a[None, None, :20, :20], ["t"] * 20), 0, 0)
    assert short.data[0].zmax == 1.0 and short.data[0].colorbar.title.text == "weight"


@pytest.mark.slow
def test_the_long_toy_model_reaches_the_zoom_window() -> None:
    """toy:induction-long reads 2,048 positions: a 1,500-token text is cut at this server's
    512 with the advice; following it (a layer and a range of heads) shows the text whole and
    the zoom window over it."""
    from mhsa.training.tasks import SYMBOLS

    words = [SYMBOLS[i] for i in np.random.default_rng(0).integers(0, len(SYMBOLS), 750)]
    text = " ".join(words + words)  # 1,500 syllables, 1,501 tokens with [BOS]
    cut = run("pages/1_Heads.py", model="toy:induction-long", text=text)
    said = _warned(cut)
    assert "The text was cut to 512 tokens, this server's limit" in said and HINT in said
    at = run(
        "pages/1_Heads.py", model="toy:induction-long", text=text, long_layers="1",
        long_heads="0-3",
    )  # fmt: skip
    assert not at.exception and not at.error
    assert "was cut" not in _warned(at)
    (zoom,) = [n for n in at.number_input if n.label.startswith("Zoom")]
    assert zoom.max == 1501 - 512  # the window's first token runs over the whole text

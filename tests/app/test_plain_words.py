"""Plain words first (issue 46, item 11): the references a student meets (TransformerLens's
function names, the flow tool's formula) stay, folded at the end of their explanation; a formula
names key/value groups only where the model has them; statistics, widgets and captions say what
they are in words."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import mhsa
from mhsa.analysis import classroom
from mhsa.analysis.stats import stat_label
from tests.app.test_pages import run, specs

ROOT = Path(__file__).resolve().parents[2]


def _explanation(page: str) -> str:
    """A page's EXPLANATION constant, read without running the page."""
    source = (ROOT / page).read_text()
    start = source.index('EXPLANATION = """\\\n') + len('EXPLANATION = """\\\n')
    return source[start : source.index('"""', start)]


def test_references_come_after_the_plain_words() -> None:
    for page, names in (
        ("pages/11_Patching.py", ["get_act_patch_attn_head_out_all_pos", "_by_pos"]),
        ("pages/12_Information_flow.py", ["apply_ln_to_stack", "‖whole‖₁", "10⁻⁵"]),
    ):
        text = _explanation(page)
        folded = text.index("**For reference**")
        for name in names:
            assert folded < text.index(name), (page, name)  # kept, and only in the reference


def test_a_formula_names_groups_only_where_the_model_has_them(minilm) -> None:
    walk = classroom.walkthrough("The cat sat.", model=minilm, layer=0)
    formulas = {s.name: s.formula for s in walk.steps}
    assert formulas["raw scores"] == "Q_h K_h^T"
    assert formulas["per-head K"] == "K_h: reshape to [batch, heads, length, d_head]"
    assert not any("g(h)" in f or "K_g" in f for f in formulas.values())
    # a module with grouped key/value heads keeps them
    grouped = mhsa.MultiHeadSelfAttention(8, 4, num_kv_heads=2)
    _, _, trace = grouped.forward_with_trace(torch.randn(1, 3, 8))
    steps = [classroom.Step(t.name, t.formula, t.tensor.detach().numpy()) for t in trace]
    kept = classroom._walkthrough_of(grouped, ["a", "b", "c"], steps, "fresh", False, 0)
    assert "K_g(h)" in {s.name: s.formula for s in kept.steps}["raw scores"]


def test_statistics_are_named_in_words_on_the_page() -> None:
    assert stat_label("to_sep") == "to separators (to_sep)"
    assert stat_label("induction") == "induction"  # a detector's name is already words
    at = run("pages/3_Head_statistics.py", stat="to_sep")
    assert not at.exception
    box = at.selectbox(key="stat")
    assert "to separators (to_sep)" in box.options and box.value == "to_sep"
    titles = [s["layout"]["title"]["text"] for s in specs(at)]
    assert any(t.startswith("to separators (to_sep)") for t in titles), titles


def test_widgets_and_captions_say_what_their_numbers_mean() -> None:
    line_view = run("pages/8_Line_view.py")
    assert line_view.number_input(key="lines_per_token").label == "Lines per token (0: automatic)"
    spec = importlib.util.find_spec("ui.views.long_inputs")
    assert spec is not None and spec.origin is not None
    assert "fused kernel" not in Path(spec.origin).read_text()

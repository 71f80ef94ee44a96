"""The views of issue 13 at the library level: line view, neuron view, token search, top-k
lists, generated text, figure data for export, model facts in the result."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import mhsa
from mhsa import plots
from mhsa.analysis.classroom import walkthrough
from tests.hostile import PLACEHOLDER

SENTENCE = "The cat sat on the mat."


@pytest.fixture(scope="module")
def cat() -> mhsa.AttentionResult:
    return mhsa.attend(SENTENCE, model=mhsa.engine.get_model("default", "cpu"))


def _line_traces(fig) -> list:
    """The traces that draw lines (the others: the token columns, each head's legend entry)."""
    return [t for t in fig.data[2:] if t.meta]


def _lines_of(fig, head: int) -> int:
    """Lines the figure draws for ``head``: segments between NaN gaps in its traces."""
    total = 0
    for trace in fig.data:
        if trace.legendgroup == f"H{head}":
            total += int(np.sum(~np.isnan(np.asarray(trace.x, dtype=float)))) // 2
    return total


def test_line_view_draws_one_line_per_weight_above_the_threshold(cat) -> None:
    fig = plots.line_view(cat, 2)
    for head in (0, 5, 11):
        a = cat.attention[2, head]
        assert _lines_of(fig, head) == int(np.count_nonzero(a >= 0.01))


def test_line_view_opacity_follows_the_weight(cat) -> None:
    fig = plots.line_view(cat, 1, heads=[3])
    a = cat.attention[1, 3]
    by_pair = {}
    for trace in _line_traces(fig):
        alpha = float(re.search(r"rgba\(\d+,\d+,\d+,([\d.]+)\)", trace.line.color).group(1))
        ys = np.asarray(trace.y, dtype=float).reshape(-1, 3)
        for y_from, y_to, _ in ys:
            by_pair[(int(-y_from), int(-y_to))] = alpha
    strongest = np.unravel_index(np.argmax(a), a.shape)
    assert by_pair[tuple(int(i) for i in strongest)] == pytest.approx(
        np.ceil(a.max() * plots.LINE_BINS) / plots.LINE_BINS
    )
    weakest_kept = min(by_pair, key=lambda p: a[p])
    assert by_pair[weakest_kept] <= by_pair[tuple(int(i) for i in strongest)]
    assert {t.legendgroup for t in fig.data[2:]} == {"H3"}  # only the head asked for


def test_line_view_of_one_token_and_top_k(cat) -> None:
    fig = plots.line_view(cat, 0, token=2)
    for trace in _line_traces(fig):
        starts = np.asarray(trace.y, dtype=float)[0::3]
        assert np.all(starts == -2)  # every line leaves token 2
    assert "lines of 'cat'" in fig.layout.title.text
    top = plots.line_view(cat, 0, heads=[7], top_k=2)
    rows = cat.attention[0, 7]
    expected = sum(sum(1 for w in sorted(r, reverse=True)[:2] if w >= 0.01) for r in rows)
    assert _lines_of(top, 7) == expected
    assert "top 2 per token" in top.layout.title.text


@pytest.mark.slow
def test_line_view_beyond_the_dense_limit_keeps_the_top_lines_and_says_so() -> None:
    text = " ".join(["word"] * 60)
    r = mhsa.attend(text, model=mhsa.engine.get_model("default", "cpu"))
    fig = plots.line_view(r, 0, heads=[0])
    assert r.num_tokens > plots.LINE_DENSE
    assert f"top {plots.LINE_TOP_K} per token" in fig.layout.title.text
    assert _lines_of(fig, 0) <= plots.LINE_TOP_K * r.num_tokens


@pytest.mark.slow
def test_neuron_view_equals_the_models_own_query_and_key(cat) -> None:
    lm = mhsa.engine.get_model("default", "cpu")
    layer, head, token = 2, 5, 3
    walk = walkthrough(SENTENCE, model=lm, layer=layer)
    neuron = walk.neuron(head, token)
    x = torch.from_numpy(walk.step("X").value)
    own = lm.model.encoder.layer[layer].attention.self  # the model's own BERT projections
    d = walk.d_head
    with torch.no_grad():
        q = own.query(x)[0, token, head * d : (head + 1) * d].numpy()
        k = own.key(x)[0, :, head * d : (head + 1) * d].numpy()
    np.testing.assert_allclose(neuron.query, q, atol=1e-5)
    np.testing.assert_allclose(neuron.keys, k, atol=1e-5)
    np.testing.assert_allclose(neuron.products.sum(1), k @ q, atol=1e-4)
    np.testing.assert_allclose(neuron.dots, k @ q, atol=1e-4)
    np.testing.assert_allclose(neuron.scaled, k @ q / np.sqrt(d), atol=1e-4)
    # the model's own attention (transformers engine) for that row
    np.testing.assert_allclose(neuron.probabilities, cat.attention[layer, head, token], atol=1e-5)
    fig = plots.neuron_figure(neuron, walk.tokens)
    assert [t.meta for t in fig.data][:3] == ["q", "k", "q ⊙ k"]
    np.testing.assert_allclose(np.asarray(fig.data[-1].z)[:, 0], neuron.probabilities)


def test_neuron_view_rejects_a_head_or_token_out_of_range(cat) -> None:
    walk = walkthrough(SENTENCE, model=mhsa.engine.get_model("default", "cpu"), layer=0)
    with pytest.raises(mhsa.InputError, match="Head 12 does not exist"):
        walk.neuron(12, 0)
    with pytest.raises(mhsa.InputError, match="Token 9 does not exist"):
        walk.neuron(0, 9)


def test_find_tokens_matches_exact_first_ignoring_case_and_piece_marks() -> None:
    tokens = ["[CLS]", "The", "##cat", "concat", "Ġcat", "dog", "[SEP]"]
    assert mhsa.engine.find_tokens(tokens, "CAT") == [2, 4, 3]
    assert mhsa.engine.find_tokens(tokens, "  ") == []
    assert mhsa.engine.find_tokens(tokens, "zebra") == []


def test_top_attended_names_the_strongest_keys_in_order(cat) -> None:
    table = mhsa.analysis.top_attended(cat, 3, 4, k=3)
    a = cat.attention[3, 4]
    assert list(table.columns) == ["1", "2", "3"] and len(table) == cat.num_tokens
    for i in (0, 2, 7):
        j = int(np.argmax(a[i]))
        assert table.iloc[i, 0] == f"{cat.tokens[j]} #{j} {a[i, j]:.3f}"
        second = sorted(a[i], reverse=True)[1]
        assert table.iloc[i, 1].endswith(f"{second:.3f}")


def test_facts_travel_in_the_result(cat) -> None:
    lm = mhsa.engine.get_model("default", "cpu")
    assert cat.facts["layers"] == lm.config.num_hidden_layers == 6
    assert cat.facts["d_head"] == lm.config.hidden_size // lm.config.num_attention_heads
    assert cat.to_words().facts == cat.facts


def test_figure_data_has_every_cell_of_a_heatmap(cat) -> None:
    frame = plots.figure_data(plots.head_heatmap(cat, 4, 2))
    assert len(frame) == cat.num_tokens**2
    cell = frame[(frame["y"] == "cat #2") & (frame["x"] == "mat #6")]
    assert cell["value"].item() == pytest.approx(float(cat.attention[4, 2, 2, 6]))


def test_fit_margins_hold_the_labels_so_plotly_draws_once(cat) -> None:
    short = plots.fit_margins(plots.head_heatmap(cat, 0, 0))
    long_tokens = dataclasses.replace(cat, tokens=[t + "x" * 15 for t in cat.tokens])
    long = plots.fit_margins(plots.head_heatmap(long_tokens, 0, 0))
    # 15 more characters per label: about 15 * 0.62 * 12 px more room left and on top
    assert long.layout.margin.l - short.layout.margin.l == pytest.approx(112, abs=2)
    assert long.layout.margin.t - short.layout.margin.t == pytest.approx(112, abs=2)
    assert short.layout.margin.r > 90  # the colour bar and its title
    assert short.layout.xaxis.automargin is False and short.layout.yaxis.automargin is False
    assert short.layout.title.yanchor == "top"  # above the top tick labels, not among them
    big = plots.head_heatmap(cat, 0, 0).update_layout(font={"size": 20})
    assert plots.fit_margins(big).layout.margin.l > short.layout.margin.l * 1.4  # projector
    lines = plots.fit_margins(plots.line_view(cat, 0))
    assert lines.layout.margin.b == 10  # hidden axes take no room


def test_fit_margins_keep_automargin_where_there_are_several_axes() -> None:
    from plotly.subplots import make_subplots

    fig = plots.fit_margins(make_subplots(rows=1, cols=2))
    assert fig.layout.xaxis.automargin is not False and fig.layout.xaxis2.automargin is not False


def test_decorate_boxes_the_found_token_and_marks_generation(cat) -> None:
    fig = plots.decorate(plots.head_heatmap(cat, 0, 0), found=3, generated_from=6)
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert {(r.y0, r.y1) for r in rects if r.xref == "x domain"} == {(2.5, 3.5)}
    assert {(r.x0, r.x1) for r in rects if r.yref == "y domain"} == {(2.5, 3.5)}
    assert [s.x0 for s in fig.layout.shapes if s.type == "line" and s.yref == "y domain"] == [5.5]
    untouched = plots.decorate(plots.stat_grid(mhsa.head_stats(cat), "entropy"), found=3)
    assert not untouched.layout.shapes


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every absolute import in the file at ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def test_in_mhsa_only_the_plots_package_imports_plotly_and_nothing_imports_streamlit() -> None:
    """DESIGN.md's boundaries, for ``mhsa/plots/`` as a package: plotly in its modules and
    nowhere else in ``mhsa``; streamlit nowhere; and the plots modules share only public names
    (no ``from mhsa.plots.common import _helper``)."""
    root = Path(mhsa.__file__).parent
    tops = {
        path.relative_to(root): {module.split(".")[0] for module, _ in _imports(path)}
        for path in root.rglob("*.py")
    }
    with_plotly = {path for path, modules in tops.items() if "plotly" in modules}
    assert Path("plots/common.py") in with_plotly and Path("plots/heads.py") in with_plotly
    assert {path.parts[0] for path in with_plotly} == {"plots"}, with_plotly
    assert not [path for path, modules in tops.items() if "streamlit" in modules]
    private = [
        (path.name, module, name)
        for path in (root / "plots").glob("*.py")
        for module, names in _imports(path)
        if module.startswith("mhsa.")
        for name in names
        if name.startswith("_")
    ]
    assert not private


# --- generated text -------------------------------------------------------------------------------
def _greedy_by_hand(lm: mhsa.engine.LoadedModel, text: str, steps: int) -> list[int]:
    enc = lm.tokenizer(text, return_tensors="pt")
    ids = enc["input_ids"]
    with torch.no_grad():
        for _ in range(steps):
            extra = {k: torch.zeros_like(ids) for k in ("token_type_ids",) if k in enc}
            logits = lm.head_model(input_ids=ids, **extra).logits[0, -1]
            ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    return ids[0].tolist()


@pytest.mark.slow
def test_generate_greedy_equals_argmax_step_by_step(tiny_gpt2_path) -> None:
    lm = mhsa.load_model(tiny_gpt2_path, device="cpu")
    prompt = "The cat sat"
    full = mhsa.engine.generate(prompt, model=lm, max_new_tokens=4)
    assert full.startswith(prompt)
    expected = _greedy_by_hand(lm, prompt, 4)
    n_prompt = len(lm.tokenizer(prompt)["input_ids"])
    # the prompt verbatim, then what decoding every id together adds after the decoded prompt
    # (transformers' 4.x text-generation pipeline; a sub-word ``##`` piece joins its word)
    whole = lm.tokenizer.decode(expected, skip_special_tokens=True)
    head = lm.tokenizer.decode(expected[:n_prompt], skip_special_tokens=True)
    assert whole.startswith(head) and len(whole) > len(head)
    assert full == prompt + whole[len(head) :]


@pytest.mark.slow
def test_sampling_is_reproducible_from_its_seed(tiny_gpt2_path) -> None:
    lm = mhsa.load_model(tiny_gpt2_path, device="cpu")
    runs = {
        s: mhsa.engine.generate("A", model=lm, max_new_tokens=6, sample=True, seed=s)
        for s in range(4)
    }
    assert runs[1] == mhsa.engine.generate("A", model=lm, max_new_tokens=6, sample=True, seed=1)
    assert len(set(runs.values())) > 1  # a random 30k vocabulary: seeds differ


def test_generated_tokens_are_marked_in_the_result(tiny_gpt2_path) -> None:
    lm = mhsa.load_model(tiny_gpt2_path, device="cpu")
    prompt = "The cat sat"
    full = mhsa.engine.generate(prompt, model=lm, max_new_tokens=5)
    r = mhsa.attend(full, model=lm)
    r = dataclasses.replace(r, prompt_chars=len(prompt))
    first = r.generated_from
    assert first is not None and r.offsets[first][0] >= len(prompt)
    assert not any(r.generated[:first])
    rest = zip(r.generated[first:], r.special[first:], strict=True)
    assert all(g != special for g, special in rest)  # every non-special token after it
    assert r.offsets[first - 1][1] <= len(prompt)


def test_generate_needs_a_causal_lm_head() -> None:
    with pytest.raises(mhsa.InputError, match="no next-token"):
        mhsa.engine.generate(
            "Hello", model=mhsa.engine.get_model("default", "cpu"), max_new_tokens=3
        )


def test_file_stem_names_sentence_model_and_engine() -> None:
    from ui.core import Query
    from ui.exports import file_stem

    stem = file_stem(Query("Hi there.", model="org/My Model", engine="mhsa"))
    digest = hashlib.sha1(b"Hi there.").hexdigest()[:8]
    assert stem == f"{digest}-My_Model-mhsa"


@pytest.mark.slow
def test_line_view_at_512_tokens_stays_within_its_line_budget() -> None:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
    text = " ".join(words[i % len(words)] for i in range(600))
    r = mhsa.attend(text, model=mhsa.engine.get_model("default", "cpu"), max_tokens=512)
    fig = plots.line_view(r, 5)
    k = max(1, plots.LINE_BUDGET // (12 * 512))
    assert f"top {k} per token" in fig.layout.title.text
    drawn = sum(_lines_of(fig, h) for h in range(12))
    assert drawn <= plots.LINE_BUDGET
    assert drawn == sum(int(np.count_nonzero(r.attention[5, h].max(1) >= 0.01)) for h in range(12))


def test_labels_keep_colour_codes_and_markup_literal(cat) -> None:
    """Streamlit's plotly element replaces "#000001".."#000040" anywhere in a figure's spec with
    theme colours: a label never carries that text, and plotly's entities show it unchanged."""
    import html

    for text in ["#000001", "#000040 and <b>bold</b>", "a&b #", "##ing"]:
        shown = plots.label(text)
        assert not PLACEHOLDER.search(shown) and "<" not in shown
        assert html.unescape(shown) == text
    tokens = ["#000001", "<b>x</b>", "a&b"]
    result = dataclasses.replace(
        cat,
        tokens=tokens,
        attention=cat.attention[:, :, :3, :3],
        offsets=cat.offsets[:3],
        special=[False] * 3,
        punctuation=[False] * 3,
        word_ids=[0, 1, 2],
    )
    frame = plots.figure_data(plots.head_heatmap(result, 0, 0))  # the CSV: plain text again
    assert sorted(set(frame["x"])) == sorted(f"{t} #{i}" for i, t in enumerate(tokens))

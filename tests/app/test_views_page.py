"""Issue 13's app through AppTest: navigation, line view, neuron view, token search at 512
tokens, generated text, export settings, and pages free of numerics."""

from __future__ import annotations

import ast
import base64
import json

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import mhsa
from mhsa.analysis.classroom import walkthrough
from tests.app.test_pages import PAGES, ROOT, run, specs
from tests.hostile import rendered
from ui import navigation

NUMERIC_MODULES = {"numpy", "torch", "scipy", "sklearn"}


def _array(value) -> np.ndarray:
    """A plotly array from a figure's JSON spec (plain list or binary-encoded)."""
    if isinstance(value, dict) and "bdata" in value:
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        return data.reshape([int(s) for s in str(value.get("shape", len(data))).split(",")])
    return np.asarray(value, dtype=float)


def test_pages_do_no_numerics() -> None:
    """Pages only lay out widgets and figures: none imports a numerical library."""
    for path in [*PAGES, "app.py"]:
        tree = ast.parse((ROOT / path).read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module.split(".")[0])
        assert not imported & NUMERIC_MODULES, (path, imported & NUMERIC_MODULES)


def test_navigation_names_and_groups_every_page() -> None:
    sections = navigation.groups()
    assert list(sections) == ["Explore", "Analyse", "Teach"]
    files = [page.file for pages in sections.values() for page in pages]
    assert sorted(files) == sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py"))
    assert len(set(files)) == len(files)  # every page once
    titles = [page.title for pages in sections.values() for page in pages]
    assert titles[:2] == ["Overview", "Heads"]  # the heads one click from anywhere, near the top
    paths = [page.url_path for page in navigation.PAGES]
    assert len(set(paths)) == len(paths) and [p for p in paths if not p] == [""]  # one home page


def test_app_opens_on_the_overview_and_switches_pages() -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    assert not at.exception and at.title[0].value == "MHSA Explorer"
    at.switch_page("pages/8_Line_view.py").run()
    assert not at.exception and at.title[0].value == "Line view"


def test_line_view_draws_the_lines_of_every_head() -> None:
    at = run("pages/8_Line_view.py", layer="3")
    assert not at.exception
    (spec,) = specs(at)
    a = mhsa.attend("The cat sat on the mat.").attention[3]
    drawn: dict[str, int] = {}
    colours: dict[str, set] = {}
    for trace in [t for t in spec["data"][2:] if "meta" in t]:  # not the legend entries
        x = _array(trace["x"])
        drawn[trace["legendgroup"]] = drawn.get(trace["legendgroup"], 0) + int(
            np.sum(~np.isnan(x)) // 2
        )
        colours.setdefault(trace["legendgroup"], set()).add(
            (*trace["line"]["color"].split(",")[:3], trace["line"].get("dash", "solid"))
        )
    assert drawn == {f"H{h}": int(np.count_nonzero(a[h] >= 0.01)) for h in range(12)}
    assert all(len(c) == 1 for c in colours.values())  # one colour and dash per head...
    assert len(set().union(*colours.values())) == 12  # ...and a different pair for each


def test_line_view_of_one_token_and_chosen_heads() -> None:
    at = run("pages/8_Line_view.py", layer="0", line_heads="2,4", line_token="2")
    (spec,) = specs(at)
    assert "lines of 'cat'" in spec["layout"]["title"]["text"]
    assert {t["legendgroup"] for t in spec["data"][2:]} == {"H2", "H4"}
    for trace in [t for t in spec["data"][2:] if "meta" in t]:
        assert set(_array(trace["y"])[0::3]) <= {-2.0}
    at.selectbox(key="line_token").set_value(-1).run()
    assert "all tokens" in specs(at)[0]["layout"]["title"]["text"]
    assert "line_token" not in at.query_params


def test_neuron_view_shows_the_modules_query_and_keys() -> None:
    at = run("pages/4_Inside_MHSA.py", pretrained_layer="2", neuron_token="3", neuron_head="5")
    assert not at.exception
    neuron = next(s for s in specs(at) if s["layout"]["title"]["text"].startswith("Neuron view"))
    traces = {t["meta"]: t for t in neuron["data"]}
    lm = mhsa.engine.get_model("default", "cpu")
    walk = walkthrough("The cat sat on the mat.", model=lm, layer=2)
    x = torch.from_numpy(walk.step("X").value)
    models_attention = lm.model.encoder.layer[2].attention.self  # the model's, not our module
    with torch.no_grad():
        q = models_attention.query(x)[0, 3, 5 * 32 : 6 * 32].numpy()
        k = models_attention.key(x)[0, :, 5 * 32 : 6 * 32].numpy()
    np.testing.assert_allclose(_array(traces["q"]["z"])[0], q, atol=1e-5)
    np.testing.assert_allclose(_array(traces["k"]["z"]), k, atol=1e-5)
    np.testing.assert_allclose(_array(traces["q ⊙ k"]["z"]), q * k, atol=1e-5)
    weights = mhsa.attend("The cat sat on the mat.").attention[2, 5, 3]
    np.testing.assert_allclose(_array(traces["softmax"]["z"])[:, 0], weights, atol=1e-5)


@pytest.mark.slow
def test_finding_a_token_in_512_selects_and_boxes_it() -> None:
    vocabulary = ["the", "cat", "dog", "sat", "on", "mat", "and", "a", "big", "house"]
    words = [vocabulary[i % len(vocabulary)] for i in range(515)]
    words[400] = "elephant"
    text = " ".join(words)
    result = mhsa.attend(text, max_tokens=512)
    target = result.tokens.index("elephant")
    assert result.num_tokens == 512 and target > 400
    at = run("pages/1_Heads.py", text=text, find="ELEPHANT")
    assert not at.exception and not at.error
    assert at.session_state["token"] == target
    assert at.selectbox(key="token").value == target
    large, focus = specs(at)[1], specs(at)[2]
    boxes = [s for s in large["layout"]["shapes"] if s["type"] == "rect"]
    assert {(b.get("y0"), b.get("x0")) for b in boxes} == {
        (target - 0.5, 0),
        (0, target - 0.5),
    }
    assert "elephant" in focus["layout"]["title"]["text"]
    lines = run("pages/8_Line_view.py", text=text, find="elephant")
    assert lines.session_state["line_token"] == target


def test_several_matches_offer_a_choice() -> None:
    at = run("pages/1_Heads.py", find="the")  # "The cat sat on the mat."
    assert at.selectbox(key="match").options == ["#1 the", "#5 the"]
    at.selectbox(key="match").set_value(5).run()
    assert at.session_state["token"] == 5
    none = run("pages/1_Heads.py", find="elephant")
    assert any("No token matches" in c.value for c in none.caption)


@pytest.mark.slow
def test_generated_text_on_every_page(tiny_gpt2_path, monkeypatch) -> None:
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", tiny_gpt2_path)
    prompt = "The cat sat"
    full = mhsa.engine.generate(
        prompt, model=mhsa.load_model(tiny_gpt2_path, device="cpu"), max_new_tokens=5
    )
    assert len(full) > len(prompt)
    at = run("pages/0_Overview.py", model=tiny_gpt2_path, text=prompt, generate="5")
    assert not at.exception and not at.error
    tokens = at.dataframe[0].value
    assert "generated" in tokens.index
    flags = list(tokens.loc["generated"])
    assert flags.count("True") >= 1 and flags[: flags.index("True")].count("True") == 0
    heads = run("pages/1_Heads.py", model=tiny_gpt2_path, text=prompt, generate="5")
    first = flags.index("True")
    dashed = [s for s in specs(heads)[1]["layout"]["shapes"] if s["type"] == "line"]
    at_rows = [s["y0"] for s in dashed if s.get("xref") == "x domain"]
    at_cols = [s["x0"] for s in dashed if s.get("yref") == "y domain"]
    assert at_rows == at_cols == [first - 0.5]
    assert heads.number_input(key="generate").value == 5
    knocked = run("pages/1_Heads.py", model=tiny_gpt2_path, text=prompt, generate="5", off="L1H2")
    assert not knocked.exception and not knocked.error
    after = specs(knocked)[-1]["data"][0]  # the knock-outs run over the generated ids too
    assert len(after["x"]) == len(after["y"]) == len(flags)
    inside = run("pages/4_Inside_MHSA.py", model=tiny_gpt2_path, text=prompt, generate="5")
    assert not inside.exception and not inside.error
    step = specs(inside)[0]
    assert len(step["data"][0]["y"]) == len(flags)  # the walk-through runs over the generation


def test_no_generation_for_a_model_without_a_next_token_head() -> None:
    at = run("pages/0_Overview.py", generate="5")
    assert not at.exception
    assert not [w for w in at.get("number_input") if w.proto.id.endswith("generate")]
    assert list(at.dataframe[0].value.loc["generated"]) == ["False"] * 9


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_every_figure_exports_in_the_chosen_format_with_its_data(fmt: str) -> None:
    at = run("pages/1_Heads.py", export=fmt, layer="2", head="7")
    charts = at.get("plotly_chart")
    assert charts
    for chart in charts:
        options = json.loads(chart.proto.config)["toImageButtonOptions"]
        assert options["format"] == fmt and options["scale"] == 4
    names = [json.loads(c.proto.config)["toImageButtonOptions"]["filename"] for c in charts]
    assert any(n.endswith("-default-transformers-L2H7-head") for n in names)
    zips = [b for b in at.get("download_button") if b.proto.label.endswith("(HTML + CSV, .zip)")]
    assert [b.proto.label for b in zips] == [
        f"Download the {len(charts)} figures (HTML + CSV, .zip)"
    ]  # one control per page, in the sidebar


def test_the_figures_zip_holds_each_figure_as_html_and_csv() -> None:
    import io
    import zipfile

    from mhsa import plots
    from ui import exports

    cat = mhsa.attend("The cat sat on the mat.", model=mhsa.engine.get_model("default", "cpu"))
    grid, head = plots.head_grid(cat), plots.head_heatmap(cat, 2, 7)
    data = exports.figures_zip([("s-grid", grid), ("s-L2H7", head), ("s-L2H7", head)])
    archive = zipfile.ZipFile(io.BytesIO(data))
    assert sorted(archive.namelist()) == sorted(
        ["plotly.min.js"]
        + [f"{n}.{e}" for n in ("s-grid", "s-L2H7", "s-L2H7-2") for e in "html csv".split()]
    )
    page = archive.read("s-L2H7.html").decode()
    assert 'src="plotly.min.js"' in page and "Layer 2, head 7" in page
    rows = archive.read("s-L2H7.csv").decode().splitlines()
    assert len(rows) == 1 + cat.num_tokens**2  # header + every cell
    assert archive.read("plotly.min.js").startswith(b"/**")


@pytest.mark.slow
def test_importance_of_a_long_input_waits_for_the_button() -> None:
    text = " ".join(["the cat sat on the mat"] * 25)  # 150 words: over AUTO_TOKENS
    at = run("pages/7_Head_importance.py", text=text)
    assert not at.exception and not at.error
    assert not at.get("plotly_chart")  # nothing computed yet: the page stays quick
    assert any("152 tokens takes a while" in i.value for i in at.info)
    next(b for b in at.button if b.label == "Compute importance").click().run()
    assert not at.exception and not at.error
    grid = specs(at)[0]
    assert grid["layout"]["title"]["text"].startswith("Importance of each head")
    assert any(b.label == "Cancel" for b in at.button)


def test_compare_finds_the_token_in_the_first_sentence_only() -> None:
    at = run("pages/6_Compare.py", find="the", text2="the the the dog")
    assert not at.exception and not at.error
    matches = [b for b in at.get("selectbox") if b.key == "match"]
    assert [b.options for b in matches] == [["#1 the", "#5 the"]]  # the page's own sentence
    first, second = specs(at)[:2]
    assert [s["type"] for s in first["layout"].get("shapes", [])] == ["rect", "rect"]
    assert not second["layout"].get("shapes")


@pytest.mark.parametrize(  # the Overview draws none, Train heads none before it trains,
    # Information flow none on the default (an encoder): the pages whose record says they draw
    "page",
    [p.file for p in navigation.PAGES if p.figures],
)
def test_every_figure_carries_the_apps_colours_not_placeholders(page: str, tiny_bert) -> None:
    """Figures hold Streamlit's light-theme colours themselves (``plots.TEMPLATE``), so a figure
    saved as HTML looks as in the app; Streamlit's own template left "#000001".. placeholders
    (near-black) that only its browser code replaces."""
    from mhsa import plots
    from tests.hostile import PLACEHOLDER

    # the colours are tested, not the model: the tiny BERT (Head importance draws its pruning
    # curve in the colorway)
    at = run(page, model=tiny_bert)
    assert not at.exception and at.get("plotly_chart")
    for chart in at.get("plotly_chart"):
        assert not PLACEHOLDER.search(chart.proto.spec)
        template = json.loads(chart.proto.spec)["layout"]["template"]
        assert template["layout"]["colorway"][:2] == ["#0068c9", "#83c9ff"] == plots.COLORWAY[:2]


@pytest.mark.slow
def test_the_service_imports_scikit_learn_in_the_background() -> None:
    """The first visit to Head similarity does not wait for scikit-learn's import (0.8 s)."""
    import subprocess
    import sys

    code = (
        "import sys, threading\n"
        "import ui.core\n"
        "warm = [t for t in threading.enumerate() if t.name == 'mhsa-warm-imports']\n"
        "[t.join(60) for t in warm]\n"
        "print(len(warm), 'sklearn.manifold' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["1", "True"], out.stderr[-2000:]


def test_compare_counts_the_second_sentences_unknown_tokens() -> None:
    """Compare's second sentence on toy:induction was seven [UNK]s, silently: now counted."""
    from mhsa.examples import unknown_tokens

    at = run("pages/6_Compare.py", model="toy:induction")
    assert not at.exception
    second = at.text_area(key="text2").value
    unknown = unknown_tokens(second, model="toy:induction")
    assert unknown.unknown > 0
    said = [rendered(w.value)[0] for w in [*at.warning, *at.info]]
    head = f"The second sentence: {unknown.unknown} of its {unknown.total} tokens are unknown"
    assert any(s.startswith(head) for s in said), said

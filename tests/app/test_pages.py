"""Every page through Streamlit's AppTest: values on the figures, state in the URL, errors."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import mhsa
from tests.hostile import CASES, PLACEHOLDER, markup_tags, rendered
from ui import navigation

ROOT = Path(__file__).resolve().parents[2]
#: every page's file, from the navigation's registry
PAGES = sorted(page.file for page in navigation.PAGES)
CAT_TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]


def run(page: str, *, timeout: float = 120, **query: str) -> AppTest:
    """``page`` run under AppTest with the link ``query`` (``timeout``: seconds per run)."""
    at = AppTest.from_file(str(ROOT / page), default_timeout=timeout)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def specs(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def ticktext(spec: dict, axis: str = "xaxis") -> list[str]:
    return spec["layout"][axis]["ticktext"]


def test_page_list_is_complete() -> None:
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py"))
    assert on_disk == PAGES  # every page file in the navigation once, no record without a file
    names = [Path(p).stem for p in PAGES]
    assert set(names) >= {
        "0_Overview",
        "1_Heads",
        "2_Head_similarity",
        "3_Head_statistics",
        "4_Inside_MHSA",
        "5_Rollout",
        "6_Compare",
        "7_Head_importance",
        "8_Line_view",
        "9_Train_heads",
    }


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_without_errors(page: str) -> None:
    at = run(page)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert at.title[0].value


def test_overview_shows_tokens_facts_and_agreement() -> None:
    at = run("pages/0_Overview.py", engine="mhsa")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["layers"] == "6" and metrics["heads"] == "12"
    assert metrics["d_model"] == "384" and metrics["d_head"] == "32"
    assert metrics["device"] == str(mhsa.engine.pick_device("auto"))  # cpu here, cuda on a GPU box
    assert metrics["model's own forward (check)"].endswith("ms")
    tokens = at.dataframe[0].value
    assert list(tokens.loc["token"]) == CAT_TOKENS
    agreement = at.dataframe[1].value
    assert list(agreement["compared"][:6]) == [f"layer {i} attention weights" for i in range(6)]
    assert "final hidden state" in agreement["compared"].iloc[6]
    assert (agreement["max |ours - model|"] < 1e-4).all()


def test_heads_page_axes_grid_and_focus() -> None:
    at = run("pages/1_Heads.py")
    grid, large, focus = specs(at)
    mosaic, markers = grid["data"]
    # 6 x 12 thumbnails of 9 x 9 cells with one empty cell between them: a heatmap per head
    assert mosaic["type"] == "heatmap" and mosaic["z"]["shape"] == "59, 119"
    heads = np.frombuffer(base64.b64decode(markers["customdata"]["bdata"]), dtype=np.int8)
    # positions in the grid (what a click reads), then the model's layer and head (the hover)
    assert [tuple(p) for p in heads.reshape(-1, 4)] == [
        (li, h, li, h) for li in range(6) for h in range(12)
    ]
    assert ticktext(grid) == [f"H{h}" for h in range(12)]
    assert ticktext(grid, "yaxis") == [f"L{i}" for i in range(6)]
    assert ticktext(large) == CAT_TOKENS and ticktext(large, "yaxis") == CAT_TOKENS
    assert ticktext(focus) == CAT_TOKENS
    assert len(focus["data"][0]["y"]) == 72  # one row per head (tick labels are thinned)


def test_heads_page_selection_from_url_and_bad_values() -> None:
    at = run("pages/1_Heads.py", layer="3", head="7", token="2")
    assert at.number_input(key="layer").value == 3 and at.number_input(key="head").value == 7
    assert "Layer 3, head 7" in specs(at)[1]["layout"]["title"]["text"]
    at.number_input(key="layer").set_value(4).run()
    assert at.query_params["layer"] == "4" and at.query_params["head"] == "7"
    assert "Layer 4, head 7" in specs(at)[1]["layout"]["title"]["text"]
    bad = run("pages/1_Heads.py", layer="-4", head="many")
    assert not bad.exception
    warnings = " ".join(rendered(w.value)[0] for w in bad.warning)
    # a number outside the model's layers is moved into them and says so (issue 46)
    assert "layer='-4' is outside what this page can show here (0 to 5); showing 0." in warnings
    assert "head='many' ignored" in warnings
    assert bad.number_input(key="layer").value == 0


def test_too_large_head_number_is_clamped_to_the_model() -> None:
    at = run("pages/1_Heads.py", layer="40", head="30")
    assert at.number_input(key="layer").value == 5 and at.number_input(key="head").value == 11


def test_similarity_page_is_heads_by_heads() -> None:
    at = run("pages/2_Head_similarity.py", metric="cosine")
    matrix, head_map = specs(at)
    assert len(matrix["data"][0]["x"]) == 72 and len(matrix["data"][0]["y"]) == 72
    assert matrix["data"][0]["z"]["shape"] == "72, 72"
    assert "cosine" in matrix["layout"]["title"]["text"]
    assert len(head_map["data"][0]["text"]) == 72


def test_statistics_page_table_and_corpus() -> None:
    at = run("pages/3_Head_statistics.py")
    table = at.dataframe[0].value
    assert len(table) == 72 and "role" in table.columns
    at.text_area(key="corpus").input("The cat sat.\nDogs bark loudly, all night.").run()
    corpus = at.dataframe[0].value
    want = mhsa.head_stats(
        [mhsa.attend(t) for t in ["The cat sat.", "Dogs bark loudly, all night."]]
    )
    assert corpus["entropy"].to_numpy() == pytest.approx(want["entropy"].to_numpy(), rel=1e-5)
    assert "2 sentence(s)" in " ".join(c.value for c in at.caption)


def test_inside_mhsa_shapes_match_the_model_and_steps_move() -> None:
    at = run("pages/4_Inside_MHSA.py", step="4")
    shapes = dict(zip(at.table[0].value["step"], at.table[0].value["shape"], strict=True))
    assert shapes["per-head Q"] == "[1, 12, 9, 32]"
    assert shapes["raw scores"] == "[1, 12, 9, 9]"
    assert shapes["output"] == "[1, 9, 384]"
    assert at.subheader[0].value == "per-head Q"
    at.button[1].click().run()  # Next
    assert at.subheader[0].value == "per-head K"
    at.number_input(key="step_head").set_value(5).run()
    at.button(key="inside-to-atlas").click().run()  # the model's own head opens in the atlas
    assert at.session_state["_mhsa_opening"] == {
        "atlas_head": f"L{at.session_state['pretrained_layer']}H5"
    }
    fresh = run(
        "pages/4_Inside_MHSA.py", source="fresh", fresh_d_model="32", fresh_heads="4", step="7"
    )
    assert fresh.number_input(key="step_head")  # a step per head, but of fresh weights:
    assert not [b for b in fresh.button if b.key == "inside-to-atlas"]  # no atlas
    shapes = dict(zip(fresh.table[0].value["step"], fresh.table[0].value["shape"], strict=True))
    assert shapes["per-head Q"] == "[1, 4, 9, 8]"


def test_inside_mhsa_shows_rotation_and_gqa_grouping_for_a_llama_layer(
    tiny_llama_path, monkeypatch
) -> None:
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", tiny_llama_path)  # the operator allows it
    at = run(
        "pages/4_Inside_MHSA.py",
        model=tiny_llama_path,
        pretrained_layer="1",
        step="6",
        step_head="3",
    )
    steps = list(at.table[0].value["step"])
    assert steps[4:9] == ["per-head Q", "per-head K", "per-head V", "rotated Q", "rotated K"]
    shapes = dict(zip(steps, at.table[0].value["shape"], strict=True))
    assert shapes["per-head Q"] == "[1, 4, 9, 8]" and shapes["per-head K"] == "[1, 2, 9, 8]"
    assert at.subheader[0].value == "per-head V"
    caption = at.caption[0].value
    assert "2 key/value heads" in caption and "rotary positions" in caption
    assert "query head 3 reads key/value head 1" in at.info[0].value
    at.button[1].click().run()  # Next: the rotation of Q
    assert at.subheader[0].value == "rotated Q"
    assert any("RoPE" in m.value for m in at.markdown)  # the step's formula


@pytest.mark.slow
def test_models_load_only_if_the_operator_allowed_them(tiny_gpt2_path, monkeypatch) -> None:
    monkeypatch.delenv("MHSA_ALLOWED_MODELS", raising=False)  # the default policy
    for name in (tiny_gpt2_path, "/etc", "/no/such/folder", "gpt2"):
        at = run("pages/0_Overview.py", model=name)
        assert not at.error and not at.exception
        notice = rendered(at.warning[0].value)[0]
        # the same words whether the folder exists, is no model, or is missing: nothing disclosed
        assert "this server does not load it; it loads the default model (default)" in notice
        assert at.text_input(key="model").value == "default"
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", f"{tiny_gpt2_path},/models/other")
    at = run("pages/0_Overview.py", model=tiny_gpt2_path)
    assert not at.warning and not at.error
    assert {m.label: m.value for m in at.metric}["layers"] == "2"


def test_overview_of_the_random_engine_says_what_it_is() -> None:
    at = run("pages/0_Overview.py", engine="mhsa-random", seed="4")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["attention blocks"] == "untrained, seed 4"
    assert len(at.dataframe) == 1  # no agreement table: nothing to agree with


def test_rollout_and_compare_pages() -> None:
    at = run("pages/5_Rollout.py")
    rollout, per_layer = specs(at)
    assert ticktext(rollout) == CAT_TOKENS
    assert len(ticktext(per_layer, "yaxis")) == 6
    cmp = run("pages/6_Compare.py", text2="A dog ran.", layer="2", head="3")
    first, second = specs(cmp)
    assert ticktext(first) == CAT_TOKENS
    assert ticktext(second) == ["[CLS]", "a", "dog", "ran", ".", "[SEP]"]
    assert len(cmp.dataframe[0].value) == 72


def test_bad_sentence_and_bad_model_show_errors_and_the_app_recovers() -> None:
    at = run("pages/0_Overview.py")
    at.text_area(key="text").input("   ").run()
    assert not at.exception and "empty" in at.error[0].value
    at.text_area(key="text").input("Back to normal.").run()
    assert not at.error and at.metric
    at.text_input(key="model").input("no-such-org/no-such-model").run()
    assert not at.exception and not at.error
    said = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "does not load 'no-such-org/no-such-model'. It loads the default model" in said
    assert "The pages show the default model instead." in said
    # the bad name is kept neither in the box nor in the link (for every other page)
    assert at.text_input(key="model").value == "default" and "model" not in at.query_params
    assert at.metric


def test_user_text_stays_literal_on_axes_and_messages() -> None:
    text = "<b>x</b> <script>alert(1)</script> & 🐱"
    at = run("pages/1_Heads.py", text=text)
    assert not at.exception and not at.error
    labels = ticktext(specs(at)[1])
    tokens = mhsa.attend(text).tokens
    assert labels == [html.escape(t, quote=False) for t in tokens]
    assert all("<" not in label for label in labels)
    bad = run(
        "pages/0_Overview.py", model="**bold** <i>x</i>"
    )  # not allowed: falls back with a notice
    assert not bad.error and bad.metric
    notice = bad.warning[0].value
    assert "model='**bold** <i>x</i>' ignored" in rendered(notice)[0]
    assert markup_tags(notice) == []


def test_sidebar_state_round_trips_through_the_url() -> None:
    at = run("pages/0_Overview.py", text="Hello there.", engine="mhsa-random", seed="5", words="1")
    assert at.text_area(key="text").value == "Hello there."
    assert at.radio(key="engine").value == "mhsa-random"
    assert at.toggle(key="words").value is True
    at.text_area(key="text").input("A new sentence.").run()
    assert at.query_params["text"] == "A new sentence."
    assert at.query_params["seed"] == "5" and at.query_params["words"] == "1"
    at.radio(key="engine").set_value("transformers").run()
    assert "engine" not in at.query_params  # defaults are left out of the link


#: the pages that show the sidebar's sentence (Train heads shows a model it trains; Patching
#: and Circuits their own clean and corrupted texts, hostile-tested in test_patching_page.py
#: and test_circuits_page.py; Lessons runs no model, its links tested in test_lessons.py; the
#: Head atlas a corpus, its links' hostile values in test_atlas_page.py and test_hostile_links)
SENTENCE_PAGES = [
    p
    for p in PAGES
    if not any(n in p for n in ("Train_heads", "Patching", "Circuits", "Lessons", "Head_atlas"))
]


@pytest.mark.parametrize("page", SENTENCE_PAGES)
@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.slow
def test_hostile_input_on_every_page(
    page: str, name: str, text: str, expected: object, tiny_bert: str
) -> None:
    # the tiny BERT: the default model's tokenizer and 512 positions, a fraction of its cost
    at = run(page, model=tiny_bert, text=text, text2=text)  # Compare: the same text both sides
    assert not at.exception, [e.value for e in at.exception]
    if expected == "error":
        assert at.error and "empty" in at.error[0].value
        return
    assert not at.error, [e.value for e in at.error]
    if expected.get("truncated"):
        assert any("tokens were dropped" in w.value for w in at.warning)
    assert at.text_input(key="model").value == tiny_bert  # no fallback to the default model
    tokens = mhsa.attend(text, model=tiny_bert, max_tokens=512).tokens
    for spec in specs(at):
        xaxis = spec["layout"].get("xaxis", {})
        if spec["data"][0]["type"] == "heatmap" and xaxis.get("title", {}).get("text") in (
            "key (to)",
            "input token",
        ):
            shown = xaxis["ticktext"]
            # plotly shows entities as characters: the tokens themselves, none as markup and
            # none as a "#0000NN" colour placeholder Streamlit's browser code would replace
            # every token, or every s-th with the last one named (thinned to the figure's room)
            got = [html.unescape(label) for label in shown]
            assert got == tokens or any(
                got == [*tokens[::step][: len(got) - 1], tokens[-1]]
                for step in range(2, len(tokens))
                if -(-len(tokens) // step) == len(got)
            ), got
            assert not [label for label in shown if "<" in label or PLACEHOLDER.search(label)]


@pytest.mark.slow
def test_corpus_limit_is_shown_when_hit() -> None:
    at = run("pages/3_Head_statistics.py")
    lines = [f"Sentence {i} is short." for i in range(55)]
    at.text_area(key="corpus").input("\n".join(lines)).run()
    assert not at.exception and not at.error
    assert any("Only the first 50 of 55 sentences" in w.value for w in at.warning)
    assert "50 sentence(s)" in " ".join(c.value for c in at.caption)


def test_link_with_a_sentence_over_the_limit_falls_back_with_a_notice() -> None:
    at = run("pages/1_Heads.py", text="x" * 100_001, engine="nonsense")
    warnings = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "text=" in warnings and "longer than 100,000 characters" in warnings
    assert "engine='nonsense' ignored" in warnings
    assert at.text_area(key="text").value == "The cat sat on the mat."
    assert ticktext(specs(at)[1]) == CAT_TOKENS


def _z(spec: dict, trace: int = 0) -> np.ndarray:
    z = spec["data"][trace]["z"]
    return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(
        [int(s) for s in z["shape"].split(",")]
    )


def test_heads_page_switch_to_value_norms_shows_the_librarys_norms() -> None:
    at = run("pages/1_Heads.py", layer="2", head="3")
    text = "The cat sat on the mat."
    library = mhsa.attend(text, norms=True)
    # equal up to the order of float sums (the page computes on fewer threads)
    np.testing.assert_allclose(_z(specs(at)[1]), library.attention[2, 3], rtol=1e-5, atol=1e-7)
    at.radio(key="values").set_value("norm").run()
    assert not at.exception and at.query_params["values"] == "norm"
    large = specs(at)[1]
    np.testing.assert_allclose(_z(large), library.norms[2, 3], rtol=1e-5, atol=1e-7)
    assert not np.allclose(library.norms[2, 3], library.attention[2, 3])
    assert "value norm" in large["data"][0]["hovertemplate"]
    assert "norm of the vector the head carries" in " ".join(c.value for c in at.caption)


def test_line_view_by_value_norm_scales_each_tokens_lines_to_one() -> None:
    weights = specs(run("pages/8_Line_view.py", layer="1"))[0]
    at = run("pages/8_Line_view.py", layer="1", values="norm")
    assert not at.exception and at.radio(key="values").value == "norm"
    assert specs(at)[0]["data"] != weights["data"]  # other lines, other opacities
    assert "each token's lines scaled to sum 1" in " ".join(c.value for c in at.caption)


def test_statistics_page_by_value_norm_normalises_rows_first() -> None:
    at = run("pages/3_Head_statistics.py", values="norm")
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    result = mhsa.attend("The cat sat on the mat.", norms=True)
    rows = mhsa.engine.norms_as_attention(result, rows_sum_to_one=True)
    want = mhsa.head_stats([rows])
    assert table["entropy"].to_numpy() == pytest.approx(want["entropy"].to_numpy(), rel=1e-5)
    weights = mhsa.head_stats([result])["entropy"].to_numpy()
    assert not np.allclose(table["entropy"].to_numpy(), weights, rtol=1e-3)
    assert "row scaled to sum 1" in " ".join(c.value for c in at.caption)


def test_heads_page_by_value_norm_on_a_model_our_module_cannot_load_says_so(
    tiny_t5_path, monkeypatch
) -> None:
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", tiny_t5_path)
    at = run("pages/1_Heads.py", model=tiny_t5_path, values="norm")
    assert not at.exception
    message = rendered(at.error[0].value)[0]
    assert "value norm" in message and "Values = attention weights" in message
    at.radio(key="values").set_value("weights").run()
    assert not at.exception and not at.error and specs(at)  # the weights draw as before

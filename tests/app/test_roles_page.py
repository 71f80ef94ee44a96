"""The Head roles page through AppTest: the maps against the library, the custom rule against
the named detectors, bad input, and the detection scores in the Head statistics table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import mhsa
import mhsa.analysis.repeats
from tests.app.test_importance_page import charts, decode
from tests.hostile import markup_tags, rendered

ROOT = Path(__file__).resolve().parents[2]
PAGE = "pages/10_Head_roles.py"
CAT = "The cat sat on the mat."
TOY = ROOT / "data" / "toy" / "induction"
DETECTORS = ("previous token", "duplicate token", "induction")


def run(page: str = PAGE, **query: str) -> AppTest:
    """The page opened by a link; ``model=tiny_bert`` where the page's values against the
    library are tested, not the embedded model (2 layers of 4 heads, the same tokens)."""
    at = AppTest.from_file(str(ROOT / page), default_timeout=180)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def score_maps(at: AppTest) -> dict[str, np.ndarray]:
    """The layers x heads scores of every panel of the page's score maps, by panel title."""
    maps = {}
    for spec in charts(at).values():
        if spec["data"][0].get("coloraxis") == "coloraxis":  # plots.role_maps
            names = [a["text"] for a in spec["layout"]["annotations"]]
            for name, trace in zip(names, spec["data"], strict=True):
                maps[name] = decode(trace["z"]).astype(float)
    return maps


def grid(at: AppTest, title: str) -> np.ndarray:
    """The layers x heads values of the panel titled ``title``."""
    return score_maps(at)[title]


def errors(at: AppTest) -> list[str]:
    return [rendered(e.value)[0] for e in at.error]


def library_grid(text: str, pattern, model: mhsa.engine.LoadedModel, **options) -> np.ndarray:
    scores = mhsa.detect_heads([text], pattern, model=model, **options)["score"]
    layers = 1 + max(mhsa.parse_head_label(h)[0] for h in scores.index)
    return scores.to_numpy().reshape(layers, -1)


def test_page_renders_every_section_on_the_embedded_model() -> None:
    at = run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    titles = list(charts(at))
    assert titles[0] == "Detection scores (error measure mul)"
    assert list(score_maps(at)) == [
        "Previous token score",
        "Duplicate token score",
        "Induction score",
    ]
    assert "Detection pattern: previous token" in titles
    assert sum(t.startswith("Layer ") for t in titles) == 3  # the top heads
    composition = [t[:13] for t in titles[-5:-2]]
    assert composition == ["Q-composition", "K-composition", "V-composition"]
    assert titles[-2].startswith("Copying score of each head's OV circuit W_V W_O")  # issue 49
    # the positional pattern through the embedding LayerNorm (a post-norm encoder's)
    assert titles[-1].startswith("L0H0: attention from position embeddings alone (LN(W_pos)")
    sinks = mhsa.analysis.attention_sinks(mhsa.attend(CAT))
    metric = next(m for m in at.metric if m.label.startswith("Heads that sink"))
    assert metric.value == f"{sinks.share:.0%}"
    note = next(c.value for c in at.caption if "sinks on a position" in c.value)
    assert "from every query" in note and f"{sinks.first_share:.0%} of the heads" in note
    # each share with its count of the 72 heads, counted here from the sinks' table
    table = sinks.table
    anywhere = table.groupby("head")["sink"].any()
    first = table[table["position"] == 0].set_index("head")["sink"]
    assert len(anywhere) == 72
    assert f"{int(anywhere.sum())} of 72 heads sink on at least one position." in note
    assert f"({int(first.sum())} of 72)." in note


@pytest.mark.parametrize(
    "options",
    [{}, {"exclude_bos": True, "exclude_current_token": True}],
)
def test_detection_maps_are_the_librarys_scores(options, tiny_bert, tiny_bert_model) -> None:
    link = {"exclude_bos": "1", "exclude_current": "1"} if options else {}
    at = run(model=tiny_bert, **link)
    assert not at.error
    titles = ["Previous token score", "Duplicate token score", "Induction score"]
    for name, title in zip(DETECTORS, titles, strict=True):
        want = library_grid(CAT, name, tiny_bert_model, **options)
        assert grid(at, title) == pytest.approx(want, abs=1e-5)
    # the previous-token pattern drawn beside the top heads: 1 just below the diagonal
    pattern = decode(charts(at)["Detection pattern: previous token"]["data"][0]["z"])
    assert np.array_equal(pattern, np.eye(9, k=-1))


def test_top_heads_are_the_best_scores_with_their_attention(minilm) -> None:
    at = run(detector="duplicate token")
    want = library_grid(CAT, "duplicate token", minilm).reshape(-1)
    best = np.argsort(-want, kind="stable")[:3]
    shown = [t for t in charts(at) if t.startswith("Layer ")]
    assert shown == [f"Layer {i // 12}, head {i % 12}" for i in best]
    attention = mhsa.attend(CAT).attention
    first = decode(charts(at)[shown[0]]["data"][0]["z"])
    assert first == pytest.approx(attention[best[0] // 12, best[0] % 12], abs=1e-5)


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        ("k back", "Previous token score"),
        ("same token", "Duplicate token score"),
        ("token after its earlier occurrence", "Induction score"),
    ],
)
def test_custom_rules_equal_the_named_detectors(rule, named, tiny_bert) -> None:
    at = run(model=tiny_bert, detector="custom rule", rule=rule, rule_k="1")
    assert not at.error and not at.exception
    assert np.array_equal(grid(at, "Custom pattern score"), grid(at, named))


def test_k_back_moves_the_pattern(tiny_bert, tiny_bert_model) -> None:
    at = run(model=tiny_bert, detector="custom rule", rule="k back", rule_k="2")
    pattern = decode(charts(at)["Detection pattern: custom rule"]["data"][0]["z"])
    assert np.array_equal(pattern, np.eye(9, k=-2))
    want = library_grid(CAT, np.eye(9, k=-2), tiny_bert_model)
    assert grid(at, "Custom pattern score") == pytest.approx(want, abs=1e-5)


def test_typed_rows_are_scored_and_bad_rows_named(tiny_bert, tiny_bert_model) -> None:
    rows = "\n".join(" ".join("1" if j == 0 else "0" for j in range(9)) for _ in range(9))
    at = run(model=tiny_bert, detector="custom rule", rule="typed rows", rule_rows=rows)
    assert not at.error
    want = library_grid(CAT, np.eye(9)[[0] * 9], tiny_bert_model)
    assert grid(at, "Custom pattern score") == pytest.approx(want, abs=1e-5)
    for typed, message in [
        ("1 0\n1 1", "[9, 9], got [2, 2]"),  # the wrong shape: the library names it
        ("1 0 0\n1 1", "Row 2 has 2 numbers and row 1 has 3"),
        ("1 [x](https://example.org)", "is not a number"),
    ]:
        at = run(model=tiny_bert, detector="custom rule", rule="typed rows", rule_rows=typed)
        assert not at.exception
        assert any(message in e for e in errors(at)), errors(at)
        assert not any(markup_tags(e.value) for e in at.error)  # shown literally
        assert "Previous token score" in score_maps(at)  # the rest of the page works
        assert "Attention received by each position (× = a sink, above 0.3)" in charts(at)


def test_k_forward_on_a_bidirectional_model_scores_attention_to_later_tokens(
    tiny_bert, tiny_bert_model
) -> None:
    at = run(model=tiny_bert, detector="custom rule", rule="k forward", rule_k="1")
    assert not at.exception and not at.error, errors(at)
    r = mhsa.attend(CAT, model=tiny_bert_model)
    n = r.num_tokens
    want = np.array(  # attention on (i, i + 1) over all attention, by hand
        [
            [
                sum(float(r.attention[li, h, i, i + 1]) for i in range(n - 1))
                / float(r.attention[li, h].sum())
                for h in range(r.num_heads)
            ]
            for li in range(r.num_layers)
        ]
    )
    assert grid(at, "Custom pattern score") == pytest.approx(want, abs=1e-5)


def test_sinks_value_norms_table_is_the_librarys(tiny_bert, tiny_bert_model) -> None:
    at = run(model=tiny_bert)
    tables = [d.value for d in at.dataframe if "value_norm" in d.value.columns]
    assert len(tables) == 1
    want = mhsa.analysis.roles.sink_value_norms(mhsa.attend(CAT, model=tiny_bert_model, norms=True))
    got = tables[0]
    assert got[["head", "position", "token"]].values.tolist() == (
        want[["head", "position", "token"]].values.tolist()
    )
    for column in ("received", "value_norm", "median_value_norm", "ratio"):
        assert got[column].to_numpy() == pytest.approx(want[column].to_numpy(), rel=1e-4)
    assert any(c.value.startswith("What the sinks carry") for c in at.caption)


def test_abs_on_a_bidirectional_model_is_named_and_the_page_goes_on(tiny_bert) -> None:
    at = run(model=tiny_bert, error_measure="abs")
    assert not at.exception
    assert any("causal" in e and "'mul'" in e for e in errors(at)), errors(at)
    titles = list(charts(at))
    assert not score_maps(at)
    assert "Attention received by each position (× = a sink, above 0.3)" in titles
    assert sum(t.endswith("earlier one") for t in titles) == 3
    both = run(
        model=tiny_bert, error_measure="abs", random_tokens="1"
    )  # the random test has no options: drawn
    assert list(score_maps(both)) == ["Induction score, repeated random tokens"]


def test_unknown_detector_in_a_link_falls_back_with_a_notice(tiny_bert) -> None:
    at = run(model=tiny_bert, detector="sideways <b>x</b>")
    assert not at.exception and not at.error
    assert "detector='sideways <b>x</b>' ignored" in rendered(at.warning[0].value)[0]
    assert at.selectbox(key="detector").value == "previous token"


@pytest.fixture
def any_model(monkeypatch):
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", "*")


def _with_model(at: AppTest, folder: str) -> AppTest:
    at.text_input(key="model").input(folder).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.skipif(not TOY.is_dir(), reason="the toy induction model is not in this checkout")
def test_one_token_text_is_named_and_the_page_goes_on(tmp_path, any_model) -> None:
    folder = tmp_path / "toy-no-bos"
    shutil.copytree(TOY, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["post_processor"] = None  # no [BOS]: "ba" is one token
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    at = _with_model(run(text="ba"), str(folder))
    assert any("at least two" in e for e in errors(at)), errors(at)
    assert "Attention received by each position (× = a sink, above 0.3)" in charts(at)


@pytest.mark.skipif(not TOY.is_dir(), reason="the toy induction model is not in this checkout")
def test_random_tokens_find_the_toy_models_induction_heads(any_model) -> None:
    at = _with_model(run(text="ba be bi bo bu"), str(TOY))
    assert not at.error
    at.button(key="random-tokens-button").click().run()
    assert not at.error and at.query_params["random_tokens"] == "1"
    induction = grid(at, "Induction score, repeated random tokens")
    assert induction.shape == (2, 4)
    assert induction[1].max() > 0.5 and induction[0].max() < 0.5  # a layer-1 induction head
    want = mhsa.detect_heads(None, "induction", model=mhsa.load_model(str(TOY), device="cpu"))
    assert induction.reshape(-1) == pytest.approx(want["score"].to_numpy(), abs=1e-6)
    at.button(key="random-tokens-button").click().run()  # back to the sentence
    assert "Induction score" in score_maps(at)


@pytest.mark.skipif(not TOY.is_dir(), reason="the toy induction model is not in this checkout")
def test_figures_follow_the_random_token_test() -> None:
    """With the test on and the induction detector, the top heads' maps and the detection
    pattern show the test's first repeated random sequence (its stripe), not the sentence."""
    at = run(model="toy:induction", detector="induction", random_tokens="1", seed="3")
    assert not at.exception and not at.error, errors(at)
    lm = mhsa.load_model("toy:induction", device="cpu")
    scores = mhsa.detect_heads(None, "induction", model=lm, seed=3)["score"]
    n = mhsa.analysis.repeats.repeat_length(lm, None)  # half of the toy model's 64 positions
    ids = mhsa.analysis.repeats.random_repeats(lm, n, 1, seed=3)[0]
    with torch.no_grad():
        own = lm.model(input_ids=ids[None], output_attentions=True).attentions
    best = scores.sort_values(ascending=False, kind="stable").index[:3]
    shown = [t for t in charts(at) if t.startswith("Layer ")]
    assert shown == [f"Layer {label[1]}, head {label[3]}" for label in best]
    for title, label in zip(shown, best, strict=True):
        layer, head = mhsa.parse_head_label(label)
        z = decode(charts(at)[title]["data"][0]["z"])
        assert z == pytest.approx(own[layer][0, head].numpy(), abs=1e-5)
    pattern = next(t for t in charts(at) if "induction" in t.lower() and "pattern" in t.lower())
    drawn = decode(charts(at)[pattern]["data"][0]["z"]).astype(float)
    assert drawn.shape == (2 * n, 2 * n)
    assert all(drawn[i, i - n + 1] == 1 for i in range(n, 2 * n))  # the key after its copy


def test_a_heads_strongest_inputs_are_its_composition_scores(tiny_bert, tiny_bert_model) -> None:
    # the tiny BERT: the page against the library (MiniLM's 72 heads took 30 s here)
    at = run(model=tiny_bert, role_head="L1H2")
    table = at.dataframe[-1].value  # after the sinks' value norms
    assert {mhsa.parse_head_label(w)[0] for w in table.index} == {0}  # only earlier layers
    for kind in ("Q", "K", "V"):
        scores = mhsa.analysis.head_composition(tiny_bert_model, kind)
        assert table[f"{kind}-composition"].to_numpy() == pytest.approx(
            scores.loc[table.index, "L1H2"].to_numpy(), rel=1e-6
        )
        top = mhsa.analysis.strongest_inputs(scores, "L1H2")
        assert set(top.index) <= set(table.index)
    missing = run(model=tiny_bert, role_head="L9H99")  # a head it lacks: its last, as clamp does
    assert not missing.error and missing.selectbox(key="role_head").value == "L1H3"
    at.button(key="role-to-atlas").click().run()  # the picker's head opens in the atlas
    assert at.session_state["_mhsa_opening"] == {"atlas_head": "L1H2"}


def test_statistics_table_has_the_detection_scores(tiny_bert, tiny_bert_model) -> None:
    at = run("pages/3_Head_statistics.py", model=tiny_bert, stat="induction")
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    for name in DETECTORS:
        want = mhsa.detect_heads([CAT], name, model=tiny_bert_model)["score"]
        assert table.loc[want.index, name].to_numpy() == pytest.approx(want.to_numpy(), abs=1e-5)
    assert charts(at)["induction"]["data"][0]["z"]  # the map of the chosen column

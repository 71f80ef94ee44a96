"""The Information flow page under AppTest: the encoder message and its one-click switch to the
toy model, the figures' data on the toy induction model, link values."""

from __future__ import annotations

import json

import pytest

from mhsa import plots
from tests.app.test_hostile_links import FORBIDDEN, assert_link_value_ignored, own_link_keys
from tests.app.test_pages import run, specs
from tests.hostile import PLACEHOLDER, markup_tags, rendered

PAGE = "pages/12_Information_flow.py"
TOY = {"model": "toy:induction", "text": "ba ke mo di lu ba ke mo"}

pytestmark = pytest.mark.slow


def test_an_encoder_gets_the_message_and_a_switch_to_the_toy_model():
    at = run(PAGE)
    assert not at.exception and not at.error
    assert "causal language model" in at.info[0].value
    assert not at.get("plotly_chart")
    button = next(b for b in at.button if "toy:induction" in b.label)
    at = button.click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.session_state["model"] == "toy:induction"
    assert at.query_params["answer"] == "di"
    assert len(specs(at)) == 3


def test_toy_model_figures_show_the_induction_route_and_the_answer():
    at = run(PAGE, **TOY, answer="di", wrong="lu")
    assert not at.exception and not at.error, [e.value for e in at.error]
    flow, dla, lens = specs(at)
    assert flow["layout"]["title"]["text"].startswith("Information flow to the last token")
    nodes = next(t for t in flow["data"] if t.get("name") == "nodes")
    last = [h for h in nodes["customdata"] if h.startswith("mo #8, layer 1, after layer")]
    assert last and "promotes: di" in last[0]
    edges = next(t for t in flow["data"] if t.get("name") == "edges")
    assert any(h.startswith("di #4 → mo #8<br>attention, layer 1") for h in edges["customdata"])
    assert "logit(di) − logit(lu)" in dla["layout"]["title"]["text"]
    bars = next(t for t in dla["data"] if t["type"] == "bar")
    assert "L1 MLP" in bars["y"] and "embed" in bars["y"]
    assert lens["data"][0]["text"][-1][-1] == "di"  # after the last layer, at the last token
    assert lens["data"][0]["y"] == ["embeddings", "L0", "L1"]
    table = at.dataframe[0].value
    assert set(table["kind"]) >= {"embed", "head", "mlp"}
    for chart in at.get("plotly_chart"):  # the app's colours, no placeholders (as every page)
        assert not PLACEHOLDER.search(chart.proto.spec)
        template = json.loads(chart.proto.spec)["layout"]["template"]
        assert template["layout"]["colorway"][:2] == plots.COLORWAY[:2]


def test_threshold_link_value_moves_the_graph_and_bad_ones_fall_back():
    low = run(PAGE, **TOY, flow_threshold="1", flow_renormalize="0")
    high = run(PAGE, **TOY, flow_threshold="20", flow_renormalize="0")

    def edges(at) -> int:
        flow = specs(at)[0]
        return len(next(t for t in flow["data"] if t.get("name") == "edges")["customdata"])

    assert edges(high) < edges(low)
    bad = run(PAGE, **TOY, flow_threshold="1e309")
    assert not bad.exception
    assert bad.session_state["flow_threshold"] == 4
    notice = " ".join(rendered(w.value)[0] for w in bad.warning)
    assert "flow_threshold='1e309' ignored" in notice


def test_answers_that_are_not_one_token_and_hostile_ones_are_shown_literally():
    at = run(PAGE, **TOY, answer="<img src=x onerror=alert(1)>", wrong="lu")
    assert not at.exception
    message = at.error[0].value
    assert "not one" in message or "one token" in message or "tokens" in message
    assert not [t for t in markup_tags(message) if t in ("img", "script")]
    assert len(json.dumps(specs(at))) > 0  # the flow and the lens still draw
    assert len(specs(at)) == 2


#: hostile values aimed at each link key of the page, on the toy model (where it reads them):
#: each is refused by its parser and falls back with a notice
FLOW_LINKS = {
    "flow_threshold": ["0", "21", "-1", "1e309", "nan", "0x1F", "4.5", "<b>4</b>"],
    "flow_renormalize": ["2", "yes", "<img src=x onerror=alert(1)>"],
    "answer": ["x" * 51, "x" * 100_001],  # over a word's limit
    "wrong": ["[a](javascript:alert(1))" * 5],
    "flow_token": ["-2", "100001", "1e309", "nan", "<b>3</b>", "last"],
}


def test_every_key_has_hostile_values():
    assert own_link_keys(PAGE) == set(FLOW_LINKS)


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, vs in FLOW_LINKS.items() for v in vs])
def test_link_values_fall_back_with_a_notice(key: str, value: str):
    at = run(PAGE, **TOY, **{key: value})
    assert_link_value_ignored(at, key)
    assert at.session_state[key] == at.session_state["_mhsa_params"][key].default
    assert not {t.strip("/") for w in at.warning for t in markup_tags(w.value)} & FORBIDDEN


@pytest.mark.parametrize(
    "word", ["[Sign in](https://example.org)", "**bold**", "&lt;b&gt;x", "\u202eevil"]
)
def test_answer_words_from_a_link_are_shown_literally(word: str):
    at = run(PAGE, **TOY, answer=word, wrong="lu")
    assert not at.exception
    assert at.error and all(markup_tags(e.value) == [] for e in at.error)
    assert at.text_input(key="answer").value == word
    assert len(specs(at)) == 2  # the flow and the lens (without the pair) still drawn


def test_the_route_to_another_token_and_a_position_past_the_end():
    at = run(PAGE, **TOY, flow_token="4")  # "di", which read "mo" (3) in layer 0
    flow = specs(at)[0]
    assert flow["layout"]["title"]["text"].startswith("Information flow to di &#35;4")
    edges = next(t for t in flow["data"] if t.get("name") == "edges")["customdata"]
    assert any(h.startswith("mo #3 → di #4<br>attention, layer 0") for h in edges)
    past = run(PAGE, **TOY, flow_token="40")  # a valid number past this text's 9 tokens
    assert not past.exception and not past.error
    assert past.session_state["flow_token"] == -1
    assert specs(past)[0]["layout"]["title"]["text"].startswith("Information flow to the last")


def test_generated_tokens_are_read_as_the_model_chose_them():
    at = run(PAGE, model="toy:induction", text="ba ke mo di lu ba ke", generate="3")
    assert not at.exception and not at.error, [e.value for e in at.error]
    lens = specs(at)[-1]
    assert lens["data"][0]["x"][-4:] == ["ke #7", "mo #8", "di #9", "lu #10"]


def test_the_top_two_predictions_button_fills_the_answers():
    at = run(PAGE, **TOY)
    assert len(specs(at)) == 2  # no answers yet: the flow and the lens
    button = next(b for b in at.button if b.label.startswith("Attribute the model's top two"))
    assert ": di against " in button.label  # the repeat's next token, first
    at = button.click().run()
    assert not at.exception and not at.error
    assert at.session_state["answer"] == "di"
    assert "logit(di) − logit(" in specs(at)[1]["layout"]["title"]["text"]


def test_a_soft_capped_model_says_its_attribution_is_before_the_cap(tmp_path, monkeypatch):
    """Gemma 2 caps its logits: the components add up to the difference before the cap, and the
    page says so beside the attribution."""
    from tests.tiny import save_tiny, tiny_family

    folder = save_tiny(tmp_path / "gemma2", tiny_family("gemma2"))
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", folder)
    at = run(PAGE, model=folder, text="the cat sat on the mat", answer="cat", wrong="dog")
    assert not at.exception and not at.error, [e.value for e in at.error]
    captions = " ".join(c.value for c in at.caption)
    assert "soft-caps its logits (0.5" in captions and "before the cap" in captions
    toy = run(PAGE, **TOY, answer="di", wrong="lu")
    assert "soft-caps" not in " ".join(c.value for c in toy.caption)

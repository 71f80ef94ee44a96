"""Each model's own examples in the app: a toy model opened by a link or the model box shows
its example, not [UNK]s; every page counts a sentence's unknown tokens and offers the model's
example in one click."""

from __future__ import annotations

from mhsa.examples import model_examples
from tests.app.test_pages import run
from tests.hostile import rendered


def _notices(at) -> str:
    return " ".join(rendered(w.value)[0] for w in [*at.warning, *at.info])


def test_a_toy_model_from_a_link_opens_on_its_example_not_unks() -> None:
    at = run("pages/0_Overview.py", model="toy:induction")
    assert not at.exception and not at.error
    example = model_examples("toy:induction")[0]
    assert at.session_state["text"] == example.text
    tokens = list(at.dataframe[0].value.loc["token"])
    assert "[UNK]" not in tokens and tokens == ["[BOS]", *example.text.split()]
    # the default sentence was nobody's: the link opens on the example without a word about it
    assert "unknown" not in _notices(at)


def test_a_sentence_typed_for_another_model_is_replaced_with_a_notice() -> None:
    at = run("pages/0_Overview.py")
    at.text_input(key="model").input("toy:induction").run()
    assert at.session_state["text"] == model_examples("toy:induction")[0].text
    assert "The sentence was 6 of 6 unknown tokens ([UNK]) for toy:induction" in _notices(at)


def test_a_links_own_sentence_is_kept_and_counted() -> None:
    at = run("pages/1_Heads.py", model="toy:induction", text="the cat ba")
    assert at.session_state["text"] == "the cat ba"
    assert "2 of the sentence's 3 tokens are unknown to toy:induction" in _notices(at)


def test_a_seq2seq_toy_model_gets_its_source_and_target() -> None:
    at = run("pages/1_Heads.py", model="toy:reverse-seq2seq")
    assert not at.exception and not at.error
    example = model_examples("toy:reverse-seq2seq")[0]
    assert at.session_state["text"] == example.text
    assert at.session_state["target_text"] == example.target


def test_switching_the_model_box_to_a_toy_model_fits_the_sentence_once() -> None:
    at = run("pages/1_Heads.py")
    assert at.session_state["text"] == "The cat sat on the mat." and not _notices(at)
    at.text_input(key="model").input("toy:sort").run()
    assert at.session_state["text"] == model_examples("toy:sort")[0].text
    at.text_area(key="text").input("ba be the cat").run()  # typed after: kept, counted
    assert at.session_state["text"] == "ba be the cat"
    said = _notices(at)
    assert "2 of the sentence's 4 tokens are unknown to toy:sort (shown as [UNK])" in said
    assert not at.warning  # half, not over half: a note, not a warning
    at.button(key="use-model-example").click().run()
    assert at.session_state["text"] == model_examples("toy:sort")[0].text
    assert "unknown" not in _notices(at)


def test_over_half_unknown_is_a_warning_on_the_default_model_too() -> None:
    at = run("pages/1_Heads.py", text="⟁ ⟁ ⟁ cat")
    assert not at.exception
    warned = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "3 of the sentence's 4 tokens are unknown to default (shown as [UNK])" in warned
    assert at.session_state["text"] == "⟁ ⟁ ⟁ cat"  # a link to the default model: kept as sent
    at.button(key="use-model-example").click().run()
    assert at.session_state["text"] == "The cat sat on the mat." and not at.warning


def test_the_sidebar_lists_the_models_examples() -> None:
    at = run("pages/1_Heads.py", model="toy:copy")
    picker = at.selectbox(key="model_example")
    assert len(picker.options) == 3
    picker.select_index(2).run()
    assert at.session_state["text"] == model_examples("toy:copy")[2].text


def test_a_seq2seq_toy_model_opens_on_cross_attention_where_it_aligns() -> None:
    """The shipped reverse model opens on cross attention, its target written by the model,
    at the layer whose cross attention is anti-diagonal (decoder row k reads source n - k)."""
    import json

    import numpy as np

    at = run("pages/1_Heads.py", model="toy:reverse-seq2seq")
    assert not at.exception and not at.error, [e.value for e in at.error]
    n = len(model_examples("toy:reverse-seq2seq")[0].text.split())
    state = at.session_state
    assert (state["kind"], state["generate"], state["layer"]) == ("cross", n, 1)
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    head = next(
        s for s in specs if s["layout"].get("title", {}).get("text", "").startswith("Layer 1")
    )
    from tests.app.test_importance_page import decode

    z = np.asarray(decode(head["data"][0]["z"]), dtype=float)
    assert z.shape == (n + 1, n + 1)  # [BOS] + n written symbols, against [BOS] + n source
    assert [int(i) for i in z[:n].argmax(-1)] == [n - k for k in range(n)]


def test_inside_mhsa_says_which_attention_it_walks_through() -> None:
    at = run("pages/4_Inside_MHSA.py", model="toy:reverse-seq2seq")
    assert not at.exception and not at.error, [e.value for e in at.error]
    captions = " ".join(c.value for c in at.caption)
    assert "This page walks through cross attention" in captions
    assert "shows the encoder's attention" not in captions
    off = run("pages/4_Inside_MHSA.py", model="toy:reverse-seq2seq", cross="0", kind="decoder")
    captions = " ".join(c.value for c in off.caption)
    assert "walks through the encoder's self-attention; the decoder attention" in captions

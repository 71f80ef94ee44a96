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

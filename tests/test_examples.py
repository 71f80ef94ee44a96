"""Every model brings its own example texts, and a text's unknown tokens are counted."""

from __future__ import annotations

import pytest

import mhsa
from mhsa.examples import DEFAULT_EXAMPLES, model_examples, unknown_tokens
from mhsa.training.tasks import SYMBOLS, TASKS, task_examples
from mhsa.training.toy import TOY_DIR


@pytest.mark.parametrize("task", list(TASKS))
def test_a_toy_models_examples_follow_its_task_and_its_card_lists_them(task: str) -> None:
    """Each example is the task's rule applied to distinct symbols (checked here by the rule as
    stated, not by the generator), none is unknown to the model, the card lists them all."""
    examples = model_examples(f"toy:{task}")
    assert len(examples) == 3
    card = (TOY_DIR / task / "README.md").read_text()
    for example in examples:
        words = example.text.split()
        if task == "reverse-seq2seq":
            assert example.target is not None and example.target.split() == words[::-1]
        else:
            assert example.target is None
            n = (len(words) - (task != "induction")) // 2
            source, rest = words[:n], words[n:]
            if task != "induction":
                assert rest[0] == "[SEP]"
                rest = rest[1:]
            want = {"induction": source, "copy": source, "reverse": source[::-1]}
            assert rest == want.get(task, sorted(source))
            words = source
        assert len(set(words)) == len(words) and set(words) <= set(SYMBOLS)
        low, high = TASKS[task].lengths
        assert low <= len(words) <= high
        counted = unknown_tokens(example.text, model=f"toy:{task}")
        assert counted.unknown == 0 and counted.total == len(example.text.split())
        assert f"- `{example.text}`" in card
        if example.target is not None:
            assert f"(target: `{example.target}`)" in card
    assert task_examples(task) == examples  # seeded: the same every time


def test_an_english_sentence_is_all_unknown_to_a_toy_model() -> None:
    sentence = DEFAULT_EXAMPLES[0].text  # "The cat sat on the mat.": 6 words, split on spaces
    counted = unknown_tokens(sentence, model="toy:induction")
    assert (counted.unknown, counted.total, counted.token) == (6, 6, "[UNK]")
    assert counted.mostly_unknown
    mixed = unknown_tokens("ba be The cat", model="toy:induction")
    assert (mixed.unknown, mixed.total, mixed.mostly_unknown) == (2, 4, False)  # half: not over
    three = unknown_tokens("ba The cat", model="toy:induction")
    assert three.mostly_unknown


def test_the_default_models_examples_are_known_words() -> None:
    assert model_examples("default") == DEFAULT_EXAMPLES
    assert DEFAULT_EXAMPLES[0].text == "The cat sat on the mat."
    for example in DEFAULT_EXAMPLES:
        assert unknown_tokens(example.text).unknown == 0
    lm = mhsa.engine.get_model("default", "cpu")
    unk = lm.tokenizer.unk_token_id
    odd = "the ⟁ sat"  # a symbol outside MiniLM's WordPiece vocabulary
    ids = lm.tokenizer(odd, add_special_tokens=False)["input_ids"]
    counted = unknown_tokens(odd)
    assert counted.unknown == ids.count(unk) == 1 and counted.total == len(ids) == 3


def test_other_models_bring_no_examples() -> None:
    assert model_examples("gpt2") == ()
    assert model_examples("toy:nope") == ()
    assert model_examples("trained:0123456789ab") == ()

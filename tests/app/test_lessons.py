"""The Lessons page and the Overview's page guide: every step's link opens a real page with
settings it reads, names only built-in models, and (the walk) opens without an error, a refused
link value or an unknown token, and every claim its sentence makes holds on what that page
computed (``ui.lessons.Claim``, measured by ``ui.views.lessons``)."""

from __future__ import annotations

import dataclasses
from urllib.parse import parse_qsl

import numpy as np
import pytest

import mhsa
from mhsa.examples import DEFAULT_EXAMPLES, model_examples
from tests.app.test_hostile_links import page_param_names
from tests.app.test_pages import run
from ui import navigation
from ui.lessons import LESSONS, PAGE_GUIDE, Claim, step_link
from ui.state import md_escape
from ui.views.lessons import MEASURES, check_claim, claim_text, measure_value, step_sentence

STEPS = [(lesson.title, i, step) for lesson in LESSONS for i, step in enumerate(lesson.steps)]
FILES = {page.url_path: page.file for page in navigation.PAGES}


def test_three_to_five_lessons_of_a_few_steps_each() -> None:
    assert 3 <= len(LESSONS) <= 6
    for lesson in LESSONS:
        assert 2 <= len(lesson.steps) <= 5
        for step in lesson.steps:
            assert step.says.count(". ") == 0 and step.says.endswith(".")  # one sentence


@pytest.mark.parametrize(("lesson", "index", "step"), STEPS)
def test_every_step_links_a_page_with_keys_it_reads_and_built_in_models(
    lesson: str, index: int, step
) -> None:
    assert step.page in FILES and step.page != ""
    keys = page_param_names(FILES[step.page])
    link = step_link(step)
    assert link.split("?")[0] == step.page
    settings = dict(parse_qsl(link.split("?", 1)[1])) if "?" in link else {}
    assert settings == step.settings  # the link carries exactly the step's settings
    assert set(settings) <= set(keys), set(settings) - set(keys)
    model = settings.get("model", "default")
    assert model == "default" or model.startswith("toy:")  # offline, in the Docker image too


def test_every_step_that_states_a_fact_carries_a_claim_the_measures_know() -> None:
    unclaimed = {"Line_view", "Train_heads", "Patching"}  # no fact about a figure's values
    for _, _, step in STEPS:
        for claim in step.claims:
            assert claim.measure in MEASURES
            assert claim.equals is not None or claim.at_least > -1e9 or claim.at_most < 1e9
        if step.page in unclaimed or step.says.startswith("Switch each head off"):
            continue
        assert step.claims, step.says


@pytest.mark.slow
def test_a_claim_that_the_page_contradicts_fails() -> None:
    """The check itself can fail: the lesson 3 head that main named (L0H0, strongest on itself)
    is not the toy's previous-token head."""
    step = next(s for lesson in LESSONS for s in lesson.steps if "L0H3" in str(s.claims))
    wrong = Claim("detection rank in layer", "L0H0", at_most=1)
    holds, rank = check_claim(step, wrong)
    assert not holds and rank > 1
    assert claim_text(wrong).startswith("L0H0: rank in its layer")
    assert not check_claim(step, Claim("top detected head", equals="L0H0"))[0]


def test_the_guide_names_every_page_once_in_order() -> None:
    guide = [path for path, _ in PAGE_GUIDE]
    assert sorted(guide) == sorted(FILES) and len(set(guide)) == len(guide)
    assert guide[0] == "" and guide[1] == "Lessons"  # the Overview first, then the lessons


def test_the_lessons_page_shows_every_step_as_a_link() -> None:
    at = run("pages/13_Lessons.py")
    assert not at.exception and not at.error
    shown = "\n".join(m.value for m in at.markdown)
    for _, _, step in STEPS:
        assert f"]({step_link(step)})" in shown
        assert "{" not in shown  # every field of every sentence filled in
    # sentences rendered from the numbers of the pages they open, counted here by hand
    text = DEFAULT_EXAMPLES[0].text
    a = mhsa.attend(text).attention.astype(np.float64)  # (L, H, n, n)
    n = a.shape[-1]
    smoothed = 0.9999 * a[0, 0] + 0.0001 / n  # Clark et al.'s smoothing
    entropy = float(-(smoothed * np.log(smoothed)).sum(-1).mean() / np.log(n))
    assert md_escape(f"its rows' entropy is {entropy:.0%} of a uniform row's.") in shown
    previous = np.diagonal(a, offset=-1, axis1=-2, axis2=-1).mean(-1).reshape(-1)
    assert previous.argmax() == 2 and previous[2] > 0.995  # L0H2, the most of the 72
    assert md_escape("This head puts over 99% of its attention on the token just before") in shown
    assert md_escape("L0H2 ranks 1st of all the heads.") in shown
    toy = model_examples("toy:induction")[0].text
    scores = mhsa.detect_heads(toy, "previous token", model="toy:induction")["score"]
    assert scores.idxmax() == "L0H3"
    assert md_escape(f"ranks L0H3 first, with a score of {scores.max():.2f}.") in shown
    assert [h.value for h in at.subheader] == [
        f"{n}. {lesson.title}" for n, lesson in enumerate(LESSONS, 1)
    ]


def test_the_overview_lists_every_page_in_the_guides_order() -> None:
    at = run("pages/0_Overview.py")
    assert not at.exception
    shown = "\n".join(m.value for m in at.markdown)
    titles = {page.url_path: page.title for page in navigation.PAGES}
    where = [shown.find(f"**{titles[path]}**") for path, _ in PAGE_GUIDE]
    assert -1 not in where and where == sorted(where)


@pytest.mark.slow
@pytest.mark.parametrize(("lesson", "index", "step"), STEPS)
def test_walk_every_step(lesson: str, index: int, step, request) -> None:
    """Each step's page opens from its link as set: no exception, no error, no link value
    refused, and no unknown token where the model has its example. The Head atlas steps read
    the explained toy atlas (``with_toy_atlas``) beside the session's MiniLM one."""
    if step.page == "Head_atlas":
        request.getfixturevalue("with_toy_atlas")
    at = run(FILES[step.page], **step.settings)
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    notices = " ".join(w.value for w in at.warning)
    assert "ignored" not in notices and "unknown" not in notices, notices
    for frame in at.dataframe:
        assert "[UNK]" not in frame.value.to_string()
    for key, value in step.settings.items():
        if key in at.session_state and isinstance(at.session_state[key], str):
            assert at.session_state[key] == value
    for claim in step.claims:  # measured on the values the page just computed (shared cache)
        holds, value = check_claim(step, claim)
        assert holds, f"{step.says!r}: {claim_text(claim)}, measured {value}"


_INDUCTION = model_examples("toy:induction")
_REVERSE = model_examples("toy:reverse-seq2seq")[1]
#: per step (lesson, step, from 1): other settings for its link, whose numbers differ
CHANGED = {
    (1, 1): {"text": "A dog barked at the loud red car."},
    (1, 2): {"model": "toy:induction", "text": _INDUCTION[0].text},  # its L0H2: 37%
    (1, 4): {"model": "toy:induction", "text": _INDUCTION[0].text},  # its L0H2 ranks 2nd
    (2, 1): {"step": "1"},
    (2, 2): {"step": "8"},
    (2, 3): {"step": "9"},
    (2, 4): {"source": "pretrained"},  # trained heads focus: over half the weight
    (3, 2): {"text": _INDUCTION[1].text},
    (3, 3): {"text": _INDUCTION[1].text},
    (4, 1): {"random_tokens": "0"},  # the toy's own example: L1H3 scores under 0.5
    (4, 2): {"text": _INDUCTION[1].text},
    (4, 3): {"text": _REVERSE.text, "target_text": _REVERSE.target or ""},
    (5, 3): {"text": _INDUCTION[1].text},
    (6, 1): {"model": "default", "atlas": "minilm-brown"},  # MiniLM's L0H3: another program
    (6, 2): {"model": "default", "atlas": "minilm-brown"},
    (6, 3): {"explain_program": "offset(1)"},  # the next token: not L0H2's key
    (6, 4): {"explain_program": "mix(offset(1), offset(-1), 0.5)"},  # names L0H2's keys too
}
CLAIMED = [
    ((li, si), step)
    for li, lesson in enumerate(LESSONS, 1)
    for si, step in enumerate(lesson.steps, 1)
    if step.claims
]


def test_every_step_with_a_claim_has_other_numbers_to_try() -> None:
    assert sorted(CHANGED) == sorted(where for where, _ in CLAIMED)


@pytest.mark.parametrize(("where", "step"), CLAIMED, ids=[f"{w[0]}.{w[1]}" for w, _ in CLAIMED])
def test_a_steps_sentence_follows_its_numbers(
    where: tuple[int, int], step, request: pytest.FixtureRequest
) -> None:
    """The sentence is rendered from the numbers its check reads: on other settings (another
    text, model or step) it says the other numbers, or, where a claim no longer holds, says
    that instead of the sentence."""
    if step.page == "Head_atlas":
        request.getfixturevalue("with_toy_atlas")
    sentence = step_sentence(step)
    assert sentence.made and sentence.support == sentence.of == len(step.claims)
    changed = dataclasses.replace(step, settings={**step.settings, **CHANGED[where]})
    other = step_sentence(changed)
    assert other.text != sentence.text
    values = [MEASURES[c.measure].shown(measure_value(changed, c)) for c in step.claims]
    if other.made:
        assert other.text == step.says.format(*values)
        assert all(v in other.text for v in values)
    else:
        assert other.text.startswith("This step's page does not show what it would say today")
        failing = [c for c in step.claims if not check_claim(changed, c)[0]]
        assert failing and all(claim_text(c) in other.text for c in failing)

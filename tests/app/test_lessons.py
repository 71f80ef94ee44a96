"""The Lessons page and the Overview's page guide: every step's link opens a real page with
settings it reads, names only built-in models, and (the walk) opens without an error, a refused
link value or an unknown token, and every claim its sentence makes holds on what that page
computed (``ui.lessons.Claim``, measured by ``ui.views.lessons``)."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from tests.app.test_hostile_links import page_param_names
from tests.app.test_pages import run
from ui import navigation
from ui.lessons import LESSONS, PAGE_GUIDE, Claim, step_link
from ui.views.lessons import MEASURES, check_claim, claim_text

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

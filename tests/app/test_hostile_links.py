"""Every link parameter of every page is hostile: generated values (markdown, HTML, control
characters, huge numbers, NaN, right-to-left text, very long strings) never raise and never
render markup; the known attacks of the hardening issue, each by name."""

from __future__ import annotations

import ast
import functools
import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.app.test_pages import PAGES, ROOT, run
from tests.hostile import markup_tags, notice_lines, rendered
from ui import lessons
from ui.state import GLOBAL_PARAMS, md_escape

#: tags that only user or link text could bring into a message: a page never renders them itself
FORBIDDEN = {"a", "img", "script", "iframe", "b", "i", "u", "em", "h1", "h2", "h3", "style", "svg"}
MARKDOWN_ELEMENTS = ("warning", "error", "info", "success", "caption", "markdown")

HOSTILE = st.one_of(
    st.sampled_from(
        [
            "[Sign in](https://example.org)",
            "![x](https://example.org/x.png)",
            "<img src=x onerror=alert(1)>",
            "<script>alert(1)</script>",
            "**bold** _em_ # heading",
            "https://example.org/phish",
            "&lt;b&gt;entity&lt;/b&gt;",
            "\u202eevil\u202c \u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",
            "\x00\x07\x1b[31m\r\n",
            "nan",
            "inf",
            "-inf",
            "1e309",
            "-1",
            "99999999999999999999999999",
            "0x1F",
            "",
            " ",
            "x" * 10_000,
            "[a](javascript:alert(1))" * 50,
            "norm",  # the value switch (``values``): valid, and near misses of it
            "NORM",
            "norm ",
            "norms",
            "weights\u200b",
        ]
    ),
    st.text(max_size=60),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)


def page_param_names(page: str) -> dict[str, tuple[str, ...]]:
    """The link parameters a page reads, the shared ones and its own ``PARAMS``: each key with
    the names it had in older links (``Param(..., old_keys=(...))``)."""
    names = {key: param.old_keys for key, param in GLOBAL_PARAMS.items()}
    tree = ast.parse((ROOT / page).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PARAMS" for t in node.targets
        ):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if key is None:  # ``**section.PARAMS``: a section module's own link keys
                    names |= _spread_params(tree, value)
                    continue
                old = [kw.value for kw in value.keywords if kw.arg == "old_keys"]
                names[key.value] = ast.literal_eval(old[0]) if old else ()
    return names


def _spread_params(tree: ast.Module, value: ast.expr) -> dict[str, tuple[str, ...]]:
    """The link keys of a ``**module.PARAMS`` in a page's ``PARAMS``: that module's (imported
    by the page as ``from package import module``), each with its old names."""
    assert isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name), ast.dump(value)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == value.value.id:
                    module = importlib.import_module(f"{node.module}.{alias.name}")
                    params = getattr(module, value.attr)
                    return {key: param.old_keys for key, param in params.items()}
    raise AssertionError(f"{value.value.id} is not imported by the page")


def own_link_keys(page: str) -> set[str]:
    """The link keys ``page`` reads beside the sidebar's (``GLOBAL_PARAMS``)."""
    return set(page_param_names(page)) - set(GLOBAL_PARAMS)


def page_params(page: str) -> list[str]:
    """Every name under which a link can hand a page a value: current keys and old ones."""
    return [name for key, old in page_param_names(page).items() for name in (key, *old)]


@functools.cache
def app_markdown() -> frozenset[str]:
    """Markdown the app writes itself, from constants and measured numbers (no link or user
    text in it): the Overview's numbered guide to the pages and the Lessons page's steps with
    their links, each sentence rendered from the numbers of the page it opens (measured once)."""
    from ui.views.lessons import step_text

    return frozenset(
        {
            lessons.guide_markdown(),
            *(lessons.steps_markdown(lesson, md_escape, step_text) for lesson in lessons.LESSONS),
        }
    )


def rendered_tags(at) -> set[str]:
    tags: set[str] = set()
    for kind in MARKDOWN_ELEMENTS:
        for element in at.get(kind):
            if str(element.value) not in app_markdown():
                tags.update(t.strip("/") for t in markup_tags(str(element.value)))
    return tags


def assert_link_value_ignored(at, key: str) -> None:
    """The page ran to its end, a notice says link parameter ``key`` was ignored, and no tag
    was rendered anywhere."""
    assert not at.exception, [e.value for e in at.exception]
    notices = [rendered(w.value)[0] for w in at.warning]
    assert any(n.startswith(f"Link parameter {key}=") and "ignored" in n for n in notices)
    assert not rendered_tags(at) & FORBIDDEN


def assert_same_texts_refused(at, expected: object, refusals: tuple[str, ...]) -> None:
    """A patching page given one hostile text as both clean and corrupted (``tests.hostile``'s
    ``CASES``): it ran to its end, named an empty text (``expected == "error"``) or refused any
    other with a message holding one of ``refusals``, every error said literally and no tag
    rendered anywhere."""
    assert not at.exception, [e.value for e in at.exception]
    shown = [rendered(e.value)[0] for e in at.error]
    if expected == "error":
        assert any("empty" in e for e in shown)
    else:
        assert any(r in e for e in shown for r in refusals), shown
    assert all(markup_tags(e.value) == [] for e in at.error)
    assert not rendered_tags(at) & FORBIDDEN


def test_page_params_are_found() -> None:
    assert "step" in page_params("pages/4_Inside_MHSA.py")
    assert "layer" in page_params("pages/1_Heads.py") and "text" in page_params(
        "pages/0_Overview.py"
    )
    assert "step" not in page_params("pages/1_Heads.py")
    inside = page_param_names("pages/4_Inside_MHSA.py")
    assert inside["pretrained_layer"] == ("mlayer",) and inside["step"] == ()
    assert {"ltoken", "line_token"} <= set(page_params("pages/8_Line_view.py"))  # old links too
    assert page_param_names("pages/0_Overview.py")["generate"] == ("gen",)
    for page in ("pages/1_Heads.py", "pages/3_Head_statistics.py", "pages/8_Line_view.py"):
        assert "values" in page_params(page)


@pytest.mark.parametrize("page", ["pages/1_Heads.py", "pages/8_Line_view.py"])
@pytest.mark.parametrize("value", ["NORM", "norms", "<b>norm</b>", "[norm](https://example.org)"])
def test_a_bad_values_switch_falls_back_to_the_weights(page: str, value: str) -> None:
    at = run(page, values=value)
    assert not at.exception and at.radio(key="values").value == "weights"
    notice = " ".join(rendered(w.value)[0] for w in at.warning)
    assert f"values={value!r} ignored" in notice
    assert not rendered_tags(at) & FORBIDDEN


@pytest.mark.parametrize("page", PAGES)
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,  # the same values in every CI run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
@pytest.mark.slow
def test_generated_link_values_never_raise_or_render_markup(page: str, data, tiny_bert) -> None:
    key = data.draw(st.sampled_from(page_params(page)), label="parameter")
    value = data.draw(HOSTILE, label="value")
    # on the tiny BERT (the default model's tokens): the links are tested, not the model; a
    # drawn ``model`` value replaces it (and falls back to the default with a notice)
    at = run(page, **{"model": tiny_bert, key: value})
    assert not at.exception, [e.value for e in at.exception]
    tags = rendered_tags(at)
    assert not tags & FORBIDDEN, (key, value, tags)


def test_markdown_link_in_a_parameter_shows_as_text() -> None:
    at = run("pages/1_Heads.py", layer="[Sign in](https://example.org)")
    assert not at.exception
    notice = at.warning[0].value
    assert "layer='[Sign in](https://example.org)' ignored" in rendered(notice)[0]
    assert markup_tags(notice) == []


def test_unknown_choice_of_another_exception_type_falls_back() -> None:
    """``source`` parses with a dict lookup (KeyError): the state layer catches every type."""
    at = run("pages/4_Inside_MHSA.py", source="x")
    assert not at.exception
    assert "source='x' ignored" in rendered(at.warning[0].value)[0]
    assert at.radio(key="source").value == "pretrained"


def test_another_pages_key_is_ignored_and_a_key_no_page_reads_is_named() -> None:
    at = run("pages/1_Heads.py", step="3")  # step belongs to another page: a link's path edited
    assert not at.exception and not at.warning
    # a key no page reads is named (issue 46: top=-5 on Circuits was ignored without a word),
    # its value never shown, its name literally
    at = run("pages/1_Heads.py", **{"<b>x</b>": "1", "bogus": "<b>x</b>"})
    assert not at.exception
    notices = notice_lines(at)
    assert "Link parameter '<b>x</b>' ignored: this page has no setting of that name." in notices
    assert "Link parameter 'bogus' ignored: this page has no setting of that name." in notices
    assert not rendered_tags(at) & FORBIDDEN


def test_numbers_are_clamped_to_what_the_result_allows() -> None:
    at = run("pages/2_Head_similarity.py", clusters="50")  # valid, more than the slider has
    assert not at.exception and at.slider(key="clusters").value == 24
    step = run("pages/4_Inside_MHSA.py", step="99")  # beyond the last step of any trace
    assert not step.exception
    # moved into the walk's own range, said with that range (issue 46: not "ignored" for a range
    # of 0 to 19 that no walk has)
    said = rendered(step.warning[0].value)[0]
    assert "step='99' is outside what this page can show here (0 to 13); showing 13." in said


ROLES_PAGE = "pages/10_Head_roles.py"
#: hostile values aimed at each link key of the Head roles page, beside the ones the generated
#: test draws for every key: each is refused by its parser and falls back with a notice
ROLE_LINKS = {
    "detector": ["induction<script>", "custom", "previous_token_head", "[x](https://e.org)"],
    "rule": ["k back ", "**same token**", "typed"],
    "rule_k": ["0", "65", "-1", "1e309", "nan", "0x1F", "99999999999999999999999999"],
    "error_measure": ["ABS", "<b>abs</b>", ""],
    "exclude_bos": ["2", "yes", "<img src=x onerror=alert(1)>"],
    "exclude_current": ["-1", "nan"],
    "random_tokens": ["on", "[x](javascript:alert(1))"],
    "role_head": ["L1", "H3", "L-1H2", "L99999H1", "l1h3", "<b>L1H3</b>", "L1H3,L2H4"],
    "rule_rows": ["1 " * 100_000],  # over the server's text limit
}


def test_every_roles_key_has_hostile_values() -> None:
    assert own_link_keys(ROLES_PAGE) == set(ROLE_LINKS)


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, vs in ROLE_LINKS.items() for v in vs])
def test_roles_link_values_fall_back_with_a_notice(key: str, value: str, tiny_bert) -> None:
    at = run(ROLES_PAGE, model=tiny_bert, **{key: value})  # 2 layers of 4 heads
    assert_link_value_ignored(at, key)
    assert at.session_state[key] == at.session_state["_mhsa_params"][key].default or (
        key == "role_head" and at.session_state[key] == "L1H3"  # the default: the last head
    )


@pytest.mark.parametrize(
    "rows", ["[Sign in](https://example.org)", "<img src=x onerror=alert(1)>", "1 **2**\n3"]
)
def test_typed_rows_from_a_link_are_shown_literally(rows: str) -> None:
    at = run(ROLES_PAGE, detector="custom rule", rule="typed rows", rule_rows=rows)
    assert not at.exception
    assert at.error and not rendered_tags(at) & FORBIDDEN
    assert all(markup_tags(e.value) == [] for e in at.error)
    assert at.text_area(key="rule_rows").value == rows


def test_the_notices_of_a_hostile_link_gather_in_one_box() -> None:
    """Five values refused: one warning counts them and a collapsed box lists each (one box a
    value stacked a dozen warnings over the figure); three or fewer share one box."""
    bad = {"layer": "x", "head": "y", "values": "z", "<b>k</b>": "1", "bogus": "2"}
    at = run("pages/1_Heads.py", **bad)
    assert not at.exception
    boxes = [rendered(w.value)[0] for w in at.warning]
    assert sum("values of the link or the settings fell back" in b for b in boxes) == 1
    listed = notice_lines(at)
    for key in ("layer='x'", "head='y'", "values='z'", "'<b>k</b>'", "'bogus'"):
        assert any(key in line for line in listed), (key, listed)
    few = run("pages/1_Heads.py", layer="x", head="y")
    notices = [w for w in few.warning if "ignored" in rendered(w.value)[0]]
    assert len(notices) == 1 and len(rendered(notices[0].value)[0].splitlines()) == 2
    assert not rendered_tags(at) & FORBIDDEN

"""Messages say what is true, in plain words: link values refused, the models the server
loads, the limit that cut a text, the Overview's own address."""

from __future__ import annotations

import pytest

from tests.app.test_pages import run
from tests.hostile import rendered
from ui import navigation
from ui.state import bounded_int, heads_list_param


@pytest.mark.parametrize("raw", ["abc", "1.5", "0x1F", "", " ", "--1", "1e3"])
def test_a_whole_number_is_refused_in_plain_words(raw: str) -> None:
    with pytest.raises(ValueError) as refused:
        bounded_int(0, 9)(raw)
    assert str(refused.value) == "is not a whole number"
    with pytest.raises(ValueError, match=r"^is not a whole number$"):
        heads_list_param(f"1,{raw.strip() or 'x'}")


def test_a_whole_number_out_of_range_says_the_range() -> None:
    assert bounded_int(0, 9)(" 7 ") == 7 and bounded_int(-1, 9)("-1") == -1
    with pytest.raises(ValueError, match=r"^must be between 0 and 9$"):
        bounded_int(0, 9)("10")


def test_patch_layer_abc_is_named_with_the_default_it_uses() -> None:
    at = run("pages/11_Patching.py", patch_layer="abc")
    assert not at.exception
    notices = " ".join(rendered(w.value)[0] for w in at.warning)
    assert (
        "Link parameter patch_layer='abc' ignored (is not a whole number); using the default (0)."
        in notices
    )
    assert "invalid literal" not in notices and "base 10" not in notices


def _warned(at) -> str:
    return " ".join(rendered(w.value)[0] for w in at.warning)


def test_a_position_beyond_the_model_is_moved_with_the_models_own_range() -> None:
    """toy:induction has 2 layers of 4 heads: ``layer=99`` moved to 1 and ``head=-3`` to 0,
    each said with that range (main: 99 silently became the last layer and -3 was refused
    as outside "0 and 1023")."""
    at = run("pages/1_Heads.py", model="toy:induction", layer="99", head="-3")
    assert not at.exception and not at.error
    said = _warned(at)
    assert "Link parameter layer='99' is outside what this page can show here (0 to 1); " in said
    assert "showing 1." in said
    assert "head='-3' is outside what this page can show here (0 to 3); showing 0." in said
    assert "1023" not in said
    assert (at.session_state["layer"], at.session_state["head"]) == (1, 0)
    at.run()  # the next run: the value is the page's own now, no second warning
    assert "outside" not in _warned(at)


def test_a_step_beyond_the_walk_names_its_steps() -> None:
    at = run("pages/4_Inside_MHSA.py", step="999")
    said = _warned(at)
    assert "step='999' is outside what this page can show here (0 to 13); showing 13." in said
    assert "19" not in said and at.session_state["step"] == 13


def test_a_reason_ends_once() -> None:
    said = _warned(run("pages/9_Train_heads.py", steps="-1"))
    assert "ignored (steps must be a whole number between 1 and 5000, got -1); using" in said
    assert ".)" not in said


def test_a_link_key_no_setting_reads_is_named() -> None:
    said = _warned(run("pages/13_Circuits.py", top="-5"))
    assert "Link parameter 'top' ignored: this page has no setting of that name." in said
    assert "circuit_n" not in said  # the page's own keys are not listed as unknown
    assert "ignored" not in _warned(run("pages/13_Circuits.py", circuit_n="5", embed="true"))


def test_a_refused_flag_and_choice_name_their_defaults() -> None:
    at = run("pages/1_Heads.py", words="maybe", view="sideways")
    notices = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "words='maybe' ignored (must be 0 or 1); using the default (off)." in notices
    assert "view='sideways' ignored (must be one of head, mean-heads, mean-layers); using the " in (
        notices
    )
    assert "using the default (head)." in notices


def test_a_cut_names_the_one_limit_that_made_it() -> None:
    """A toy model reads 64 tokens: 100 symbols are cut there, not at this server's 512."""
    symbols = " ".join(["ba", "be", "bi", "bo", "bu"] * 20)  # [BOS] + 100 tokens
    at = run("pages/1_Heads.py", model="toy:copy", text=symbols)
    said = " ".join(rendered(w.value)[0] for w in at.warning)
    assert (
        "The text was cut to 64 tokens, the most toy:copy reads: the last 37 tokens were dropped."
        in said
    )
    assert "512" not in said


def test_a_cut_at_the_servers_limit_says_so() -> None:
    at = run("pages/1_Heads.py", text=" ".join(["word"] * 600))  # [CLS] + 600 + [SEP]
    said = " ".join(rendered(w.value)[0] for w in at.warning)
    assert (
        "The text was cut to 512 tokens, this server's limit of 512 tokens: the last 90 tokens "
        "were dropped." in said
    )


def test_a_bad_model_in_a_link_falls_back_and_leaves_the_link() -> None:
    at = run("pages/1_Heads.py", model="nope/nope")
    assert not at.exception and not at.error
    said = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "model='nope/nope' ignored" in said and "it loads the default model" in said
    assert "toy:induction" in said and "model" not in at.query_params


def test_the_overview_has_an_address_of_its_own() -> None:
    """``/Overview?model=...`` opens the home page: besides the root, a hidden page at that
    address runs the Overview's file, and every address is unique (``st.navigation`` needs it)."""
    from ui.navigation import navigation_entries

    entries = [e for group in navigation_entries().values() for e in group]
    alias = [e for e in entries if e.url_path == "Overview"]
    assert len(alias) == 1 and alias[0].hidden and alias[0].file == "pages/0_Overview.py"
    home = [e for e in entries if e.default]
    assert len(home) == 1 and home[0].file == "pages/0_Overview.py" and not home[0].hidden
    paths = [e.url_path for e in entries]
    assert len(set(paths)) == len(paths) and "" not in paths
    assert sum(not e.hidden for e in entries) == len(navigation.PAGES)

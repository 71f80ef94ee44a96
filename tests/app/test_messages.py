"""Messages say what is true, in plain words: link values refused, the models the server
loads, the limit that cut a text, the Overview's own address."""

from __future__ import annotations

import pytest

from tests.app.test_pages import run
from tests.hostile import rendered
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


def test_a_refused_flag_and_choice_name_their_defaults() -> None:
    at = run("pages/1_Heads.py", words="maybe", view="sideways")
    notices = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "words='maybe' ignored (must be 0 or 1); using the default (off)." in notices
    assert "view='sideways' ignored (must be one of head, mean-heads, mean-layers); using the " in (
        notices
    )
    assert "using the default (head)." in notices

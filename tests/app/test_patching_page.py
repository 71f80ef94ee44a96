"""The Patching page through AppTest: its maps against the library, the toy induction example,
errors shown as messages, and its link values hostile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import mhsa
from tests.app.test_hostile_links import (
    FORBIDDEN,
    assert_link_value_ignored,
    assert_same_texts_refused,
    own_link_keys,
    rendered_tags,
)
from tests.app.test_importance_page import charts, decode
from tests.app.test_pages import run as run_page
from tests.hostile import CASES, markup_tags, rendered

ROOT = Path(__file__).resolve().parents[2]
PAGE = "pages/11_Patching.py"
TOY = ROOT / "data" / "toy" / "induction"
MAPS = "Effect of patching each head (1 = restores)"

pytestmark = pytest.mark.slow


def run(**query: str) -> AppTest:
    return run_page(PAGE, timeout=180, **query)


def maps(at: AppTest) -> dict[str, np.ndarray]:
    """The layers x heads effect of each panel of the maps, by panel title."""
    spec = charts(at)[MAPS]
    names = [a["text"] for a in spec["layout"]["annotations"]]
    return {n: decode(t["z"]).astype(float) for n, t in zip(names, spec["data"], strict=True)}


def errors(at: AppTest) -> list[str]:
    return [rendered(e.value)[0] for e in at.error]


def test_default_model_shows_exact_and_attribution_beside_each_other(minilm) -> None:
    at = run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    shown = maps(at)
    assert set(shown) == {"exact", "attribution"}
    assert not [b for b in at.button if b.label == "Cancel"]  # done: its Cancel button cleared
    exact = mhsa.causal.patch_heads(
        "The cat sat on the mat.", "The dog sat on the mat.", model=minilm
    )
    attribution = mhsa.causal.attribution_patching(
        "The cat sat on the mat.", "The dog sat on the mat.", model=minilm
    )
    np.testing.assert_allclose(shown["exact"], exact["effect"].to_numpy().reshape(6, 12), atol=1e-5)
    np.testing.assert_allclose(
        shown["attribution"], attribution["effect"].to_numpy().reshape(6, 12), atol=1e-5
    )
    r = float(np.corrcoef(exact["effect"], attribution["effect"])[0, 1])
    assert any(f"{r:.2f}" in c.value for c in at.caption)
    # r beside the largest disagreement, computed here from the library's tables
    gap = (exact["effect"] - attribution["effect"]).abs()
    worst = gap.idxmax()
    said = (
        f"The largest disagreement: {worst}, {exact.at[worst, 'effect']:.2f} exact against "
        f"{attribution.at[worst, 'effect']:.2f} estimated."
    )
    assert any(said in rendered(c.value)[0] for c in at.caption), [c.value for c in at.caption]
    # and first how the estimate ranks and sizes the heads that matter, counted here by hand
    size = exact["effect"].abs()
    top = [h for h in size.sort_values(ascending=False).index if size[h] >= 0.1 * size.max()][:5]
    theirs = set(attribution["effect"].abs().sort_values(ascending=False).index[: len(top)])
    same = {h for h in top if exact.at[h, "effect"] * attribution.at[h, "effect"] > 0}
    found = sum(h in theirs and h in same for h in top)
    opposite = [h for h in top if exact.at[h, "effect"] * attribution.at[h, "effect"] < 0]
    lead = f"attribution ranks {found} among its own top {len(top)} with the same sign: {top[0]} "
    assert any(lead in rendered(c.value)[0] for c in at.caption)
    title = next(t for t in charts(at) if t.startswith("Exact against attribution"))
    if len(top) == 1:  # MiniLM: only L5H11's effect is 10% of the largest or more
        first = "ranks first by both" if found else "is not attribution's first"
        signs = f"; opposite signs: {', '.join(opposite)}" if opposite else ""
        assert title == (
            f"Exact against attribution: the head that matters, {top[0]}, {first}{signs}"
        )
    else:
        ranked = f"{found} of the top {len(top)} heads ranked alike, with the same sign"
        signs = f"; opposite signs: {', '.join(opposite)}" if opposite else ""
        assert title == f"Exact against attribution: {ranked}{signs}"
    # the per-position view opens on the layer of the largest exact effect (MiniLM: not 0)
    strongest = int(exact["layer"][exact["effect"].abs().idxmax()])
    assert strongest != 0 and at.number_input(key="patch_layer").value == strongest
    # the table's columns in plain words
    table = at.dataframe[0].value
    assert "effect (exact: 1 restores the clean run)" in table.columns
    assert "effect, estimated by attribution" in table.columns
    assert not {"effect", "attribution", "effect_attribution"} & set(table.columns)
    positions = next(
        s for t, s in charts(at).items() if t.startswith(f"Layer {strongest}: each head")
    )
    assert decode(positions["data"][0]["z"]).shape == (12, 9)  # heads x the 9 tokens
    assert "cat → dog" in positions["layout"]["xaxis"]["ticktext"]


@pytest.mark.skipif(not TOY.is_dir(), reason="the toy induction model is not in this checkout")
def test_toy_example_patches_a_broken_repeat_and_the_link_carries_it() -> None:
    at = run()
    at.button[1].click().run()  # the toy induction example
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert at.session_state["model"] == "toy:induction"
    clean, corrupted = "ba ke mo di fu lo ba ke mo di", "ba ke mo ra fu lo ba ke mo di"
    library = mhsa.causal.patch_heads(
        clean, corrupted, model="toy:induction", answer="fu", wrong="lo"
    )
    shown = maps(at)
    np.testing.assert_allclose(
        shown["exact"], library["effect"].to_numpy().reshape(2, 4), atol=1e-5
    )
    assert np.abs(shown["exact"]).max() > 0.3  # some head restores much of the answer
    link = dict(at.query_params)
    assert link["corrupted"] == corrupted and link["answer"] == "fu"
    assert link["model"] == "toy:induction" and link["clean"] == clean
    # the same link opens the same maps
    again = run(**link)
    np.testing.assert_allclose(maps(again)["exact"], shown["exact"])


@pytest.mark.skipif(not TOY.is_dir(), reason="the toy induction model is not in this checkout")
def test_an_answer_of_two_tokens_is_named_and_the_page_goes_on() -> None:
    at = run(
        model="toy:induction",
        clean="ba ke mo di fu lo ba ke mo di",
        corrupted="ba ke mo ra fu lo ba ke mo di",
        answer="fu lo",
        wrong="lo",
    )
    assert not at.exception
    assert any("'fu lo' must be exactly one token" in e and "['fu', 'lo']" in e for e in errors(at))
    assert at.text_area(key="corrupted").value == "ba ke mo ra fu lo ba ke mo di"


@pytest.mark.parametrize(
    "corrupted",
    ["The dog sat on the big mat.", "<img src=x onerror=alert(1)> **b** [a](https://e.org)"],
)
def test_different_token_counts_are_named_literally_and_nothing_runs(corrupted: str) -> None:
    at = run(corrupted=corrupted)
    assert not at.exception and not at.error
    warning = next(rendered(w.value)[0] for w in at.warning if "position by position" in w.value)
    n = len(mhsa.engine.get_model("default").tokenizer(corrupted)["input_ids"])
    assert (
        "Clean: 9 tokens ['[CLS]', 'the', 'cat'" in warning and f"corrupted: {n} tokens" in warning
    )
    assert all(markup_tags(w.value) == [] for w in at.warning)
    assert not rendered_tags(at) & FORBIDDEN
    assert MAPS not in charts(at)  # nothing patched


#: hostile values aimed at each of the page's own link keys (the generated test of
#: test_hostile_links draws more for every key): each is refused and falls back with a notice
PATCH_LINKS = {
    "clean": ["x" * 100_001],
    "corrupted": ["x" * 100_001],
    "answer": ["a" * 101, "fu\nlo"],
    "wrong": ["b" * 101, "\r"],
    "patch_target": ["similarity ", "<b>embedding</b>", "lm-loss"],
    "pair": ["y" * 100_001],
    "patch_mode": ["fast", "BOTH", "[both](https://e.org)"],
    "patch_what": ["out", "Z", "hook_z", "<script>z</script>"],
    "patch_layer": ["1e309", "nan", "99999999999999999999", "0x1F"],  # -1: clamped, below
}


def test_every_patching_key_has_hostile_values() -> None:
    assert own_link_keys(PAGE) == set(PATCH_LINKS)


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, vs in PATCH_LINKS.items() for v in vs])
def test_patching_link_values_fall_back_with_a_notice(key: str, value: str) -> None:
    at = run(**{key: value})
    assert_link_value_ignored(at, key)
    assert at.session_state[key] == at.session_state["_mhsa_params"][key].default


def test_a_layer_beyond_the_model_is_clamped() -> None:
    at = run(patch_layer="40")  # valid for the link, beyond MiniLM's 6 layers
    assert not at.exception
    assert at.number_input(key="patch_layer").value == 5
    assert any(t.startswith("Layer 5: each head") for t in charts(at))
    # below the model's layers: moved to its first, the range said (issue 46)
    low = run(patch_layer="-1")
    assert low.number_input(key="patch_layer").value == 0
    said = " ".join(rendered(w.value)[0] for w in low.warning)
    assert "patch_layer='-1' is outside what this page can show here (0 to 5); showing 0." in said


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hostile_texts_on_both_sides_are_refused_or_shown_literally(
    name: str, text: str, expected: object
) -> None:
    """The same hostile text as clean and corrupted: an empty one is named, any other gives
    the same metric on both sides (nothing to restore), said literally."""
    at = run(clean=text, corrupted=text)
    assert_same_texts_refused(at, expected, ("same metric",))


def test_a_toy_model_opens_on_its_own_pair_and_unknown_tokens_are_counted() -> None:
    """toy:induction read the page's English default pair as [UNK]s, silently: it now opens on
    its own example pair (a repeat, and the repeat broken), and a text it cannot read is
    counted under its box."""
    from mhsa.examples import unknown_tokens

    at = run(model="toy:induction")
    assert not at.exception
    for key in ("clean", "corrupted"):
        text = at.text_area(key=key).value
        assert unknown_tokens(text, model="toy:induction").unknown == 0, text
    assert at.text_area(key="clean").value != at.text_area(key="corrupted").value
    assert not any("unknown" in rendered(i.value)[0] for i in [*at.info, *at.warning])
    english = run(model="toy:induction", clean="A dog ran home.")
    said = [rendered(w.value)[0] for w in [*english.warning, *english.info]]
    unknown = unknown_tokens("A dog ran home.", model="toy:induction")
    assert unknown.unknown > 0
    assert any(
        s.startswith(f"The clean text: {unknown.unknown} of its {unknown.total} tokens are unknown")
        for s in said
    ), said
    assert english.text_area(key="clean").value == "A dog ran home."  # the user's text kept

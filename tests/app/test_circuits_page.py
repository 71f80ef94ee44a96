"""The Circuits page through AppTest: its figures against the library on the toy induction
example and the MiniLM example (the embedding target), a clicked edge path-patched, the refusal
on an encoder-decoder, n clamped, and its link values hostile."""

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
from tests.hostile import CASES, rendered
from ui.views.circuits import CIRCUIT_EXAMPLES, EDGES_SHOWN

ROOT = Path(__file__).resolve().parents[2]
PAGE = "pages/13_Circuits.py"
TOY = next(iter(CIRCUIT_EXAMPLES.values()))
KW = {"model": "toy:induction", "answer": TOY["answer"], "wrong": TOY["wrong"]}
#: link values each key must refuse (with a notice), not act on
CIRCUIT_LINKS = {
    "clean": ["x" * 100_001],
    "corrupted": ["x" * 100_001],
    "answer": ["a\nb", "x" * 101],
    "wrong": ["\r"],
    "circuit_method": ["acdc", "EAP", "<b>eap</b>", "[eap](https://e.org)"],
    "circuit_steps": ["0", "51", "2.5", "nan"],
    "circuit_n": ["0", "-3", "1e3", "99999999999999999999"],
    "circuit_target": ["lm-loss", "<b>embedding</b>", "[similarity](https://e.org)"],
    "pair": ["x" * 100_001],
}
MINILM = CIRCUIT_EXAMPLES["MiniLM (the embedding target)"]

pytestmark = pytest.mark.slow


def run(**query: str) -> AppTest:
    return run_page(PAGE, timeout=180, **query)


def toy(**more: str) -> AppTest:
    link = {k: str(v) for k, v in TOY.items() if k != "engine"}
    return run(**{**link, **more})


def test_an_encoder_decoder_is_refused_naming_the_tools_and_the_examples_are_offered() -> None:
    at = run(model="toy:reverse-seq2seq")
    assert not at.exception and not at.error
    info = " ".join(rendered(i.value)[0] for i in at.info)
    assert "Circuits" in info and "Patching" in info and "examples" in info
    assert "BERT-family encoders" in info
    assert [b.label for b in at.button][: len(CIRCUIT_EXAMPLES)] == list(CIRCUIT_EXAMPLES)
    assert not charts(at)


def test_minilm_example_draws_the_librarys_top_edges_for_the_embedding_target(minilm) -> None:
    at = run(model="toy:induction")
    at.button[list(CIRCUIT_EXAMPLES).index("MiniLM (the embedding target)")].click().run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert at.session_state["model"] == "default"
    assert at.radio(key="circuit_target").value == "embedding"
    assert "answer" not in {t.key for t in at.text_input}  # no logit difference on an encoder
    scores = mhsa.circuits.edge_attribution(
        MINILM["clean"], MINILM["corrupted"], model=minilm, method="eap-ig", steps=5
    )
    shown = charts(at)
    graph = next(s for t, s in shown.items() if t.startswith("Circuit: the top 20 edges"))
    mids = next(d for d in graph["data"] if d.get("name") == "edges")
    drawn = {tuple(c[1:]) for c in mids["customdata"]}
    assert graph["layout"]["yaxis"]["ticktext"][-1] == "last hidden state"  # no logits here
    top = mhsa.circuits.top_edges(scores, 20)
    assert drawn == set(top[["source", "target", "input"]].itertuples(index=False, name=None))
    caption = next(t for t in (rendered(c.value)[0] for c in at.caption) if "Metric:" in t)
    assert "cosine similarity of the run's sentence embedding to the clean run's" in caption
    assert f"corrupted run {scores.attrs['corrupted']:.4g}" in caption
    assert any(t.startswith("Faithfulness of the top-n") for t in shown)
    # 7,588 edges: the browser gets the first EDGES_SHOWN of them, largest |score| first
    (frame,) = at.dataframe
    assert len(frame.value) == EDGES_SHOWN < len(scores)
    order = scores["score"].abs().sort_values(ascending=False, kind="stable")
    np.testing.assert_allclose(frame.value["score"].abs(), order.to_numpy()[:EDGES_SHOWN])
    assert any(f"The first {EDGES_SHOWN} of {len(scores):,} rows" in c.value for c in at.caption)
    # a clicked edge is path-patched on the embedding target
    edge = tuple(top[["source", "target", "input"]].iloc[0])
    at.session_state["_circuit_edge"] = edge
    at.run()
    assert not at.exception and not at.error
    patched = mhsa.circuits.path_patch(MINILM["clean"], MINILM["corrupted"], *edge, model=minilm)
    message = next(rendered(s.value)[0] for s in at.success)
    assert f"an exact score of {patched.score:.4g}" in message


def test_eap_on_the_embedding_target_is_explained_and_similarity_asks_a_sentence(minilm) -> None:
    at = run(circuit_method="eap")
    assert not at.exception and not at.error
    assert any("gradient is zero" in rendered(i.value)[0] for i in at.info)
    assert not charts(at)
    at.radio(key="circuit_target").set_value("similarity").run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert at.text_input(key="pair").value == "A cat was sitting on the rug."
    caption = next(t for t in (rendered(c.value)[0] for c in at.caption) if "Metric:" in t)
    assert "that of the second sentence" in caption and "by eap" in caption


def test_toy_example_draws_the_librarys_top_edges_and_curve() -> None:
    at = run()
    at.button[0].click().run()  # the toy induction example
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert at.session_state["model"] == "toy:induction"
    scores = mhsa.circuits.edge_attribution(TOY["clean"], TOY["corrupted"], method="eap-ig", **KW)
    top = mhsa.circuits.top_edges(scores, 20)
    shown = charts(at)
    graph = next(s for t, s in shown.items() if t.startswith("Circuit: the top 20 edges"))
    mids = next(d for d in graph["data"] if d.get("name") == "edges")
    drawn = {tuple(c[1:]) for c in mids["customdata"]}
    assert drawn == set(top[["source", "target", "input"]].itertuples(index=False, name=None))
    curve = mhsa.circuits.faithfulness_curve(
        TOY["clean"], TOY["corrupted"], scores, extra=(20,), **KW
    )
    plotted = next(s for t, s in shown.items() if t.startswith("Faithfulness of the top-n"))
    line = next(d for d in plotted["data"] if d.get("name") == "MIB sizes")
    mib = curve.points[curve.points["mib"]]["faithfulness"]
    np.testing.assert_allclose(decode(line["y"]).astype(float), mib, atol=1e-5)
    f20 = float(curve.points["faithfulness"].iloc[-1])
    assert any(f"keep f = {f20:.3f}" in rendered(c.value)[0] for c in at.caption)
    roles = next(c.value for c in at.caption if c.value.startswith("Head roles names"))
    assert "L0H3 the previous-token head" in roles and "L1H3 the induction head" in roles
    rank = next(c.value for c in at.caption if c.value.startswith("Head roles names"))
    assert "L0H3 → L1H3 (k) ranks" in rank
    # the rank said with its whole: of how many edges, by what (mhsa.analysis.claims)
    every = scores.assign(size=scores["score"].abs()).sort_values(
        "size", ascending=False, kind="stable"
    )
    key = list(every[["source", "target", "input"]].itertuples(index=False, name=None))
    place = key.index(("L0H3", "L1H3", "k")) + 1
    ordinal = mhsa.analysis.claims.ordinal(place)
    assert f"ranks {ordinal} of {len(every)} edges by |score|." in rank, rank


def test_a_clicked_edge_is_path_patched_as_the_library_does() -> None:
    at = toy()
    at.session_state["_circuit_edge"] = ("L0H3", "L1H3", "k")  # what a click leaves
    at.run()
    assert not at.exception and not at.error
    patched = mhsa.circuits.path_patch(TOY["clean"], TOY["corrupted"], "L0H3", "L1H3", "k", **KW)
    message = next(rendered(s.value)[0] for s in at.success)
    assert f"an exact score of {patched.score:.4g}" in message
    assert "L0H3 → L1H3 (k)" in message


def test_n_beyond_the_edges_is_clamped_with_a_notice() -> None:
    at = toy(circuit_n="100000")
    assert not at.exception and not at.error
    assert any("Top n was 100000" in rendered(i.value)[0] for i in at.info)
    assert at.slider(key="circuit_n").value == 110


def test_different_token_counts_are_named_and_nothing_runs() -> None:
    at = toy(corrupted="ba ke mo di ra lo ni pa su te ba ke mo di fu lo")
    assert not at.exception and not at.error
    warning = next(rendered(w.value)[0] for w in at.warning if "position by position" in w.value)
    assert "Clean: 16 tokens" in warning and "corrupted: 17 tokens" in warning
    assert not charts(at)


def test_every_circuits_key_has_hostile_values() -> None:
    assert own_link_keys(PAGE) == set(CIRCUIT_LINKS)


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, vs in CIRCUIT_LINKS.items() for v in vs])
def test_circuits_link_values_fall_back_with_a_notice(key: str, value: str) -> None:
    at = toy(**{key: value})
    assert_link_value_ignored(at, key)


def test_a_markup_second_sentence_from_a_link_is_used_as_text_and_renders_no_tag(tiny_bert):
    """The similarity target's second sentence is text, not markup: a link's payload is kept
    literally in its box, the circuit is scored against it, and no tag renders anywhere."""
    payload = "<b>A</b> [cat](https://e.org) **sat** <script>x</script>"
    at = run(
        model=tiny_bert,
        clean="The cat sat on the mat.",
        corrupted="The dog sat on the mat.",
        circuit_target="similarity",
        circuit_method="eap",
        pair=payload,
    )
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    assert at.text_input(key="pair").value == payload
    assert any(t.startswith("Circuit: the top") for t in charts(at))
    assert not rendered_tags(at) & FORBIDDEN


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hostile_texts_on_both_sides_are_refused_or_shown_literally(
    name: str, text: str, expected: object
) -> None:
    """The same hostile text as clean and corrupted on the toy model: an empty one is named,
    any other is refused (the same metric on both sides, or too long), said literally."""
    at = toy(clean=text, corrupted=text)
    assert_same_texts_refused(at, expected, ("same metric", "tokens long"))
    assert not charts(at)


def test_a_toy_model_opens_on_its_own_pair() -> None:
    """On toy:induction the page's English defaults were [UNK]s: it opens on the toy's own
    example pair, every token known."""
    from mhsa.examples import unknown_tokens

    at = run(model="toy:induction")
    assert not at.exception
    for key in ("clean", "corrupted"):
        text = at.text_area(key=key).value
        assert unknown_tokens(text, model="toy:induction").unknown == 0, text

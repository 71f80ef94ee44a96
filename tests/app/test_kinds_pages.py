"""An encoder-decoder's encoder, decoder and cross attention on every page that draws
attention (a tiny random BART; AppTest): the figures' shapes and token axes per kind, links
with the kind, hostile kinds, the generated target, file names."""

from __future__ import annotations

import numpy as np
import pytest

import mhsa
from tests.app.test_pages import CAT_TOKENS, PAGES, run, specs, ticktext
from tests.hostile import rendered
from ui.state import heads_param

pytestmark = pytest.mark.slow

TEXT = "The cat sat on the mat."  # the sidebar's default sentence: CAT_TOKENS
TARGET = "le chat"
#: the teacher-forced decoder input: the start token [PAD], then the WordPiece tokenizer's ids
#: of the target shifted right ([CLS] le chat; [SEP] is only a label), hard-coded
DECODER_TOKENS = ["[PAD]", "[CLS]", "le", "chat"]
#: (queries, keys) of each kind for the sidebar's sentence and TARGET
AXES = {
    "encoder": (CAT_TOKENS, CAT_TOKENS),
    "decoder": (DECODER_TOKENS, DECODER_TOKENS),
    "cross": (DECODER_TOKENS, CAT_TOKENS),
}


@pytest.fixture
def bart(tiny_bart_path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MHSA_ALLOWED_MODELS", tiny_bart_path)
    return tiny_bart_path


def _open(page: str, model: str, **link: str):
    at = run(page, model=model, target_text=TARGET, **link)
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    return at


def _titled(at, start: str) -> dict:
    # a wrapped title reads as one line (" <br>" between its lines)
    return next(
        s for s in specs(at) if s["layout"]["title"]["text"].replace(" <br>", " ").startswith(start)
    )


@pytest.mark.parametrize("kind", list(AXES))
def test_heads_page_draws_each_kind_with_its_tokens(bart: str, kind: str) -> None:
    at = _open("pages/1_Heads.py", bart, kind=kind)
    queries, keys = AXES[kind]
    spec = _titled(at, "Layer 0, head 0")
    z = _z(spec)
    assert z.shape == (len(queries), len(keys))
    assert ticktext(spec, "yaxis") == queries and ticktext(spec, "xaxis") == keys
    focus = _titled(at, "Where")
    assert _z(focus).shape == (8, len(keys)) and ticktext(focus) == keys  # 8 heads
    assert at.session_state["kind"] == kind
    assert dict(at.query_params).get("kind", "encoder") == kind
    letter = {"encoder": "E", "decoder": "D", "cross": "C"}[kind]  # the knock-out's labels
    assert at.multiselect(key="off").options == [
        f"{letter}{li}H{h}" for li in (0, 1) for h in range(4)
    ]
    if kind != "encoder":
        assert at.session_state["_mhsa_file_stem"].endswith(f"-{kind}")
        assert [o for o in at.selectbox(key="token").options] == [
            f"{i}: {t}" for i, t in enumerate(queries)
        ]


def _decoded(values: object) -> np.ndarray:
    """A plotly array from its JSON spec (base64-encoded typed array, or a list)."""
    import base64

    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values, dtype=float)


def _z(spec: dict) -> np.ndarray:
    """A heatmap's values from its JSON spec (plotly writes float32 arrays base64-encoded)."""
    import base64

    z = spec["data"][0]["z"]
    if isinstance(z, dict):  # {"dtype": "f4", "bdata": ..., "shape": "m, n"}
        shape = tuple(int(x) for x in str(z["shape"]).split(","))
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.asarray(z, dtype=float)


@pytest.mark.parametrize("kind", ["decoder", "cross"])
def test_line_view_puts_queries_left_and_keys_right(bart: str, kind: str) -> None:
    at = _open("pages/8_Line_view.py", bart, kind=kind)
    queries, keys = AXES[kind]
    spec = specs(at)[0]
    left, right = spec["data"][0], spec["data"][1]
    assert left["text"] == queries and right["text"] == keys
    assert f"{kind} attention" in spec["layout"]["title"]["text"]
    assert [o for o in at.selectbox(key="line_token").options][1:] == [
        f"#{i} {t}" for i, t in enumerate(queries)
    ]


def test_compare_draws_both_sentences_cross(bart: str) -> None:
    at = _open("pages/6_Compare.py", bart, kind="cross", text2="A dog.")
    first, second = specs(at)[:2]
    assert _z(first).shape == (4, 9) and ticktext(first) == CAT_TOKENS
    assert _z(second).shape == (4, 5) and ticktext(second) == ["[CLS]", "a", "dog", ".", "[SEP]"]
    assert ticktext(first, "yaxis") == ticktext(second, "yaxis") == DECODER_TOKENS


@pytest.mark.parametrize("kind", list(AXES))
def test_statistics_and_similarity_are_per_kind(bart: str, kind: str) -> None:
    result = mhsa.attend(TEXT, text_pair=TARGET, model=bart, device="cpu").of_kind(kind)
    a = result.attention.astype(np.float64)
    at = _open("pages/3_Head_statistics.py", bart, kind=kind)
    table = at.dataframe[0].value
    n = a.shape[-1]
    p = 0.9999 * a + 0.0001 / n  # the documented smoothing, computed here
    entropy = (-(p * np.log(p)).sum(-1)).mean(-1).reshape(-1)
    np.testing.assert_allclose(table["entropy"].to_numpy(), entropy, rtol=1e-5)
    assert table["mean_distance"].isna().all() == (kind == "cross")
    # the detectors score self-attention on its own tokens (the decoder's: the target's)
    assert table["previous token"].isna().all() == (kind == "cross")
    if kind == "decoder":
        previous = mhsa.analysis.roles.detection_scores(result.attention, np.eye(4, k=-1)).reshape(
            -1
        )
        np.testing.assert_allclose(table["previous token"].to_numpy(), previous, rtol=1e-5)
    at = _open("pages/2_Head_similarity.py", bart, kind=kind, metric="cosine")
    flat = a.reshape(8, -1)
    unit = flat / np.linalg.norm(flat, axis=1, keepdims=True)
    shown = np.sort(_z(specs(at)[0]).ravel())
    np.testing.assert_allclose(shown, np.sort((unit @ unit.T).ravel()), atol=1e-5)


def test_choosing_the_kind_in_the_sidebar_puts_it_in_the_link(bart: str) -> None:
    at = _open("pages/1_Heads.py", bart)
    assert _z(_titled(at, "Layer 0, head 0")).shape == (9, 9)
    at.sidebar.radio(key="kind").set_value("cross").run()
    assert not at.exception and not at.error
    assert _z(_titled(at, "Layer 0, head 0")).shape == (4, 9)
    assert dict(at.query_params)["kind"] == "cross"


@pytest.mark.parametrize("value", ["sideways", "CROSS", "<b>x</b>", "cross "])
def test_hostile_kinds_fall_back_to_the_encoder_with_a_notice(bart: str, value: str) -> None:
    at = _open("pages/1_Heads.py", bart, kind=value)
    notices = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "Link parameter kind" in notices and "using the default" in notices
    assert at.session_state["kind"] == "encoder"
    assert _z(_titled(at, "Layer 0, head 0")).shape == (9, 9)


def test_a_kind_on_an_encoder_is_ignored() -> None:
    at = run("pages/1_Heads.py", kind="cross")
    assert not at.exception and not at.error
    spec = _titled(at, "Layer 0, head 0")
    assert _z(spec).shape == (9, 9) and ticktext(spec, "yaxis") == CAT_TOKENS
    assert not any(r.label == "Attention" for r in at.sidebar.radio)


def test_rollout_says_it_is_the_encoders(bart: str) -> None:
    at = _open("pages/5_Rollout.py", bart, kind="cross")
    assert "shows the encoder's attention" in " ".join(c.value for c in at.caption)
    assert _z(specs(at)[0]).shape == (9, 9)


def test_the_generated_target_is_the_decoders_own_ids(bart: str) -> None:
    at = run("pages/1_Heads.py", model=bart, kind="cross", generate="2")
    assert not at.exception and not at.error
    generation = mhsa.engine.generate_ids(TEXT, model=bart, device="cpu", max_new_tokens=2)
    spec = _titled(at, "Layer 0, head 0")
    rows = ticktext(spec, "yaxis")
    assert rows[0] == "[PAD]"  # the decoder start token the fixture's config names
    assert len(rows) == len(generation.decoder_ids) and ticktext(spec) == CAT_TOKENS
    assert not any(t.label.startswith("Target") for t in at.sidebar.text_area)


@pytest.mark.parametrize("encoder_decoder", [False, True])
def test_inside_mhsa_teaches_cross_attention_with_its_shapes(
    bart: str, encoder_decoder: bool
) -> None:
    link = {"model": bart} if encoder_decoder else {}
    at = run("pages/4_Inside_MHSA.py", cross="1", step="11", target_text=TARGET, **link)
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    spec = specs(at)[0]
    assert spec["layout"]["title"]["text"].startswith("probabilities [1, 4, 4, 9]")
    assert _z(spec).shape == (4, 9)
    # an encoder-decoder's decoder reads its teacher-forced input; another model's "decoder"
    # is the target tokenized on its own
    rows = DECODER_TOKENS if encoder_decoder else ["[CLS]", "le", "chat", "[SEP]"]
    assert ticktext(spec, "yaxis") == rows and ticktext(spec) == CAT_TOKENS
    captions = " ".join(c.value for c in at.caption)
    assert "scores and weights are [4, 9]" in captions
    assert ("encoder's output" in captions) == encoder_decoder  # which weights and states
    assert ("decoder layer 0" in captions) == encoder_decoder  # the model's own cross block
    if encoder_decoder:  # its own weights: the neuron view of a decoder token over the keys
        neuron = specs(at)[1]
        title = neuron["layout"]["title"]["text"]
        assert title.startswith("Neuron view: head 0, query '[PAD]'")  # the start token
        assert ticktext(neuron, "yaxis6") == CAT_TOKENS  # the keys: row 2, column 1
    at.button[1].click().run()  # Next: the per-head context, a decoder row per token
    assert ticktext(specs(at)[0], "yaxis") == rows


def _metrics(at) -> dict[str, float]:
    return {m.label: float(m.value) for m in at.metric}


def test_knocking_out_a_cross_head_matches_ablate(bart: str) -> None:
    at = _open("pages/1_Heads.py", bart, kind="cross", off="C0H1", layer="1", head="2")
    expected = mhsa.ablate(TEXT, ["C0H1"], model=bart, text_pair=TARGET)
    assert expected.target == "lm-loss" and expected.change != 0
    metrics = _metrics(at)
    assert metrics["Output change"] == pytest.approx(expected.change, rel=1e-3)
    assert metrics["lm-loss intact"] == pytest.approx(expected.intact_value, rel=1e-3)
    assert metrics["lm-loss after"] == pytest.approx(expected.ablated_value, rel=1e-3)
    intact, ablated = expected.intact.cross_attention, expected.ablated.cross_attention
    bars = _titled(at, "How much each layer's attention moved, cross attention")
    moved = np.abs(ablated - intact).max(axis=(1, 2, 3))
    np.testing.assert_allclose(_decoded(bars["data"][0]["y"]), moved, atol=1e-6)
    assert moved[0] == 0 and moved[1] > 1e-6  # the gate acts after layer 0's softmax
    before = _titled(at, "Layer 1, head 2, cross attention")
    after = _titled(at, "Layer 1, head 2, cross attention, after the knock-out")
    assert _z(before).shape == _z(after).shape == (4, 9)  # decoder rows x encoder columns
    np.testing.assert_allclose(_z(after), ablated[1, 2], atol=1e-6)
    assert not np.allclose(_z(before), _z(after))
    next(b for b in at.button if b.label == "Switch C1H2 off").click().run()
    assert at.multiselect(key="off").value == ["C0H1", "C1H2"]
    assert at.query_params["off"] in ("C0H1,C1H2", ["C0H1,C1H2"])


def test_knock_outs_of_the_generated_target_and_of_other_kinds(bart: str) -> None:
    at = run("pages/1_Heads.py", model=bart, kind="decoder", generate="2", off="E1H0,D1H3")
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    generation = mhsa.engine.generate_ids(TEXT, model=bart, device="cpu", max_new_tokens=2)
    expected = mhsa.ablate(generation, ["E1H0", "D1H3"], model=bart)
    assert _metrics(at)["Output change"] == pytest.approx(expected.change, rel=1e-3)
    off = at.multiselect(key="off")
    assert off.value == ["E1H0", "D1H3"] and "E1H0" in off.options and "E0H0" not in off.options


@pytest.mark.parametrize("raw", ["C0H1,<b>x</b>", "C0H1,X0H1", "C9H0", "L0H1"])
def test_bad_or_foreign_encoder_decoder_heads_fall_back(bart: str, raw: str) -> None:
    at = _open("pages/1_Heads.py", bart, kind="cross", off=raw)
    notices = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "ignored" in notices or "does not have" in notices
    assert at.multiselect(key="off").value == [] and not at.metric


def test_the_off_link_key_reads_every_kind_of_head_label_and_nothing_else() -> None:
    assert heads_param("C1H0, E0H3,L2H1,D0H0,C0H2,E0H3") == ["L2H1", "E0H3", "D0H0", "C0H2", "C1H0"]
    for raw in ["C0H1,<b>x</b>", "X0H1", "C0H1;", "CC0H1", "C12345H0", "c0h1", "C0H1\x00"]:
        with pytest.raises(ValueError, match="E, D or C"):
            heads_param(raw)


@pytest.mark.parametrize("method", ["ablation", "gradient"])
def test_importance_of_an_encoder_decoder_names_each_attentions_heads(
    bart: str, method: str
) -> None:
    at = _open("pages/7_Head_importance.py", bart, kind="cross", method=method)
    pair = [(TEXT, TARGET)]  # the decoder's loss of the sidebar's target given the sentence
    expected = mhsa.causal.head_importance(pair, model=bart, method=method)
    assert expected.attrs["target"] == "lm-loss"
    grid = _titled(at, "Importance of each head")
    rows = ["E0", "E1", "D0", "D1", "C0", "C1"]
    assert ticktext(grid, "yaxis") == rows
    np.testing.assert_allclose(
        _z(grid), expected["importance"].to_numpy().reshape(6, 4), rtol=1e-4, atol=1e-7
    )
    curve = mhsa.causal.pruning_curve(pair, model=bart, importance=expected)
    shown = _titled(at, "Pruning curve")
    for trace, (_, rows_of_order) in zip(
        shown["data"], curve.groupby("order", sort=False), strict=True
    ):
        np.testing.assert_allclose(_decoded(trace["y"]), rows_of_order["metric"], rtol=1e-4)
    assert "E = encoder" in " ".join(c.value for c in at.caption)


def test_clicking_an_importance_head_opens_it_with_its_attention(bart: str) -> None:
    from streamlit.testing.v1 import AppTest

    from tests.app.test_pages import ROOT

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params.update(model=bart, target_text=TARGET)
    at.run().switch_page("pages/7_Head_importance.py").run()
    for block, kind, layer in [(5, "cross", 1), (1, "encoder", 1), (2, "decoder", 0)]:
        at.session_state["_open_head"] = (block, 3)  # what a click on the map stores
        at.run()
        assert not at.exception and [t.value for t in at.title] == ["Heads"]
        assert (at.session_state["kind"], at.session_state["layer"]) == (kind, layer)
        assert _titled(at, f"Layer {layer}, head 3").get("data")
        at.switch_page("pages/7_Head_importance.py").run()


def test_overview_shows_the_decoders_tokens_and_every_attentions_agreement(bart: str) -> None:
    at = _open("pages/0_Overview.py", bart, engine="mhsa")
    encoder, decoder, agreement = (frame.value for frame in at.dataframe)
    assert list(encoder.loc["token"]) == CAT_TOKENS
    assert list(decoder.loc["token"]) == DECODER_TOKENS
    assert list(decoder.loc["special"]) == ["True", "True", "False", "False"]
    compared = list(agreement["compared"])
    assert [c for c in compared if c.startswith("cross layer")] == [
        "cross layer 0 attention weights",
        "cross layer 1 attention weights",
    ]
    assert len(compared) == 3 * 2 + 2 and (agreement["max |ours - model|"] < 1e-4).all()


def test_head_roles_detect_on_the_decoders_own_tokens(bart: str) -> None:
    at = _open("pages/10_Head_roles.py", bart, kind="decoder", detector="previous token")
    pattern = _titled(at, "Detection pattern: previous token")
    shown = ticktext(pattern)  # the decoder's tokens, thinned to a column's room
    assert shown[0] == DECODER_TOKENS[0] and shown[-1] == DECODER_TOKENS[-1]
    assert all(t in DECODER_TOKENS for t in shown)
    np.testing.assert_array_equal(_z(pattern), np.eye(4, k=-1))
    result = mhsa.attend(TEXT, text_pair=TARGET, model=bart).of_kind("decoder")
    maps = _titled(at, "Detection scores")
    scores = mhsa.analysis.roles.detection_scores(result.attention, np.eye(4, k=-1))  # TL's "mul"
    np.testing.assert_allclose(_z({"data": [maps["data"][0]]}), scores, rtol=1e-5)
    assert not any(b.label.startswith("Repeat random tokens") for b in at.button)
    assert any("Composition reads one residual stream" in i.value for i in at.info)


def test_head_roles_of_cross_attention_say_why_there_are_none(bart: str) -> None:
    at = _open("pages/10_Head_roles.py", bart, kind="cross")
    assert not specs(at)
    assert "Cross attention relates two sequences" in " ".join(i.value for i in at.info)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_opens_an_encoder_decoder_on_cross_attention(bart: str, page: str) -> None:
    at = run(page, model=bart, kind="cross", target_text=TARGET)
    assert not at.exception, [e.value for e in at.exception]
    errors = [rendered(e.value)[0] for e in at.error]
    if page == "pages/12_Information_flow.py":  # a residual stream of one causal LM
        assert errors and all("is an encoder-decoder" in e for e in errors)
    else:
        assert not errors, errors
    assert at.session_state["kind"] == "cross"

"""The Train heads page through AppTest: its settings are TrainConfig's, a short training draws
curves, a mosaic and head scores whose values are the trainer's snapshots, the trained model opens
by name on every page (its attention there is the last snapshot's), Cancel keeps what was
trained, a waiting run shows its place, hostile link values fall back with a notice, and
``toy:`` / ``trained:`` links open or fall back."""

from __future__ import annotations

import time

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

import mhsa
from mhsa.corpus.jobs import JobState
from mhsa.engine.models.trained import trained_store
from mhsa.training import RECIPES, TrainConfig
from tests.app.test_importance_page import charts, decode
from tests.app.test_pages import ROOT
from tests.hostile import rendered

PAGE = str(ROOT / "pages/9_Train_heads.py")
RUN = "_mhsa_training"
#: a run of a few seconds: 30 steps of a tiny two-layer model
SHORT = {"layers": "2", "heads": "2", "width": "16", "steps": "30", "train_seed": "3"}


def open_page(**query: str) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def open_in_app(**settings: object) -> AppTest:
    """The whole app (its navigation: "Explore this model" opens another page), on Train heads
    with these widget settings."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    at.switch_page("pages/9_Train_heads.py").run()
    for key, value in settings.items():
        widget = {"task": at.selectbox}.get(key, at.number_input)
        widget(key=key).set_value(value)
    return at.run()


def chart(at: AppTest, start: str) -> dict:
    found = [s for t, s in charts(at).items() if t.startswith(start)]
    assert len(found) == 1, list(charts(at))
    return found[0]


def button(at: AppTest, label: str):
    return next(b for b in at.button if b.label.startswith(label))


def train_until_done(at: AppTest, timeout: float = 120) -> object:
    """Click Train, let the page poll (as its fragment does every second) until the run ends."""
    button(at, "Train").click().run()
    assert not at.exception, [e.value for e in at.exception]
    run = at.session_state[RUN]
    assert run.job.wait(timeout), run.job
    at.run()
    return run


@pytest.fixture(autouse=True)
def _empty_store():
    yield
    trained_store().clear()


def test_the_settings_are_the_trainers_and_a_link_sets_them() -> None:
    at = open_page()
    assert not at.exception and not at.error, [e.value for e in at.error]
    default = TrainConfig()
    assert at.selectbox(key="task").value == default.task
    assert at.radio(key="family").value == default.family
    for key, field in [("layers", "layers"), ("heads", "heads"), ("width", "width")]:
        assert at.number_input(key=key).value == getattr(default, field)
    assert at.number_input(key="steps").value == default.steps
    assert at.number_input(key="lr").value == pytest.approx(default.lr)
    assert at.number_input(key="train_seed").value == default.seed
    assert at.toggle(key="mlp").value is default.mlp
    assert not at.get("plotly_chart")  # nothing trained yet
    at = open_page(task="copy", family="gpt2", layers="1", heads="2", width="32", lr="0.003")
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert at.selectbox(key="task").value == "copy" and at.radio(key="family").value == "gpt2"
    assert at.number_input(key="width").value == 32
    assert at.number_input(key="lr").value == pytest.approx(0.003)
    assert at.query_params["task"] == "copy" and at.query_params["width"] == "32"


def test_choosing_a_task_loads_its_recipe() -> None:
    at = open_page(layers="1", train_seed="7")
    at.selectbox(key="task").set_value("sort").run()
    assert not at.exception and not at.error
    assert at.toggle(key="mlp").value is RECIPES["sort"].mlp is True
    assert at.number_input(key="layers").value == RECIPES["sort"].layers
    assert at.number_input(key="train_seed").value == 7  # the seed stays


@pytest.mark.parametrize(("task", "family"), [("reverse-seq2seq", "bart"), ("copy", "llama")])
def test_a_task_in_a_link_without_a_family_brings_its_recipes(task, family) -> None:
    at = open_page(task=task)
    assert not at.exception and not at.warning and not at.error, [w.value for w in at.warning]
    assert at.radio(key="family").value == family == RECIPES[task].family
    assert not button(at, "Train").disabled
    assert at.query_params.get("family", "llama") == family  # the page's own link names it


def test_a_family_the_link_names_is_kept() -> None:
    at = open_page(task="reverse-seq2seq", family="llama")
    assert at.radio(key="family").value == "llama"  # the trainer refuses the pair: the task goes
    notices = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "needs an encoder-decoder family" in notices
    assert at.selectbox(key="task").value == TrainConfig().task


def test_a_short_training_draws_the_snapshots_and_opens_on_every_page() -> None:
    at = open_in_app(**{key: int(value) for key, value in SHORT.items()})
    assert at.title[0].value == "Train heads"
    run = train_until_done(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert run.state is JobState.DONE and not run.stopped_early
    snapshots = run.snapshots
    assert snapshots[0].step == 0 and snapshots[-1].step == 30 and len(snapshots) >= 5
    # loss and accuracy: the snapshots' values, step by step
    curves = chart(at, "Loss and accuracy over the steps")
    steps = [s.step for s in snapshots]
    np.testing.assert_array_equal(decode(curves["data"][0]["x"]), steps)
    np.testing.assert_allclose(decode(curves["data"][0]["y"]), [s.loss for s in snapshots])
    np.testing.assert_allclose(decode(curves["data"][1]["y"]), [s.accuracy for s in snapshots])
    assert curves["layout"]["xaxis"]["range"] == [0, 30]
    # the mosaic: layers x heads heatmaps, each the last snapshot's attention on the probe
    mosaic = chart(at, "Every head on the probe sequence at step 30")
    last = snapshots[-1]
    assert len(mosaic["data"]) == 2 * 2
    for i, trace in enumerate(mosaic["data"]):
        np.testing.assert_array_equal(decode(trace["z"]), last.probe_attention[i // 2, i % 2])
    # each head's scores over the steps, one line per head and score
    scores = chart(at, "What each head attends to")
    assert len(scores["data"]) == 2 * 2 * 2
    np.testing.assert_allclose(
        decode(scores["data"][1]["y"]), [s.induction_scores[0, 0] for s in snapshots], rtol=1e-6
    )
    # the step slider shows an earlier snapshot's mosaic
    at.select_slider(key=f"train-shown-{run.model.id}").set_value(0).run()
    mosaic = chart(at, f"Every head on the probe sequence at step {snapshots[0].step}")
    np.testing.assert_array_equal(
        decode(mosaic["data"][3]["z"]), snapshots[0].probe_attention[1, 1]
    )
    # the model is held by name; the model box opens it, through both engines
    name = run.model.name
    assert name in trained_store() and any(name in s.value for s in at.success)
    assert at.metric[1].value == "30 of 30"
    button(at, "Explore this model").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.title[0].value == "Heads" and at.text_input(key="model").value == name
    large = chart(at, "Layer")
    tokens = list(last.probe_tokens)
    assert [t.replace("&#35;", "#") for t in large["layout"]["xaxis"]["ticktext"]] == tokens
    layer, head = at.session_state["layer"], at.session_state["head"]
    assert last.induction_scores[layer, head] == last.induction_scores.max()
    loaded = mhsa.load_model(name, device="cpu")
    for engine in ("transformers", "mhsa"):  # an independent path: the saved weights
        result = mhsa.attend(at.session_state["text"], model=loaded, engine=engine)
        assert result.tokens == tokens
        np.testing.assert_allclose(result.attention, last.probe_attention, atol=1e-5)


def test_the_encoder_decoder_task_trains_bart_and_draws_its_cross_attention() -> None:
    at = open_page(layers="1", heads="2", width="16", steps="20", train_seed="3")
    at.selectbox(key="task").set_value("reverse-seq2seq").run()
    assert at.radio(key="family").value == RECIPES["reverse-seq2seq"].family == "bart"
    at.number_input(key="layers").set_value(1).run()
    at.number_input(key="width").set_value(16).run()
    at.number_input(key="heads").set_value(2).run()
    at.number_input(key="steps").set_value(20).run()
    run = train_until_done(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    last = run.snapshots[-1]
    assert last.step == 20 and last.probe_source_tokens is not None
    # the mosaic is the cross attention: rows the decoder's tokens, columns the encoder's
    mosaic = chart(at, "Every head on the probe sequence at step 20 (cross attention")
    assert len(mosaic["data"]) == 1 * 2
    for i, trace in enumerate(mosaic["data"]):
        np.testing.assert_array_equal(decode(trace["z"]), last.probe_attention[0, i])
        assert [x.split(" #")[0] for x in trace["x"]] == last.probe_source_tokens
        assert [y.split(" #")[0] for y in trace["y"]] == last.probe_tokens
    # one panel: each cross head's anti-diagonal score over the steps
    scores = chart(at, "What each head attends to")
    assert len(scores["data"]) == 2 and "anti-diagonal" in str(scores["layout"]["annotations"])
    np.testing.assert_allclose(
        decode(scores["data"][1]["y"]),
        [s.anti_diagonal_scores[0, 1] for s in run.snapshots],
        rtol=1e-6,
    )
    # a bart family beside a decoder-only task is refused with the trainer's message
    at.selectbox(key="task").set_value("copy").run()
    at.radio(key="family").set_value("bart").run()
    assert any("needs a decoder" in e.value and "bart" in e.value for e in at.error)


def test_cancel_stops_the_run_and_keeps_what_was_trained() -> None:
    at = open_page(**(SHORT | {"steps": "3000"}))
    button(at, "Train").click().run()
    run = at.session_state[RUN]
    deadline = time.monotonic() + 60
    while run.steps_done < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    at.run()
    progress = at.get("progress")
    assert progress and "Training: step" in progress[0].proto.text
    assert button(at, "Train").disabled  # one run at a time per session
    button(at, "Cancel").click().run()
    assert run.job.wait(60) and run.state is JobState.DONE
    at.run()
    done = run.model.info["steps_done"]
    assert run.stopped_early and 5 <= done < 3000
    assert any(f"Cancelled after step {done}" in i.value for i in at.info)
    assert run.model.name in trained_store()
    assert mhsa.load_model(run.model.name, device="cpu").facts()["layers"] == 2
    assert not button(at, "Train").disabled


def test_a_run_waits_its_turn_with_its_place_shown_and_cancel_takes_it_out(one_slot) -> None:
    queue, _ = one_slot
    at = open_page(**SHORT)
    button(at, "Train").click().run()
    assert not at.exception
    assert any("1 heavy job ahead of you" in i.value for i in at.info), [i.value for i in at.info]
    run = at.session_state[RUN]
    assert run.state is JobState.WAITING and queue.counts() == (1, 1)
    button(at, "Cancel").click().run()
    assert queue.counts() == (1, 0) and run.state is JobState.CANCELLED
    at.run()
    assert any("nothing was trained" in i.value for i in at.info)
    assert len(trained_store()) == 0


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("task", "<b>x</b>", "must be one of"),
        ("family", "[bert](https://example.org)", "family must be one of"),
        ("layers", "9", "layers must be a whole number between 1 and 4"),
        ("heads", "-1", "heads must be a whole number between"),
        ("width", "0x40", "whole number"),
        ("steps", "99999999999999999999", "steps must be a whole number between"),
        ("lr", "nan", "finite"),
        ("lr", "1e309", "finite"),
        ("train_seed", "**1**", "whole number"),
        ("mlp", "yes", "must be 0 or 1"),
    ],
)
def test_a_hostile_link_value_falls_back_with_a_notice(key, value, reason) -> None:
    at = open_page(**{key: value})
    assert not at.exception and not at.error, [e.value for e in at.error]
    notices = " ".join(rendered(w.value)[0] for w in at.warning)
    assert f"Link parameter {key}=" in notices and reason in notices, notices
    widget = {"task": at.selectbox, "family": at.radio, "mlp": at.toggle}.get(key, at.number_input)
    field = "seed" if key == "train_seed" else key
    assert widget(key=key).value == getattr(TrainConfig(), field)
    assert not button(at, "Train").disabled


def test_settings_that_do_not_go_together_say_why_and_train_nothing() -> None:
    at = open_page(heads="3")  # 64 is no multiple of 2 x 3 (rotary pairs per head)
    assert not at.exception and not at.warning  # each setting is in its range
    assert at.error and "width must be a multiple of 6" in rendered(at.error[0].value)[0]
    assert button(at, "Train").disabled
    at.number_input(key="width").set_value(66).run()
    assert not at.error and not button(at, "Train").disabled
    assert at.query_params["heads"] == "3" and at.query_params["width"] == "66"


def test_a_widget_value_the_trainer_refuses_falls_back_with_a_message() -> None:
    at = open_page()
    at.number_input(key="layers").set_value(9).run()
    assert not at.exception
    notices = " ".join(rendered(w.value)[0] for w in at.warning)
    assert "layers: layers must be a whole number between 1 and 4" in notices
    assert "Using the default" in notices
    assert at.number_input(key="layers").value == TrainConfig().layers


def test_a_toy_link_opens_the_shipped_model_and_a_stale_trained_link_falls_back() -> None:
    heads = AppTest.from_file(str(ROOT / "pages/1_Heads.py"), default_timeout=120)
    heads.query_params["model"] = "toy:induction"
    heads.query_params["text"] = "ba be bi ba be bi"
    heads.run()
    assert not heads.exception and not heads.error and not heads.warning
    assert heads.text_input(key="model").value == "toy:induction"
    ticks = chart(heads, "Layer")["layout"]["xaxis"]["ticktext"]
    assert ticks == ["[BOS]", "ba", "be", "bi", "ba", "be", "bi"]
    stale = AppTest.from_file(str(ROOT / "pages/1_Heads.py"), default_timeout=120)
    stale.query_params["model"] = "trained:0123456789ab"
    stale.run()
    notices = " ".join(rendered(w.value)[0] for w in stale.warning)
    assert "model='trained:0123456789ab' ignored" in notices and "Train heads" in notices
    assert stale.text_input(key="model").value == "default" and not stale.error


def test_the_shipped_model_button_opens_it_with_its_probe() -> None:
    at = open_in_app(task="copy")
    button(at, "Open the shipped copy model").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.title[0].value == "Heads" and at.text_input(key="model").value == "toy:copy"
    ticks = chart(at, "Layer")["layout"]["xaxis"]["ticktext"]
    assert ticks[0] == "[BOS]" and "[SEP]" in ticks

"""Long inputs in the app: the sidebar's layers and heads (link keys ``long_layers``,
``long_heads``), the Overview saying what was materialised, the attention budget's refusal
asking for a selection, and hostile values falling back with a notice."""

from __future__ import annotations

import dataclasses

from tests.app.test_pages import run, specs
from ui import core

TEXT = "ba ke mo di fu lo ba ke mo di"


def _texts(elements) -> list[str]:
    return [e.value for e in elements]


def test_the_overview_states_what_was_materialised() -> None:
    at = run(
        "pages/0_Overview.py", model="toy:induction", text=TEXT, long_layers="1", long_heads="0-1"
    )
    assert not at.exception and not at.error, _texts(at.error)
    (note,) = [t for t in _texts(at.info) if "Materialised" in t]
    # the partial result: layer 1, heads 0 and 1 of 2 x 4, float32; 12 tokens x 12 x 2 x 4 B
    assert "layers 1 x heads 0\\-1 of 2 x 4, float32" in note
    assert at.session_state["long_layers"] == "1" and at.query_params["long_heads"] == "0-1"


def test_the_heads_page_draws_a_partial_result_with_the_models_numbers() -> None:
    at = run(
        "pages/1_Heads.py", model="toy:induction", text=TEXT, long_layers="1", long_heads="2-3"
    )
    assert not at.exception and not at.error, _texts(at.error)
    grid = specs(at)[0]
    assert grid["layout"]["yaxis"]["ticktext"] == ["L1"]
    assert grid["layout"]["xaxis"]["ticktext"] == ["H2", "H3"]


def test_over_the_attention_budget_the_page_asks_for_layers_and_heads(monkeypatch) -> None:
    monkeypatch.setattr(core, "LIMITS", dataclasses.replace(core.LIMITS, max_attention_mb=0))
    at = run("pages/0_Overview.py", model="toy:induction", text=TEXT + " bu")
    assert not at.exception
    (message,) = _texts(at.error)
    message = message.replace("\\", "")  # shown literally: markdown escapes
    n = len(TEXT.split()) + 2  # the syllables, " bu" and the BOS token
    assert f"2 layers x 4 heads over {n} x {n} tokens in float32" in message
    assert f"hold {2 * 4 * n * n * 4 / 2**20:.2g} MB" in message  # 4 bytes a weight
    assert "MHSA_MAX_ATTENTION_MB" in message and "float16" in message
    assert any("Long inputs" in t for t in _texts(at.info))


def test_layers_out_of_range_name_the_models_sizes() -> None:
    at = run("pages/0_Overview.py", model="toy:induction", text=TEXT, long_layers="7")
    assert not at.exception
    (message,) = _texts(at.error)
    message = message.replace("\\", "")
    assert "Layers 7 out of range" in message and "2 layers of 4 heads" in message


def test_hostile_layer_and_head_values_fall_back_with_a_notice() -> None:
    at = run(
        "pages/0_Overview.py", model="toy:induction", text=TEXT, long_layers="1;x", long_heads="9-2"
    )
    assert not at.exception and not at.error, _texts(at.error)
    assert at.session_state["long_layers"] == "" and at.session_state["long_heads"] == ""
    notices = " ".join(_texts(at.warning)).replace("\\", "")  # shown literally
    assert "long_layers='1;x' ignored" in notices and "not a list of numbers" in notices
    assert "long_heads='9-2' ignored" in notices and "runs backwards" in notices
    assert not [t for t in _texts(at.info) if "Materialised" in t]  # the whole result

"""``with page.run(...)``: a page body that stops early (``page.stop``) or fails is still
finished (its link written, its figures offered in one download), and what follows the guard
is not drawn."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _stopping_page() -> None:
    import streamlit as st

    from mhsa import plots
    from ui import page
    from ui.state import Param, bounded_int

    with page.run("Guarded", {"marker": Param(0, bounded_int(0, 9))}) as query:
        st.session_state["marker"] = 7  # a non-default value: finish writes it into the link
        fig = plots.matrix_heatmap([[0.5, 0.5]], ["q"], ["a", "b"], title="one figure")
        page.figure(fig, "one", key="one")
        st.info(f"Nothing more for {query.model}.")
        page.stop()
        st.markdown("after the guard")


def _failing_page() -> None:
    import streamlit as st

    from mhsa import plots
    from ui import page
    from ui.state import Param, bounded_int

    with page.run("Failing", {"marker": Param(0, bounded_int(0, 9))}):
        st.session_state["marker"] = 7
        fig = plots.matrix_heatmap([[0.5, 0.5]], ["q"], ["a", "b"], title="one figure")
        page.figure(fig, "one", key="one")
        raise ValueError("broken body")


def _zips(at: AppTest) -> list[str]:
    return [b.proto.label for b in at.get("download_button") if b.proto.label.endswith(".zip)")]


def test_a_page_that_stops_early_is_finished_and_draws_nothing_after() -> None:
    at = AppTest.from_function(_stopping_page, default_timeout=120).run()
    assert not at.exception and not at.error
    assert [i.value for i in at.info] == ["Nothing more for default."]
    assert "after the guard" not in [m.value for m in at.markdown]
    assert at.query_params["marker"] == "7"  # finish: the link
    assert _zips(at) == ["Download the 1 figure (HTML + CSV, .zip)"]  # finish: the figures


def test_a_failing_page_is_finished_and_its_error_shown() -> None:
    at = AppTest.from_function(_failing_page, default_timeout=120).run()
    assert len(at.exception) == 1  # the error, redacted by this app's config
    assert at.query_params["marker"] == "7"
    assert _zips(at) == ["Download the 1 figure (HTML + CSV, .zip)"]

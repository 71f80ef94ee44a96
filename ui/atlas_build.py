"""The Head atlas page's offer of an atlas the server does not hold yet: a build of the
model's shipped atlas running in the background (``scripts/run-app.sh`` starts it;
``mhsa.atlas.shipped.build_in_background``) with its progress, else a build from the page
through the heavy queue, and where no copy of the Brown Corpus is here, how to give one and a
build on the project's own sentences instead (``ui.views.atlas``)."""

from __future__ import annotations

import streamlit as st

from ui import page
from ui.state import md_escape
from ui.views import atlas as views

__all__ = ["background_progress", "build_offer"]


def background_progress(model: str) -> bool:
    """A build of the model's shipped atlas in the background (``scripts/run-app.sh`` starts
    it): its progress, looked at again every few seconds, and the page opened on the atlas
    when it is done. True while it runs."""
    status = views.background_status(model)
    if status is None:
        return False
    if status["state"] == "failed":
        st.warning(md_escape(f"The background build failed: {status['message']}"))
        return False
    if status["state"] == "stopped":
        st.caption("A background build of this atlas stopped; building it resumes it.")
        return False

    @st.fragment(run_every=5)
    def progress() -> None:
        now = views.background_status(model)
        if now is None or now["state"] != "running":
            views.clear_listing()
            st.rerun(scope="app")
        done, total = int(now["texts"]), int(now["total"])
        st.info(
            f"Building the atlas of {model!r} in the background: {done:,} of "
            f"{total or '?'} texts done. The page opens it when it is ready.",
            icon=":material/hourglass_top:",
        )
        st.progress(done / total if total else 0.0)

    progress()
    return True


def build_offer(model: str) -> None:
    """No atlas yet: a build running in the background, or how to get one, and a build from
    the page through the heavy queue (on the project's own sentences where no copy of the
    Brown Corpus is here)."""
    if background_progress(model):
        return
    missing = views.brown_copy_missing(model)
    if missing is not None:
        st.warning(md_escape(missing), icon=":material/cloud_off:")
        _build_button(
            model,
            "Build on the project's own sentences",
            "atlas-build-sentences",
            lambda progress: views.build_on_project_sentences(model, "auto", progress),
            f"Building the atlas of {model} on the project's sentences",
        )
    st.info(
        f"This server holds no atlas of {model!r} yet. Build one here (on "
        f"{views.BUILD_SENTENCES:,} sentences of the Brown Corpus; toy models on their task), "
        "or on the command line: python -m mhsa atlas build --default",
        icon=":material/info:",
    )
    _build_button(
        model,
        "Build an atlas of this model",
        "atlas-build",
        lambda progress: views.build(model, "auto", progress),
        f"Building the atlas of {model}",
    )


def _build_button(model: str, label: str, key: str, build, what: str) -> None:
    """A button that builds an atlas of ``model`` through the heavy queue (``build(progress)``
    returns the atlas's name), then opens it; the request is kept across reruns under
    ``_{key}`` (with ``-`` as ``_``) until the build is done."""
    flag = "_" + key.replace("-", "_")
    if st.button(label, key=key):
        st.session_state[flag] = model
    if st.session_state.get(flag) == model:
        name = page.heavy_or_stop("atlas-build", (key, model), build, what, unit="texts")
        st.session_state.pop(flag, None)
        st.session_state["atlas"] = name
        st.rerun()

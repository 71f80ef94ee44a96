"""Lessons: a few short lessons for a class, each step one sentence and a link that opens a
page with everything set (``ui.lessons``)."""

from __future__ import annotations

import streamlit as st

from ui import page
from ui.lessons import LESSONS, steps_markdown
from ui.state import md_escape
from ui.views.lessons import step_text

with page.run("Lessons"):
    st.caption(
        "Six short lessons, in order. Each step is one sentence and a link that opens the page "
        "set up for it (model, text, layer, test) in a new tab; they use only the built-in "
        "models. Every number in a sentence is measured on the page it opens, as it opens."
    )
    for number, lesson in enumerate(LESSONS, 1):
        st.subheader(f"{number}. {lesson.title}")
        st.caption(md_escape(lesson.goal))
        with st.spinner("Measuring the lessons' pages…"):
            st.markdown(steps_markdown(lesson, md_escape, step_text))

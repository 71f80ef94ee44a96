"""MHSA Explorer. Run with `streamlit run app.py`: the navigation over the pages of
``ui.navigation.PAGES``, named for people and grouped by what they are for. Each page keeps its
address (`/Heads`, ...), so links made before the navigation still open the same page; the
home page also answers at `/Overview` (``ui.navigation.navigation_entries``). Nothing it shows
is fetched from outside the server (tests/browser/test_offline_browser.py)."""

from __future__ import annotations

import streamlit as st

from ui.navigation import FAVICON, NAV_KEY, navigation_entries

# the tab's icon before the navigation: else the browser shows (and fetches from
# fonts.gstatic.com) the chosen page's Material icon until the page sets its own
st.set_page_config(page_icon=FAVICON, layout="wide")
entries = navigation_entries()
pages = {
    group: [
        st.Page(
            entry.file,
            title=entry.title,
            icon=entry.icon,
            url_path=entry.url_path,
            default=entry.default,
            visibility="hidden" if entry.hidden else "visible",
        )
        for entry in group_entries
    ]
    for group, group_entries in entries.items()
}
# Streamlit's own sidebar menu of grouped pages is invalid HTML for assistive technology (an
# `li` outside any list, a `ul` holding `div`s: axe-core's `list` and `listitem`, WCAG 1.3.1;
# no upstream report of it was found; the nearest, on the menu's structure, is
# https://github.com/streamlit/streamlit/issues/5889). So the menu is hidden and drawn here
# as one link per page under each group's name (tests/browser/test_a11y_browser.py).
navigation = st.navigation(pages, position="hidden")
with st.sidebar, st.container(key=NAV_KEY):
    for group, group_pages in pages.items():
        st.markdown(f"**{group}**")  # a constant group name, no user text
        for entry, app_page in zip(entries[group], group_pages, strict=True):
            if not entry.hidden:  # the home page's alias stays unlisted
                st.page_link(app_page)
navigation.run()

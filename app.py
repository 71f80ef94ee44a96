"""MHSA Explorer. Run with `streamlit run app.py`: the navigation over the pages of
``ui.navigation.PAGES``, named for people and grouped by what they are for. Each page keeps its
address (`/Heads`, ...), so links made before the navigation still open the same page; the
home page also answers at `/Overview` (``ui.navigation.navigation_entries``). Nothing it shows
is fetched from outside the server (tests/browser/test_offline_browser.py)."""

from __future__ import annotations

import streamlit as st

from ui.navigation import FAVICON, navigation_entries

# the tab's icon before the navigation: else the browser shows (and fetches from
# fonts.gstatic.com) the chosen page's Material icon until the page sets its own
st.set_page_config(page_icon=FAVICON, layout="wide")
navigation = st.navigation(
    {
        group: [
            st.Page(
                entry.file,
                title=entry.title,
                icon=entry.icon,
                url_path=entry.url_path,
                default=entry.default,
                visibility="hidden" if entry.hidden else "visible",
            )
            for entry in entries
        ]
        for group, entries in navigation_entries().items()
    },
    expanded=True,  # every page listed, none behind "view more"
)
navigation.run()

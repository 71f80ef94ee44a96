"""MHSA Explorer. Run with `streamlit run app.py`: the navigation over the pages of
``ui.navigation.PAGES``, named for people and grouped by what they are for. Each page keeps its
address (`/Heads`, ...), so links made before the navigation still open the same page."""

from __future__ import annotations

import streamlit as st

from ui.navigation import HOME_ALIAS, groups


def _pages(pages: list) -> list[st.Page]:
    out = []
    for page in pages:
        out.append(
            st.Page(
                page.file,
                title=page.title,
                icon=page.icon,
                # the home page's own name is its hidden alias's: it is served at the root
                url_path=page.url_path or f"{HOME_ALIAS}_home",
                default=page.is_home,
            )
        )
        if page.is_home:  # /Overview?model=... opens the home page too, not "Page not found"
            out.append(
                st.Page(page.file, title=page.title, url_path=HOME_ALIAS, visibility="hidden")
            )
    return out


navigation = st.navigation(
    {group: _pages(pages) for group, pages in groups().items()},
    expanded=True,  # every page listed, none behind "view more"
)
navigation.run()

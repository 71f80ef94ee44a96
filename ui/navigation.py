"""The app's pages, one record each: ``app.py`` builds its navigation from ``PAGES``, and the
tests and browser benchmarks read the same list. Adding a page is its file under ``pages/`` and
one record here. Plain data (no Streamlit), so tests and benchmarks import it cheaply."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AppPage:
    """One page of the navigation.

    Attributes:
        title: its name in the navigation (people's words).
        file: its script, relative to the repository root.
        url_path: its address under the app's root (``/Heads``); "" for the home page, at the
            root itself. Kept as it was when the page came, so old links open it.
        group: the navigation heading it sits under.
        icon: its Material icon in the navigation.
        figures: plotly charts it draws once its result is shown (the browser tests and
            benchmarks wait for them).
    """

    title: str
    file: str
    url_path: str
    group: str
    icon: str
    figures: int

    @property
    def is_home(self) -> bool:
        """The page the app's root address opens."""
        return self.url_path == ""


#: the browser tab's icon: a 3 x 3 attention map (each token to itself, then the one before),
#: inline SVG, which Streamlit sends as a data: URL. A Material icon (``:material/...:``) as
#: the page icon makes the browser fetch it from fonts.gstatic.com (no request may leave the
#: app; tests/browser/test_offline_browser.py); ``app.py`` sets it before ``st.navigation``,
#: whose pages' Material icons would else become the tab's icon too.
FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="#1c83e1">'
    '<rect x="1" y="1" width="6" height="6" rx="1" fill-opacity="1"/>'
    '<rect x="9" y="1" width="6" height="6" rx="1" fill-opacity=".15"/>'
    '<rect x="17" y="1" width="6" height="6" rx="1" fill-opacity=".15"/>'
    '<rect x="1" y="9" width="6" height="6" rx="1" fill-opacity=".55"/>'
    '<rect x="9" y="9" width="6" height="6" rx="1" fill-opacity="1"/>'
    '<rect x="17" y="9" width="6" height="6" rx="1" fill-opacity=".15"/>'
    '<rect x="1" y="17" width="6" height="6" rx="1" fill-opacity=".15"/>'
    '<rect x="9" y="17" width="6" height="6" rx="1" fill-opacity=".55"/>'
    '<rect x="17" y="17" width="6" height="6" rx="1" fill-opacity="1"/>'
    "</svg>"
)

#: the key of the sidebar's container of page links (``app.py``; its class is
#: ``st-key-mhsa-nav``, which the browser tests and benchmarks find it by)
NAV_KEY = "mhsa-nav"

#: the home page's address besides the root: ``/Overview?model=...`` opens it (hidden in the menu)
HOME_ALIAS = "Overview"

#: Every page, in navigation order; the groups appear in the order of their first page.
#: the repository root, where the page files are
ROOT = Path(__file__).resolve().parents[1]

PAGES: tuple[AppPage, ...] = (
    AppPage("Overview", "pages/0_Overview.py", "", "Explore", ":material/home:", 0),
    AppPage("Heads", "pages/1_Heads.py", "Heads", "Explore", ":material/grid_view:", 3),
    AppPage(
        "Line view", "pages/8_Line_view.py", "Line_view", "Explore", ":material/linear_scale:", 1
    ),
    AppPage("Compare", "pages/6_Compare.py", "Compare", "Explore", ":material/compare:", 2),
    AppPage(
        "Head atlas",
        "pages/14_Head_atlas.py",
        "Head_atlas",
        "Explore",
        ":material/travel_explore:",
        4,
    ),
    AppPage(
        "Head similarity",
        "pages/2_Head_similarity.py",
        "Head_similarity",
        "Analyse",
        ":material/hub:",
        2,
    ),
    AppPage(
        "Head statistics",
        "pages/3_Head_statistics.py",
        "Head_statistics",
        "Analyse",
        ":material/table_chart:",
        1,
    ),
    AppPage(
        "Head importance",
        "pages/7_Head_importance.py",
        "Head_importance",
        "Analyse",
        ":material/star:",
        3,
    ),
    AppPage(
        "Head roles",
        "pages/10_Head_roles.py",
        "Head_roles",
        "Analyse",
        ":material/psychology:",
        10,
    ),
    AppPage(
        "Patching",
        "pages/11_Patching.py",
        "Patching",
        "Analyse",
        ":material/swap_horiz:",
        3,
    ),
    AppPage(
        "Information flow",
        "pages/12_Information_flow.py",
        "Information_flow",
        "Analyse",
        ":material/account_tree:",
        0,  # on the default model (an encoder) it draws none: three on a causal LM
    ),
    AppPage(
        "Circuits",
        "pages/13_Circuits.py",
        "Circuits",
        "Analyse",
        ":material/hub:",
        2,  # the circuit and the faithfulness curve (the default MiniLM: the embedding target)
    ),
    AppPage(
        "Rollout",
        "pages/5_Rollout.py",
        "Rollout",
        "Analyse",
        ":material/stacked_line_chart:",
        2,
    ),
    AppPage("Lessons", "pages/13_Lessons.py", "Lessons", "Teach", ":material/menu_book:", 0),
    AppPage(
        "Inside MHSA", "pages/4_Inside_MHSA.py", "Inside_MHSA", "Teach", ":material/school:", 2
    ),
    AppPage(
        "Train heads",
        "pages/9_Train_heads.py",
        "Train_heads",
        "Teach",
        ":material/model_training:",
        0,
    ),
)


@dataclass(frozen=True)
class NavigationEntry:
    """One ``st.Page`` of the navigation (``app.py`` makes them): a page of ``PAGES``, or the
    home page's hidden alias at ``/Overview``.

    Attributes:
        file: its script.
        title: its name in the menu.
        icon: its icon.
        url_path: its own address (the home page's is served at the root too).
        default: the page the root opens.
        hidden: left out of the menu (the alias).
    """

    file: str
    title: str
    icon: str | None
    url_path: str
    default: bool = False
    hidden: bool = False


def navigation_entries() -> dict[str, list[NavigationEntry]]:
    """The navigation's pages by heading: every page of ``PAGES``, and after the home page its
    hidden alias ``HOME_ALIAS`` (``/Overview?model=...`` opens the home page, not "Page not
    found"); the home page's own address is then ``Overview_home``, never shown (Streamlit
    serves the default page at the root)."""
    out: dict[str, list[NavigationEntry]] = {}
    for group, pages in groups().items():
        entries = out.setdefault(group, [])
        for page in pages:
            path = page.url_path or f"{HOME_ALIAS}_home"
            entries.append(NavigationEntry(page.file, page.title, page.icon, path, page.is_home))
            if page.is_home:
                alias = NavigationEntry(page.file, page.title, None, HOME_ALIAS, hidden=True)
                entries.append(alias)
    return out


def groups() -> dict[str, list[AppPage]]:
    """The pages by navigation heading, headings in the order of their first page."""
    grouped: dict[str, list[AppPage]] = {}
    for page in PAGES:
        grouped.setdefault(page.group, []).append(page)
    return grouped


@functools.cache
def every_link_key() -> frozenset[str]:
    """Every name a link can hand any page a value under: the keys of each page's ``PARAMS``
    and their old names (``Param(..., old_keys=...)``), read from the page files (the pages
    are scripts: importing one would run it). A key outside these is a mistake worth a notice
    (``ui.state.use_params``); one of another page's (a link whose path was edited) is not."""
    names: set[str] = set()
    for page in PAGES:
        tree = ast.parse((ROOT / page.file).read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Dict):
                continue
            if not any(isinstance(t, ast.Name) and t.id == "PARAMS" for t in node.targets):
                continue
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(key, ast.Constant):
                    names.add(str(key.value))
                for keyword in getattr(value, "keywords", []):
                    if keyword.arg == "old_keys" and isinstance(keyword.value, ast.Tuple):
                        names.update(
                            str(e.value) for e in keyword.value.elts if isinstance(e, ast.Constant)
                        )
    return frozenset(names)

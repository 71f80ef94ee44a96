"""The colours of heads and layers, chosen for every eye (WCAG 2.1 1.4.1 and 1.4.11).

- ``HEAD_COLORS``: eight colours for heads (Line view, Train heads), each at least 3:1 against
  the figures' white background (WCAG 1.4.11, graphical objects) and every pair at least
  ``MIN_HEAD_DISTANCE`` apart in CIEDE2000 (Sharma, Wu & Dalal 2005) for normal vision and
  under the simulations of protanopia, deuteranopia and tritanopia of Machado, Oliveira &
  Fernandes 2009 (severity 1). Chosen by a greedy max-min search over the Okabe-Ito and Paul
  Tol palettes and their darker shades (the Okabe-Ito yellow, orange and sky blue themselves
  are under 3:1 on white). The tenth category palette of plotly they replace put heads 2 and
  3 at #2ca02c and #d62728, one colour under deuteranopia.
- ``HEAD_DASHES``: a second cue where heads outnumber the colours (a 12-head layer): head h is
  drawn with colour ``h % 8`` and dash ``h // 8``, so that no two heads look alike and colour
  is never the only cue.
- ``LAYER_COLORSCALE``: an ordered scale for layers (cividis: lightness rises monotonically and
  it reads the same under colour-vision deficiency, Nuñez, Anderton & Renslow 2018), where
  Turbo made the first and last layers both near-black and merged the middle ones.

``tests/test_palette.py`` simulates the three deficiencies and checks the distances and the
contrasts.
"""

from __future__ import annotations

__all__ = ["HEAD_COLORS", "HEAD_DASHES", "LAYER_COLORSCALE", "MIN_HEAD_DISTANCE", "head_style"]

#: navy, ochre, sky blue, maroon, grey, black, blue, rose: in this order each next colour is
#: the one farthest from those before it, so that few heads get the most distinct ones
HEAD_COLORS = (
    "#223b55",
    "#b87f00",
    "#1e9be2",
    "#661908",
    "#838383",
    "#000000",
    "#006ba8",
    "#b83d52",
)
#: the least CIEDE2000 distance between two head colours, under every simulation
MIN_HEAD_DISTANCE = 15.0
#: plotly dash styles, one per round of the colours
HEAD_DASHES = ("solid", "dash", "dot", "dashdot")
#: the scale of layers (plotly's name)
LAYER_COLORSCALE = "Cividis"


def head_style(index: int) -> tuple[str, str]:
    """``(colour, dash)`` of the ``index``-th head drawn: the colours in turn, then the same
    colours dashed."""
    colors = len(HEAD_COLORS)
    return HEAD_COLORS[index % colors], HEAD_DASHES[(index // colors) % len(HEAD_DASHES)]

"""The heads' and layers' colours for every eye (``mhsa.plots.palette``): each pair of head
colours stays apart under simulated protanopia, deuteranopia and tritanopia (Machado, Oliveira
& Fernandes 2009, severity 1, on linear RGB), measured in CIEDE2000 (Sharma, Wu & Dalal 2005,
checked here on their published test pairs), each at least 3:1 against white (WCAG 2.1
1.4.11), and the layers' scale ordered in lightness."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from plotly.colors import get_colorscale, sample_colorscale

from mhsa import plots
from mhsa.plots.palette import (
    HEAD_COLORS,
    HEAD_DASHES,
    LAYER_COLORSCALE,
    MIN_HEAD_DISTANCE,
    head_style,
)

#: Machado et al. 2009's matrices at severity 1.0, on linear RGB
MACHADO = {
    "normal": np.eye(3),
    "protanopia": np.array(
        [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
         [-0.003882, -0.048116, 1.051998]]
    ),
    "deuteranopia": np.array(
        [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
         [-0.011820, 0.042940, 0.968881]]
    ),
    "tritanopia": np.array(
        [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
         [0.004733, 0.691367, 0.303900]]
    ),
}  # fmt: skip


def _linear(hex_color: str) -> np.ndarray:
    c = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)]) / 255.0
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab(linear: np.ndarray) -> np.ndarray:
    """CIELAB (D65) of linear sRGB."""
    rgb_to_xyz = np.array(
        [[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]
    )
    x = rgb_to_xyz @ np.clip(linear, 0, 1) / np.array([0.95047, 1.0, 1.08883])
    f = np.where(x > (6 / 29) ** 3, np.cbrt(x), x / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _ciede2000(lab1: np.ndarray, lab2: np.ndarray) -> float:
    """CIEDE2000 colour difference (Sharma, Wu & Dalal 2005, equations 1-22)."""
    (l1, a1, b1), (l2, a2, b2) = lab1, lab2
    c_bar = (np.hypot(a1, b1) + np.hypot(a2, b2)) / 2
    g = 0.5 * (1 - np.sqrt(c_bar**7 / (c_bar**7 + 25**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = np.hypot(a1p, b1), np.hypot(a2p, b2)
    h1p, h2p = np.degrees(np.arctan2(b1, a1p)) % 360, np.degrees(np.arctan2(b2, a2p)) % 360
    dh = 0.0 if c1p * c2p == 0 else (h2p - h1p + 180) % 360 - 180
    d_l, d_c = l2 - l1, c2p - c1p
    d_h = 2 * np.sqrt(c1p * c2p) * np.sin(np.radians(dh / 2))
    l_bar, cp_bar = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        h_bar = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        h_bar = (h1p + h2p) / 2
    else:
        h_bar = (h1p + h2p + (360 if h1p + h2p < 360 else -360)) / 2
    t = (
        1
        - 0.17 * np.cos(np.radians(h_bar - 30))
        + 0.24 * np.cos(np.radians(2 * h_bar))
        + 0.32 * np.cos(np.radians(3 * h_bar + 6))
        - 0.20 * np.cos(np.radians(4 * h_bar - 63))
    )
    d_theta = 30 * np.exp(-(((h_bar - 275) / 25) ** 2))
    r_c = 2 * np.sqrt(cp_bar**7 / (cp_bar**7 + 25**7))
    s_l = 1 + 0.015 * (l_bar - 50) ** 2 / np.sqrt(20 + (l_bar - 50) ** 2)
    s_c, s_h = 1 + 0.045 * cp_bar, 1 + 0.015 * cp_bar * t
    r_t = -np.sin(np.radians(2 * d_theta)) * r_c
    terms = (d_l / s_l) ** 2 + (d_c / s_c) ** 2 + (d_h / s_h) ** 2
    return float(np.sqrt(terms + r_t * (d_c / s_c) * (d_h / s_h)))


@pytest.mark.parametrize(
    ("lab1", "lab2", "expected"),
    [  # Sharma, Wu & Dalal 2005, Table 1: pairs 1, 7, 17 and 25
        ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
        ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
        ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
        ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
    ],
)
def test_ciede2000_matches_sharmas_test_data(lab1, lab2, expected) -> None:
    assert _ciede2000(np.array(lab1), np.array(lab2)) == pytest.approx(expected, abs=1e-4)


def test_head_colours_stay_apart_for_every_eye() -> None:
    """Every pair at least MIN_HEAD_DISTANCE apart, for normal vision and the three
    deficiencies. The category palette it replaces fails: heads 2 and 3 (#2ca02c, #d62728)
    come within a few units of each other under deuteranopia."""

    def distance(a: str, b: str, matrix: np.ndarray) -> float:
        return _ciede2000(_lab(matrix @ _linear(a)), _lab(matrix @ _linear(b)))

    assert len(set(HEAD_COLORS)) == len(HEAD_COLORS) == 8
    worst = min(
        distance(a, b, m)
        for m in MACHADO.values()
        for a, b in itertools.combinations(HEAD_COLORS, 2)
    )
    assert worst >= MIN_HEAD_DISTANCE
    assert distance("#2ca02c", "#d62728", MACHADO["deuteranopia"]) < MIN_HEAD_DISTANCE / 2


def _luminance(hex_color: str) -> float:
    return float(np.array([0.2126, 0.7152, 0.0722]) @ _linear(hex_color))


def test_head_colours_have_3_to_1_contrast_on_white() -> None:
    """WCAG 2.1 1.4.11: a graphical object needed to read a figure at least 3:1 against its
    background (the figures' white)."""
    for color in HEAD_COLORS:
        assert (1.0 + 0.05) / (_luminance(color) + 0.05) >= 3.0, color


def _contrast(a: str, b: str) -> float:
    """WCAG 2.1's contrast ratio (L1 + 0.05) / (L2 + 0.05), L1 the lighter."""
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_the_contrast_ratio_matches_wcags_reference_values() -> None:
    """Black on white is 21:1; Streamlit's caption grey #828180 on white the 3.88:1 axe-core
    reported (under 4.5:1)."""
    assert _contrast("#000000", "#ffffff") == pytest.approx(21.0)
    assert _contrast("#828180", "#ffffff") == pytest.approx(3.88, abs=0.01)


def test_captions_and_the_skip_link_have_4_5_to_1_contrast() -> None:
    """WCAG 2.1 1.4.3: text at least 4.5:1 against the page's white and the sidebar's grey
    (Streamlit's light theme, secondaryBackgroundColor #f0f2f6)."""
    from ui.page import A11Y_CSS, CAPTION_COLOR

    for background in ("#ffffff", "#f0f2f6"):
        assert _contrast(CAPTION_COLOR, background) >= 4.5, background
    assert f"color: {CAPTION_COLOR}" in A11Y_CSS
    assert _contrast("#0b5cad", "#ffffff") >= 4.5  # the skip link's text on its white


def test_heads_beyond_the_colours_get_a_dash_of_their_own() -> None:
    """A 12-head layer: heads 0 and 8 share a colour and differ in dash, no two heads alike."""
    styles = [head_style(h) for h in range(12)]
    assert len(set(styles)) == 12
    assert styles[0][0] == styles[8][0] and styles[0][1] != styles[8][1] == HEAD_DASHES[1]


def test_the_layer_scale_is_ordered_in_lightness() -> None:
    """Layers read in order: each next layer's colour lighter than the one before (Turbo's
    ends were both near-black)."""
    colors = sample_colorscale(get_colorscale(LAYER_COLORSCALE), list(np.linspace(0, 1, 12)))
    lightness = [
        _lab(_linear("#" + "".join(f"{int(float(v)):02x}" for v in c[4:-1].split(","))))[0]
        for c in colors
    ]
    assert all(b > a for a, b in itertools.pairwise(lightness))


def test_the_map_of_heads_colours_layers_by_the_ordered_scale() -> None:
    import pandas as pd

    coords = pd.DataFrame(
        {"x": [0.0, 1.0], "y": [0.0, 1.0], "layer": [0, 5]}, index=["L0H0", "L5H0"]
    )
    marker = plots.head_map_figure(coords).data[0].marker
    expected = get_colorscale(LAYER_COLORSCALE)
    assert [c for _, c in marker.colorscale] == [c for _, c in expected]

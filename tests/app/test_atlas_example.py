"""An atlas example reads as one (``pages/14_Head_atlas.py``, on the session's atlas): the
heatmap outlines the example's own (query, key) cell and labels its query row, the tables
write small weights whole, and a decile says what its weights are."""

from __future__ import annotations

import json

import numpy as np

import mhsa
from tests.app.test_importance_page import decode
from tests.app.test_pages import run


def test_the_example_heatmap_marks_the_examples_cell_and_its_query_row(app_atlas) -> None:
    atlas = mhsa.atlas.open_atlas(app_atlas)
    at = run(PAGE, atlas_head="L2H5", atlas_example="3")
    assert not at.exception, at.exception
    row = atlas.top("L2H5", k=20, by="norm").iloc[3]
    q, k = int(row["query"]), int(row["key"])
    r, c = q - max(0, q - 5), k - max(0, k - 5)  # the window starts 5 before (or at 0)
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    heat = spec["data"][0]
    tokens = atlas.text_tokens(int(row.text_id))
    n_rows, n_cols = len(heat["y"]), len(heat["x"])
    drawn = decode(heat["z"]).reshape(n_rows, n_cols)
    # the outlined cell is the example's: it holds the example's weight
    assert abs(drawn[r, c] - float(row["weight"])) < 2e-3
    boxes = [s for s in spec["layout"]["shapes"] if s.get("name") == "example"]
    assert len(boxes) == 1
    box = boxes[0]
    assert (box["x0"], box["x1"], box["y0"], box["y1"]) == (c - 0.5, c + 0.5, r - 0.5, r + 0.5)
    y_axis = spec["layout"]["yaxis"]
    labels = dict(zip(y_axis["tickvals"], y_axis["ticktext"], strict=True))
    assert labels[heat["y"][r]] == f"query ▶ {tokens[q]}"
    x_axis = spec["layout"]["xaxis"]
    assert dict(zip(x_axis["tickvals"], x_axis["ticktext"], strict=True))[heat["x"][c]] == (
        f"key ▼ {tokens[k]}"
    )


PAGE = "pages/14_Head_atlas.py"


def test_weights_are_written_in_significant_digits_not_cut(app_atlas) -> None:
    at = run(PAGE, atlas_head="L0H0")
    assert not at.exception
    configs = [json.loads(d.proto.columns) for d in at.dataframe if d.proto.columns]
    weight_formats = [cfg["weight"]["type_config"]["format"] for cfg in configs if "weight" in cfg]
    assert len(weight_formats) >= 3  # the top pairs, the uniform sample, the decile
    assert set(weight_formats) == {"%.3g"}


def test_a_small_decile_says_what_its_weights_are(app_atlas) -> None:
    """On the head with the most pairs near 0 (as most heads of the Brown atlas), decile 3
    says its range, that most pairs weigh 0.01 or less, and that it holds weights near 0; on
    a head with fewer, no such sentence."""
    atlas = mhsa.atlas.open_atlas(app_atlas)
    weights = np.asarray(atlas.summaries["sample_weight"], np.float64)  # [pairs, heads]
    share = (weights <= 0.01).mean(axis=0)
    head = atlas.labels[int(share.argmax())]
    assert share.max() >= 0.5
    at = run(PAGE, atlas_head=head, atlas_decile="3")
    assert not at.exception
    inside = atlas.sample(head, k=len(weights), decile=3)["weight"]
    caption = next(str(c.value) for c in at.caption if "Decile 3" in str(c.value))
    caption = caption.replace("\\", "")
    assert f"weights from {inside.min():.2g} to {inside.max():.2g}" in caption
    assert f"{share.max():.0%} of the head's pairs weigh 0.01 or less" in caption
    assert inside.max() <= 0.01 and "this decile holds weights near 0" in caption
    other = atlas.labels[int(share.argmin())]
    assert share.min() < 0.5
    at = run(PAGE, atlas_head=other, atlas_decile="3")
    caption = next(str(c.value) for c in at.caption if "Decile 3" in str(c.value))
    assert "pairs weigh" not in caption

"""Head labels: one format, one parser, each the other's inverse."""

from __future__ import annotations

import pytest

from mhsa.heads import head_label, parse_head_label


@pytest.mark.parametrize(("layer", "head"), [(0, 0), (2, 5), (11, 15), (9999, 9999)])
def test_a_label_parses_back_to_its_head(layer: int, head: int) -> None:
    assert parse_head_label(head_label(layer, head)) == (layer, head)


def test_the_label_reads_layer_then_head() -> None:
    assert head_label(2, 5) == "L2H5"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "L1",
        "H1L2",
        "l1h2",
        "L1H2,L3H4",
        " L1H2",
        "L1H2 ",
        "L1H2\n",
        "L12345H0",
        "L-1H2",
        "L1.0H2",
    ],
)
def test_anything_else_is_a_value_error_that_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="L<layer>H<head>"):
        parse_head_label(text)

"""One module per attention-block family our module stands in for (TransformerLens keeps one
weight-conversion file per family); ``mhsa.adapters.FAMILIES`` registers them."""

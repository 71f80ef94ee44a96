"""One module per attention-block family our module stands in for (TransformerLens keeps one
weight-conversion file per family); ``mhsa.engine.adapters.FAMILIES`` registers them."""

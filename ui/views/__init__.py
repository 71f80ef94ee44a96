"""One module per feature, mirroring the pages: the values a page shows, computed through
``ui.core`` (queries, models, the shared cache) and ``mhsa``'s public API."""

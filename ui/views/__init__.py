"""One module per feature of the pages (the sidebar's sentence examples, ...)."""

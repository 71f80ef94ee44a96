"""Streamlit-only helpers: shared sidebar, cached model loading, query-parameter state, export."""

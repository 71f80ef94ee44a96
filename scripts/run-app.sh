#!/usr/bin/env bash
# Set up (first time) and serve the app on http://localhost:8501 with the embedded model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m streamlit run app.py "$@"

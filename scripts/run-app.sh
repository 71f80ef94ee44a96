#!/usr/bin/env bash
# Set up (first time) and serve the app on http://localhost:8501 with the embedded model, with the
# production settings (ui/serve.py). `scripts/run-app.sh --dev` turns on live reload for development.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m ui.serve "$@"

#!/usr/bin/env bash
# Set up (first time) and serve the app on http://localhost:8501 with the embedded model, with the
# production settings (ui/serve.py). `scripts/run-app.sh --dev` turns on live reload for development.
# Trained models (and atlases) are kept in MHSA_STORE, by default under the user's cache folder, so
# they survive a restart; MHSA_STORE= (set, empty) keeps them per process, as the library does.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export MHSA_STORE="${MHSA_STORE-$(.venv/bin/python -m mhsa.engine.models.store)}"
exec .venv/bin/python -m ui.serve "$@"

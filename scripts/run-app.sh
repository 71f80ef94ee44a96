#!/usr/bin/env bash
# Set up (first time) and serve the app on http://localhost:8501 with the embedded model, with the
# production settings (ui/serve.py). `scripts/run-app.sh --dev` turns on live reload for development.
# Trained models and atlases are kept in MHSA_STORE, by default under the user's cache folder
# (the folder a shell's `python -m mhsa atlas build --default` fills too), so they survive a
# restart; MHSA_STORE= (set, empty) keeps trained models per process, as the library does.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export MHSA_STORE="${MHSA_STORE-$(.venv/bin/python -m mhsa.engine.models.store)}"
# The app's own atlases, into the store the server reads: the toy models' before it serves
# (seconds; reused once built), the default model's in a process of its own at the first
# start (minutes; the Head atlas page shows its progress and opens it when done). A build
# running or done is not started again.
.venv/bin/python -m mhsa atlas build --default --only toy:induction \
  || echo "run-app: the toy models' atlases could not be built (the Head atlas page offers a build)" >&2
.venv/bin/python -m mhsa atlas build --default --only default --background \
  || echo "run-app: the default model's atlas build did not start (the Head atlas page offers one)" >&2
exec .venv/bin/python -m ui.serve "$@"

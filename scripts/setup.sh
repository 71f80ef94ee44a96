#!/usr/bin/env bash
# Create .venv (Python 3.11) and install the pinned dependencies. Usage: scripts/setup.sh [dev]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if [ "${1:-}" = "dev" ]; then
  .venv/bin/python -m pip install -q -r requirements-dev.txt
else
  .venv/bin/python -m pip install -q -r requirements.txt
fi

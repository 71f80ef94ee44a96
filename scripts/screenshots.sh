#!/usr/bin/env bash
# Refresh the screenshots in docs/ that the README shows (the tests themselves never write there).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
MHSA_SCREENSHOTS=docs HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/browser/test_browser.py -k "screenshot or clicking or knock_outs or line_view"
# The Analyse and Teach pages with an example set (toy models), by link: docs/Head_roles.png ...
HF_HUB_OFFLINE=1 .venv/bin/python -m scripts.screenshots_pages --out docs

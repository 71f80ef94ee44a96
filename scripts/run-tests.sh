#!/usr/bin/env bash
# Set up (first time) and run lint + the whole test suite, browser tests included.
# Needs Debian's chromium and nginx for the browser tests: installed here when missing (as root).
# --fast (first argument): the inner loop, everything but the browser and load tests
# (tests/browser), without installing the browser, on two pytest-xdist workers of one torch
# thread each (under 9 minutes on 2 cores); further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
  set -- --ignore=tests/browser -m "not browser and not load" -n 2 --dist load "$@"
  export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
fi
if [ "$fast" = 0 ] && { [ ! -x /usr/lib/chromium/chromium ] || [ ! -x /usr/sbin/nginx ]; } \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium fonts-dejavu-core nginx-light >/dev/null
fi
scripts/setup.sh dev
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"

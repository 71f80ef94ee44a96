#!/usr/bin/env bash
# The library as a user installs it (issue 50): build the wheel, install it with its declared
# dependencies into a fresh venv outside the checkout (the pins of requirements.txt as
# constraints: they must satisfy pyproject.toml's ranges), then from another folder run the
# console script `mhsa info` and mhsa.attend on the default model and on toy:induction (the toy
# model read from the wheel's mhsa/_data). Called by .ci/run after the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
work=$(mktemp -d)
trap 'rm -rf "$work" "$root/build" "$root/mhsa_explorer.egg-info"' EXIT
"$PY" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$work/venv/bin/python" -m pip wheel -q --no-deps . -w "$work/dist" >"$work/build.log" 2>&1 \
  || { cat "$work/build.log"; exit 1; }  # setuptools warns that data folders look like packages
"$work/venv/bin/python" -m pip install -q -c requirements.txt "$work"/dist/*.whl
ls -l "$work"/dist/*.whl
cd "$work"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$work/venv/bin/mhsa" info --model default
"$work/venv/bin/python" - <<'PY'
import sys
from pathlib import Path

import mhsa
from mhsa.engine.models.names import TOY_DIR

site = Path(sys.prefix).resolve()
assert site in Path(mhsa.__file__).resolve().parents, f"mhsa imported from {mhsa.__file__}"
assert site in TOY_DIR.resolve().parents, f"toy models read from {TOY_DIR}"
r = mhsa.attend("The cat sat on the mat.")
assert r.attention.shape == (6, 12, len(r.tokens), len(r.tokens)), r.attention.shape
toy = mhsa.attend("ba be bi bo ba be bi bo", model="toy:induction")
assert 'class="mhsa-data"' in toy._repr_html_()  # the notebook view's assets are packaged
induction = mhsa.detect_heads(None, "induction", result=toy)["score"]
print(f"default: {r.attention.shape}; toy:induction: {toy.attention.shape}, "
      f"best induction score {induction.max():.2f} ({induction.idxmax()})")
PY
echo "wheel smoke: ok"

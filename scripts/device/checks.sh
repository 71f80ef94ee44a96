#!/usr/bin/env bash
# The GPU checks, on a lent GPU machine, from the repository root, after scripts/device/prepare.sh
# here (device tool: run "bash scripts/device/checks.sh" with carry [".gpu"]). Writes the logs to
# $OUT (BENCHMARKS.md, "GPU checks"). About 3 minutes on an H100.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/.gpu/site:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi -L
python3 -c "import torch, transformers, accelerate; print(torch.__version__, transformers.__version__, accelerate.__version__, torch.cuda.get_device_name())"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_attention_cuda.py \
    tests/test_long_cuda.py tests/test_circuits_cuda.py \
    "tests/test_training.py::test_trains_on_the_gpu_from_the_same_initial_weights" \
    "tests/test_corpus.py::test_batched_on_the_gpu_equals_one_by_one_on_the_cpu" \
    2>&1 | tee "$OUT/tests.log"
timeout 360 python3 -m bench.bench_circuits --device cuda --gpt2-tokens 64 512 \
    --llama-1b-tokens 128 512 2>&1 | tee "$OUT/bench_circuits.log"

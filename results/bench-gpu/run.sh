#!/usr/bin/env bash
# Every GPU check and measurement of the project in one run, sized for under 8 minutes on one H200:
# first the CUDA tests (CUDA-graph decoding equals eager decoding for every mixer pattern, beams included;
# generate's host syncs do not grow with the number of steps; processors never sync), then the GPU
# benchmark grid (configs/bench/gpu.yaml: bf16, CUDA graphs, CTranslate2 float16 and int8_float16,
# transformers' generate(), the equal-memory sweep) into this folder. From the repository root:
#   bash results/bench-gpu/run.sh [OUTPUT_DIR]
#   DRY_RUN=1 bash results/bench-gpu/run.sh OUTPUT_DIR   the same steps on the CPU with the tiny grid (a test runs it)
set -euo pipefail
out=${1:-results/bench-gpu}
mkdir -p "$out"
if [[ ${DRY_RUN:-0} == 1 ]]; then
    bench=(bench=tiny device=cpu dtype=float32 memory_budget_gb=0.001 profile=false)
else
    bench=(bench=gpu)
    python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: use DRY_RUN=1')"
fi
python -m pytest -q -rs -p no:cacheprovider tests/model/test_static_step.py tests/generation/test_engine.py \
    tests/generation/test_processors.py -k "cuda or sync" 2>&1 | tee "$out/cuda-tests.txt"
hybrid bench "${bench[@]}" "output_dir=$out"

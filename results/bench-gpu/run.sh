#!/usr/bin/env bash
# Every GPU check and measurement of the project in one run, sized for under 8 minutes on one H200:
# first the CUDA tests (CUDA-graph decoding equals eager decoding for every mixer pattern, beams included;
# generate's host syncs do not grow with the number of steps; processors never sync), then the GPU
# benchmark grid (configs/bench/gpu.yaml: bf16, CUDA graphs, CTranslate2 float16 and int8_float16,
# transformers' generate(), the equal-memory sweep) into this folder, then beam 4 and top-k sampling at batch 1
# and 32 (beam4/, sampling/). From the repository root:
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
# The same engines with beams and with sampling, at batch 1 and wide: each strategy one interleaved run of its own.
strategy_cells=$([[ ${DRY_RUN:-0} == 1 ]] && echo "[[1,16],[2,24]]" || echo "[[1,128],[32,64]]")
hybrid bench "${bench[@]}" generation.num_beams=4 "cells=$strategy_cells" memory_budget_gb=null profile=false \
    "output_dir=$out/beam4"
hybrid bench "${bench[@]}" generation.do_sample=true generation.top_k=10 "cells=$strategy_cells" \
    memory_budget_gb=null profile=false "output_dir=$out/sampling"

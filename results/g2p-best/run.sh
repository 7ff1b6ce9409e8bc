#!/usr/bin/env bash
# Reproduces this folder: configs/experiment/g2p_best.yaml (the all-LSTM hybrid) and
# g2p_best_transformer.yaml (the all-attention decoder) trained side by side, one thread each, as on the
# 2-core CPU they were sized for (about 60 minutes each, test included), then `hybrid ablate` over both.
# Each run's wall time, from start to the end of its test, goes into wall_time.tsv.
# Run from the repository root: bash results/g2p-best/run.sh   (RUNS=<folder> puts the runs elsewhere;
# SEED=<n> trains another seed; on a GPU: DEVICE=gpu trains with trainer=gpu into results/g2p-best-gpu).
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
runs=${RUNS:-outputs/g2p-best}
seed=${SEED:-0}
out=results/g2p-best
extra=()
if [[ "${DEVICE:-cpu}" == gpu ]]; then
    out=results/g2p-best-gpu
    extra=(trainer=gpu trainer.max_time=null)
fi
mkdir -p "$out"
train() {  # train <experiment>: one run, timed
    local start=$SECONDS
    hybrid fit "experiment=$1" "seed=$seed" "hydra.run.dir=$runs/$1/seed$seed" "${extra[@]}" > "$runs/$1.seed$seed.out" 2>&1
    printf '%s\t%s\t%s\n' "$1" "$seed" "$((SECONDS - start))" >> "$out/wall_time.tsv"
}
mkdir -p "$runs"
[[ -f "$out/wall_time.tsv" ]] || printf 'experiment\tseed\twall_seconds\n' > "$out/wall_time.tsv"
train g2p_best &
train g2p_best_transformer &
wait
hybrid ablate "runs=$runs" "output_dir=$out"
# Each run's validation PER after every check (1,280 words), to see whether it was still falling.
python -c "from hybrid.report.runs import write_validation_curves as write; write('$runs', 'val/per', '$out/validation.csv')"

#!/usr/bin/env bash
# Reproduces this folder: the ablation grid of configs/experiment/ablate_*.yaml on a CPU (seed 0; the
# budgets are in ablate_g2p_lstm.yaml and ablate_recall_lstm.yaml), then `hybrid ablate` over its runs.
# Run from the repository root: bash results/ablations/run.sh  (RUNS=<folder> puts the runs elsewhere).
# G2P runs every arm. Recall leaves out the depth and width arms (G2P has them) to keep the whole grid
# near 20 CPU minutes; RECALL_ARMS=<comma list> picks its arms (e.g. add deep_encoder,param_matched).
set -euo pipefail
# One thread per run: on a shared 2-core machine two threads per run were several times slower per step.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
runs=${RUNS:-outputs/ablations}
g2p_arms=attention,lstm,alternating,attention_last,attention_first,deep_encoder,param_matched,lstm_equal_total
recall_arms=${RECALL_ARMS:-attention,lstm,alternating,attention_last,attention_first,lstm_equal_total}
for task in g2p recall; do
    arms=${task}_arms
    experiments=$(echo "${!arms}" | sed "s/\([a-z_]*\)/ablate_${task}_\1/g")
    # One process runs the arms in turn, each in $runs/$task/<n>_<name>; arm 0 is the transformer.
    hybrid fit -m "experiment=$experiments" "hydra.sweep.dir=$runs/$task"
    hybrid convert "ckpt_path=$runs/$task/0_ablate_${task}_attention/checkpoints/last.ckpt" pattern=lstm \
        "output=$runs/$task/converted.ckpt"
    hybrid fit "experiment=ablate_${task}_convert" "init_from=$runs/$task/converted.ckpt" \
        "hydra.run.dir=$runs/$task/convert"
done
hybrid ablate "runs=$runs" output_dir=results/ablations

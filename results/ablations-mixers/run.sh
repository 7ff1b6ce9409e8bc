#!/usr/bin/env bash
# Reproduces this folder: every registered mixer (hybrid.mixers.MIXERS) as the all-layer decoder on
# the G2P and associative-recall budgets of ablate_g2p_lstm.yaml and ablate_recall_lstm.yaml (seed 0),
# then, on G2P, the conversion table: the all-attention run converted to each constant-state mixer
# and fine-tuned for 20% of its steps (ablate_g2p_convert.yaml), against the same mixer trained from
# scratch for the same total (ablate_g2p_lstm_equal_total.yaml); then `hybrid ablate` over the runs.
# Run from the repository root: bash results/ablations-mixers/run.sh  (RUNS=<folder> puts the runs
# elsewhere, JOBS=<n> runs n at a time; each run uses one thread).
set -euo pipefail
export OMP_NUM_THREADS=1
runs=${RUNS:-outputs/ablations-mixers}
jobs=${JOBS:-2}
mixers=$(python -c "from hybrid import MIXERS; print(' '.join(MIXERS))")
constant=$(python -c "from hybrid import MIXERS; print(' '.join(n for n, m in MIXERS.items() if m.constant_state))")
mkdir -p "$runs"

# Phase 1: every mixer on both tasks, $jobs at a time.
for task in g2p recall; do
    for mixer in $mixers; do
        echo "hybrid fit experiment=ablate_${task}_lstm model.decoder_mixers=$mixer name=ablate_${task}_$mixer" \
             "hydra.run.dir=$runs/$task/$mixer > $runs/${task}_$mixer.log 2>&1"
    done
done | xargs -P "$jobs" -I{} bash -c {}

# Phase 2, on G2P: convert the transformer to each constant-state mixer and fine-tune, and the same
# mixer from scratch at equal total steps.
transformer=$runs/g2p/attention/checkpoints/last.ckpt
for mixer in $constant; do
    echo "hybrid convert ckpt_path=$transformer pattern=$mixer output=$runs/g2p/converted_$mixer.ckpt" \
         "> $runs/convert_$mixer.log 2>&1 && hybrid fit experiment=ablate_g2p_convert" \
         "init_from=$runs/g2p/converted_$mixer.ckpt name=ablate_g2p_convert_$mixer" \
         "hydra.run.dir=$runs/g2p/convert_$mixer >> $runs/convert_$mixer.log 2>&1"
    echo "hybrid fit experiment=ablate_g2p_lstm_equal_total model.decoder_mixers=$mixer" \
         "name=ablate_g2p_${mixer}_equal_total hydra.run.dir=$runs/g2p/${mixer}_equal_total" \
         "> $runs/g2p_${mixer}_equal_total.log 2>&1"
done | xargs -P "$jobs" -I{} bash -c {}

hybrid ablate "runs=$runs" output_dir=results/ablations-mixers

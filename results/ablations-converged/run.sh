#!/usr/bin/env bash
# The G2P ablation grid at a budget where the curves have flattened (issue 15): d_model 128 (3-3
# layers), STEPS (default 2000) steps of 64 words, about 10 minutes per run on one thread of the
# 2-core CPU, every arm on the same 20k-word subset and the same 1k test words. The experiments are the
# grid's own (configs/experiment/ablate_g2p_*.yaml); this script only raises their budget.
#   Seeds 0, 1, 2: all attention, all LSTM, the parameter-matched LSTM (width 71, as
#   hybrid.bench.contenders.parameter_matched_lstm_width solves it at d_model 128), alternating, and
#   convert-then-fine-tune (each seed's transformer, converted to all-LSTM, fine-tuned for 20% of its
#   steps) against the all-LSTM decoder from scratch at equal total steps.
#   Seed 0: 6-1 against 3-3, attention first, attention last, and every other registered mixer.
#   Seeds 0, 1, 2 again: the learning rate (the equal-width LSTM at 1.5e-3 and 1e-3, the parameter-matched
#   one and attention at 1.5e-3, against the grid's 3e-3), since the wider LSTM lost to the narrower.
# Then `hybrid ablate` pools the seeds (mean ± std, significance) into results/ablations-converged/, and
# results/ablations/targets.py checks the grid's targets into its targets.md.
# Run from the repository root: bash results/ablations-converged/run.sh   (RUNS=<folder> puts the runs
# elsewhere, JOBS=<n> runs n at a time, STEPS=<n> sets the budget). About 5 hours of CPU in all, so it
# can run in parts: PART=seeded (the 3-seed arms and the conversions), PART=single (the one-seed arms)
# or PART=lr (the learning rate per width);
# a run whose test metrics are already written is skipped, so a stopped script picks up where it was.
# INCLUDE=<ablations.csv> adds the rows of runs collected before whose folders are gone. The committed
# table was made in three sessions: PART=seeded, then, each time the earlier run folders were gone,
#   PART=single INCLUDE=results/ablations-converged/ablations.csv bash results/ablations-converged/run.sh
#   PART=lr INCLUDE=results/ablations-converged/ablations.csv bash results/ablations-converged/run.sh
set -euo pipefail
export OMP_NUM_THREADS=1
runs=${RUNS:-outputs/ablations-converged}
jobs=${JOBS:-2}
steps=${STEPS:-2000}
fine_tune=$((steps / 5))
budget="model.d_model=128 model.d_ff=512 model.dropout=0.1 trainer.max_steps=$steps"
budget+=" trainer.val_check_interval=$((steps / 10)) module.warmup_steps=$((steps / 10))"
mkdir -p "$runs"

part=${PART:-all}
fit() {  # fit <name> <seed> <overrides...>: one run in $runs/<name>/seed<seed>, logged beside it
    local name=$1 seed=$2
    shift 2
    echo "hybrid fit $budget seed=$seed name=$name hydra.run.dir=$runs/$name/seed$seed $* > $runs/$name.seed$seed.log 2>&1"
}
unless_done() {  # unless_done <name> <seed> <command>: skip a run whose test metrics are written
    echo "grep -qs test/ $runs/$1/seed$2/csv/metrics.csv || { $3; }"
}
skip() { unless_done "$1" "$2" "$(fit "$@")"; }
others=$(python -c "from hybrid import MIXERS; print(' '.join(n for n in MIXERS if n not in ('attention', 'lstm')))")

{   # Phase 1: every arm trained from scratch.
    [[ $part == all || $part == lr ]] && for seed in 0 1 2; do
        for rate in 1.5e-3 1e-3; do
            skip "ablate_g2p_lstm_lr_$rate" "$seed" experiment=ablate_g2p_lstm "module.learning_rate=$rate"
        done
        skip ablate_g2p_param_matched_lr_1.5e-3 "$seed" experiment=ablate_g2p_param_matched \
            model.mixer_options.lstm.hidden_size=71 module.learning_rate=1.5e-3
        skip ablate_g2p_attention_lr_1.5e-3 "$seed" experiment=ablate_g2p_attention module.learning_rate=1.5e-3
    done
    [[ $part == lr ]] && exit 0
    [[ $part == single ]] || for seed in 0 1 2; do
        skip ablate_g2p_attention "$seed" experiment=ablate_g2p_attention
        skip ablate_g2p_lstm "$seed" experiment=ablate_g2p_lstm
        skip ablate_g2p_param_matched "$seed" experiment=ablate_g2p_param_matched model.mixer_options.lstm.hidden_size=71
        skip ablate_g2p_alternating "$seed" experiment=ablate_g2p_alternating
        skip ablate_g2p_lstm_equal_total "$seed" experiment=ablate_g2p_lstm_equal_total \
            "trainer.max_steps=$((steps + fine_tune))"
    done
    [[ $part == seeded ]] && exit 0
    skip ablate_g2p_deep_encoder 0 experiment=ablate_g2p_deep_encoder
    skip ablate_g2p_attention_first 0 experiment=ablate_g2p_attention_first
    skip ablate_g2p_attention_last 0 experiment=ablate_g2p_attention_last
    for mixer in $others; do
        skip "ablate_g2p_$mixer" 0 experiment=ablate_g2p_lstm "model.decoder_mixers=$mixer"
    done
} | xargs -P "$jobs" -I{} bash -c {}

# Phase 2: each seed's transformer converted to all-LSTM and fine-tuned for 20% of its steps.
[[ $part == single || $part == lr ]] || for seed in 0 1 2; do
    converted=$runs/ablate_g2p_attention/seed$seed.lstm.ckpt
    unless_done ablate_g2p_convert "$seed" \
        "hybrid convert ckpt_path=$runs/ablate_g2p_attention/seed$seed/checkpoints/last.ckpt pattern=lstm \
output=$converted > $runs/convert.seed$seed.log 2>&1 && $(fit ablate_g2p_convert "$seed" experiment=ablate_g2p_convert "init_from=$converted" \
            "trainer.max_steps=$fine_tune" "callbacks.freeze_copied_weights.steps=$((fine_tune / 4))" \
            "module.warmup_steps=$((fine_tune / 10))" "trainer.val_check_interval=$((fine_tune / 5))" \
            | sed 's/> \(.*\)$/>> \1/')"
done | xargs -P "$jobs" -I{} bash -c {}

hybrid ablate "runs=$runs" output_dir=results/ablations-converged ${INCLUDE:+"include=$INCLUDE"}
python results/ablations/targets.py results/ablations-converged

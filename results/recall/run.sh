#!/usr/bin/env bash
# Reproduces this folder: associative recall (multi-query, over the decoder's own output; see
# hybrid.training.tasks) at a budget where the attention decoder learns it, to show where a fixed-size
# state falls behind (issue 15). The budget is configs/experiment/ablate_recall_lstm.yaml's: d_model 64,
# 3-3 layers, 1,500 steps of 64 examples, 8 queries, seed 0; every run tests on 500 unseen sources.
#   Phase 1, the grid's own tables of 4-8 keys: every registered mixer as the whole decoder
#   (ablate_recall_<mixer>), and the layout arms (alternating, attention first and last, 6-1 layers,
#   the parameter-matched LSTM, the LSTM trained from scratch for 1,500 + 300 steps); then every mixer
#   with tables of 10 keys (recall_n10_<mixer>), and with the table in the source's order instead of
#   sorted (recall_source_<mixer>, tables of 4-8 keys): a sorted table is a function of the source's
#   letter counts, which a constant state holds whatever the table's length; one in source order is not.
#   Phase 2: the all-attention run converted to all-LSTM and fine-tuned for 300 steps, 20% of its own.
# Run from the repository root: bash results/recall/run.sh   (RUNS=<folder> puts the runs elsewhere,
# JOBS=<n> runs n at a time, one thread each). A run whose test metrics are written is skipped, so a
# stopped script picks up where it was. Then `hybrid ablate` tabulates every run into results/recall/, and
# results/ablations/targets.py checks the grid's targets into results/recall/targets.md.
set -euo pipefail
export OMP_NUM_THREADS=1
runs=${RUNS:-outputs/recall}
jobs=${JOBS:-2}
mkdir -p "$runs"
mixers=$(python -c "from hybrid import MIXERS; print(' '.join(MIXERS))")

fit() {  # fit <name> <overrides...>: one run in $runs/<name>, logged beside it, unless it is done
    local name=$1
    shift
    echo "grep -qs test/ $runs/$name/csv/metrics.csv || hybrid fit $* name=$name hydra.run.dir=$runs/$name" \
         "> $runs/$name.log 2>&1"
}

{
    for mixer in $mixers; do
        fit "ablate_recall_$mixer" experiment=ablate_recall_lstm "model.decoder_mixers=$mixer"
    done
    for arm in alternating attention_first attention_last deep_encoder param_matched lstm_equal_total; do
        fit "ablate_recall_$arm" "experiment=ablate_recall_$arm"
    done
    for mixer in $mixers; do
        fit "recall_n10_$mixer" experiment=ablate_recall_lstm "model.decoder_mixers=$mixer" \
            data.min_length=10 data.max_length=10
    done
    for mixer in $mixers; do
        fit "recall_source_$mixer" experiment=ablate_recall_lstm "model.decoder_mixers=$mixer" data.table_order=source
    done
} | xargs -P "$jobs" -I{} bash -c {}

converted=$runs/ablate_recall_attention.lstm.ckpt
grep -qs test/ "$runs/ablate_recall_convert/csv/metrics.csv" || {
    hybrid convert "ckpt_path=$runs/ablate_recall_attention/checkpoints/last.ckpt" pattern=lstm \
        "output=$converted" > "$runs/convert.log" 2>&1
    bash -c "$(fit ablate_recall_convert experiment=ablate_recall_convert "init_from=$converted" | sed 's/> />> /')"
}

hybrid ablate "runs=$runs" output_dir=results/recall
python results/ablations/targets.py results/recall

# Each run's validation exact match after every check, to see how fast each mixer learns (all reach 1.0).
python -c "from hybrid.report.runs import write_validation_curves as write; write('$runs', 'val/exact_match', 'results/recall/validation.csv')"

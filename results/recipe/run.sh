#!/usr/bin/env bash
# Reproduces this folder: short controlled runs that settle the training recipe (issue 15) before the
# long ones. Every arm changes one thing against its base and trains seeds 0, 1 and 2; `hybrid ablate`
# then pools the seeds (mean ± std) and marks differences inside the seeds' spread as not significant.
#   g2p/: the G2P ablation budget (configs/experiment/ablate_g2p_lstm.yaml: d_model 64, 3-3 layers,
#         500 steps of 64 words): the LSTM's forget-gate bias, learning rate and output projection, the
#         parameter-matched LSTM, the attention decoder at both learning rates, and sources with and
#         without eos.
#   copy/: copying 1-16 letters (configs/experiment/copy_*.yaml) at a fixed step budget, with and
#         without eos on the sources, for both decoders (seed 0; COPY_SEEDS=0,1,2 for more).
# Run from the repository root: bash results/recipe/run.sh   (RUNS=<folder> puts the runs elsewhere;
# ONLY=g2p or ONLY=copy runs one part). Two arms at a time, one thread each (the 2-core machine).
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
runs=${RUNS:-outputs/recipe}
seeds=${SEEDS:-0,1,2}

arm() {  # arm <task> <name> <hybrid fit overrides...>: one configuration, every seed, in $runs/<task>/<name>
    local task=$1 name=$2
    shift 2
    hybrid fit -m "seed=$seeds" "name=$name" "hydra.sweep.dir=$runs/$task/$name" "$@" > /dev/null
}

# The arms up to recipe_g2p_attention_no_source_eos ran before the LSTM's output projection existed:
# they set output_projection=false, the layout they had (equal width: no projection at all).
old_lstm=model.mixer_options.lstm.output_projection=false
g2p_arms=(
    "recipe_g2p_lstm experiment=ablate_g2p_lstm $old_lstm"
    "recipe_g2p_lstm_forget_bias_1 experiment=ablate_g2p_lstm $old_lstm model.mixer_options.lstm.forget_bias=1.0"
    "recipe_g2p_lstm_lr_1e-3 experiment=ablate_g2p_lstm $old_lstm module.learning_rate=1e-3"
    "recipe_g2p_lstm_lr_1e-3_forget_bias_1 experiment=ablate_g2p_lstm $old_lstm module.learning_rate=1e-3 model.mixer_options.lstm.forget_bias=1.0"
    "recipe_g2p_lstm_no_source_eos experiment=ablate_g2p_lstm $old_lstm data.source_eos=false"
    "recipe_g2p_param_matched experiment=ablate_g2p_param_matched"
    "recipe_g2p_param_matched_forget_bias_1 experiment=ablate_g2p_param_matched model.mixer_options.lstm.forget_bias=1.0"
    "recipe_g2p_attention experiment=ablate_g2p_attention"
    "recipe_g2p_attention_lr_1e-3 experiment=ablate_g2p_attention module.learning_rate=1e-3"
    "recipe_g2p_attention_no_source_eos experiment=ablate_g2p_attention data.source_eos=false"
    # What the arms above pointed at: the equal-width LSTM with its output projection (today's default).
    "recipe_g2p_lstm_projected experiment=ablate_g2p_lstm"
)
# The copy budget: 1500 steps, validation every 250, the test on 500 unseen sources of 1-16 letters; the
# 500-step warm-up the committed runs had, a third of the budget (above module.max_warmup_fraction's cap).
copy_budget=(trainer.max_epochs=-1 trainer.max_steps=1500 trainer.check_val_every_n_epoch=null
             trainer.val_check_interval=250 trainer.num_sanity_val_steps=0 trainer.enable_progress_bar=false
             callbacks.progress_bar=null callbacks.early_stopping=null module.decode_batches=null
             +callbacks.training_clock._target_=hybrid.training.callbacks.TrainingClock test_after_fit=true
             module.max_warmup_fraction=null)
copy_arms=(
    "recipe_copy_lstm experiment=copy_hybrid"
    "recipe_copy_lstm_no_source_eos experiment=copy_hybrid data.source_eos=false"
    "recipe_copy_attention experiment=copy_transformer"
    "recipe_copy_attention_no_source_eos experiment=copy_transformer data.source_eos=false"
)

run_arms() {  # run_arms <task> <extra overrides array name> <arms array name>: two arms at a time
    local task=$1
    local -n extra=$2 arms=$3
    for spec in "${arms[@]}"; do
        read -r -a words <<< "$spec"
        arm "$task" "${words[@]}" "${extra[@]}" &
        if (( $(jobs -rp | wc -l) >= 2 )); then wait -n; fi
    done
    wait
}

no_extra=()
if [[ -z "${ONLY:-}" || $ONLY == g2p ]]; then
    run_arms g2p no_extra g2p_arms
    hybrid ablate "runs=$runs/g2p" output_dir=results/recipe/g2p
fi
if [[ -z "${ONLY:-}" || $ONLY == copy ]]; then
    seeds=${COPY_SEEDS:-0}  # the committed copy runs are seed 0
    run_arms copy copy_budget copy_arms
    hybrid ablate "runs=$runs/copy" output_dir=results/recipe/copy
fi

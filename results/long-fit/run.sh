#!/usr/bin/env bash
# Reproduces this folder: the training defaults on a dataset of a real size (issue 27). make_pairs.py writes
# 250,000 English number names and their digits; `hybrid fit data=text` trains the default model on them, as a new
# user would, with a 10-minute max_time, then tests the best checkpoint on the whole test split (12,500 pairs).
# Records the console (console.txt: progress lines, validations, why the fit stopped, the checkpoints), the
# printed test table (output.txt), the logged metrics (metrics.csv), the training time from the first step to
# the end of the fit's last validation (training_clock.json: train_time_s, which the budget bounds) and the
# wall time of the whole command: reading the data, the fit and the test (wall_seconds.txt).
# Run from the repository root: bash results/long-fit/run.sh
# (MAX_TIME=00:00:00:30 PAIRS=20000 OUT=<folder> for a quick check that writes elsewhere).
set -euo pipefail
out=${OUT:-results/long-fit}
max_time=${MAX_TIME:-00:00:10:00}
pairs=outputs/long-fit/pairs.tsv
run=outputs/long-fit/results-run
mkdir -p "$out"
python results/long-fit/make_pairs.py "$pairs" --pairs "${PAIRS:-250000}"
rm -rf "$run"
start=$SECONDS
hybrid fit data=text "data.train_path=$pairs" "trainer.max_time=\"$max_time\"" test_after_fit=true name=long_fit \
    +callbacks.training_clock._target_=hybrid.training.callbacks.TrainingClock "hydra.run.dir=$run" \
    > "$out/output.txt" 2> "$out/console.txt"
echo "$((SECONDS - start))" > "$out/wall_seconds.txt"
cp "$run/csv/metrics.csv" "$run/training_clock.json" "$out/"

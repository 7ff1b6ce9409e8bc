#!/usr/bin/env bash
# Reproduces this folder: the README's main job (`hybrid fit experiment=quickstart`: train, test on the
# 6,246 held-out CMUdict words, print examples), its console output in output.txt and its
# logged metrics in metrics.csv, and its wall time (train, test and examples) in wall_seconds.txt.
# Run from the repository root, in the environment the README's first
# command makes: bash results/quickstart/run.sh
set -euo pipefail
out=results/quickstart
start=$SECONDS
hybrid fit experiment=quickstart hydra.run.dir=outputs/quickstart/results-run > "$out/output.txt"
echo "$((SECONDS - start))" > "$out/wall_seconds.txt"
cp outputs/quickstart/results-run/csv/metrics.csv "$out/metrics.csv"

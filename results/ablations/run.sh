#!/usr/bin/env bash
# Regenerates every committed ablation table and plot, one folder after another (each folder's own
# run.sh says what it trains; together about 10 CPU-hours on the 2-core machine, two runs at a time):
#   results/recipe/             short controlled runs that settled the training recipe (3 seeds an arm)
#   results/ablations-converged/ the G2P grid at d_model 128, 2,000 steps: 3 seeds of the main arms,
#                               one of the layouts and of every other registered mixer, and the
#                               main arms at lower learning rates (3 seeds)
#   results/recall/             associative recall, every mixer and layout at a budget attention learns
#   results/g2p-best/           g2p_best and g2p_best_transformer side by side, about an hour each
# Run from the repository root: bash results/ablations/run.sh   (ONLY="recall g2p-best" runs some of them).
# A folder's runs whose test metrics are written are skipped, so a stopped script picks up where it was.
set -euo pipefail
for part in ${ONLY:-recipe ablations-converged recall g2p-best}; do
    bash "results/$part/run.sh"
done

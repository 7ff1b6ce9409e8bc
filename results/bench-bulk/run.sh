#!/usr/bin/env bash
# Reproduces this folder: trains the Quickstart's G2P model with an LSTM decoder and with an attention
# decoder (same shape and budget), then times bulk decoding with both (`hybrid bench-bulk`, settings in
# configs/bench_bulk.yaml): CMUdict's full word list, the synthetic long-output set, and resident memory
# over one real `hybrid generate` job of every word. Run from the repository root on a quiet machine:
#   bash results/bench-bulk/run.sh      (RUNS=<folder> puts the training runs elsewhere; the committed
# results were made with RUNS=/tmp/bulk/runs, 1 thread, on an otherwise idle 2-core machine)
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
runs=${RUNS:-outputs/bench-bulk}
hybrid fit -m experiment=quickstart,quickstart_attention "hydra.sweep.dir=$runs"
hybrid bench-bulk output_dir=results/bench-bulk \
    "g2p.checkpoints.lstm=$runs/0_quickstart/checkpoints/last.ckpt" \
    "g2p.checkpoints.attention=$runs/1_quickstart_attention/checkpoints/last.ckpt"
# Memory over three passes of the word list (378,156 inputs), to show it levels off: results/bench-bulk/memory/.
hybrid bench-bulk output_dir=results/bench-bulk/memory "modes=[]" synthetic.enabled=false "g2p.decoders=[lstm]" \
    memory.repeat=3 "g2p.checkpoints.lstm=$runs/0_quickstart/checkpoints/last.ckpt"

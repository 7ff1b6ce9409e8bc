#!/usr/bin/env bash
# Reproduces this folder: what int8 weights cost in quality. Trains the Quickstart's G2P model (the
# README's main job), then scores its test split three ways with `hybrid test`: eager PyTorch, the fp32
# fast path (ONNX Runtime) and the int8 fast path. Run from the repository root:
#   bash results/int8-quality/run.sh      (RUNS=<folder> puts the training run elsewhere)
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
runs=${RUNS:-outputs/int8-quality}
out=results/int8-quality
checkpoint=$runs/fit/checkpoints/last.ckpt
# An earlier run's model is scored again as it is: the question is what the decoding path changes.
[[ -f $checkpoint ]] || hybrid fit experiment=quickstart print_examples=0 "hydra.run.dir=$runs/fit"
for mode in eager fp32 int8; do
    case $mode in
        eager) fast=() ;;
        fp32) fast=(optimize=true) ;;
        int8) fast=(optimize=true quantize=int8) ;;
    esac
    hybrid test experiment=quickstart "ckpt_path=$checkpoint" "${fast[@]}" "hydra.run.dir=$runs/test-$mode"
    python - "$runs/test-$mode" "$mode" >> "$out/scores.jsonl" <<'PY'
import csv, json, sys
from pathlib import Path
rows = list(csv.DictReader(open(next(Path(sys.argv[1]).rglob("metrics.csv")))))
scores = {key: float(value) for row in rows for key, value in row.items() if key.startswith("test/") and value}
print(json.dumps({"mode": sys.argv[2], **scores}))
PY
done
python - "$out/scores.jsonl" > "$out/summary.md" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])][-3:]
fp32 = next(row for row in rows if row["mode"] == "fp32")
print("| decoding | test PER | test WER | exact match | PER - fp32 PER |\n|---|---:|---:|---:|---:|")
for row in rows:
    print(f"| {row['mode']} | {row['test/per']:.4f} | {row['test/wer']:.4f} | {row['test/exact_match']:.4f} | "
          f"{row['test/per'] - fp32['test/per']:+.4f} |")
PY
cat "$out/summary.md"

#!/usr/bin/env bash
# Reproduces this folder: what the on-disk cache of the fast graph saves a `hybrid generate optimize=true`
# process (issue 27). The model is results/long-fit's checkpoint (run that first); the input is the first 20
# sources of its test pairs. One process exports the graph and caches it beside the checkpoint
# (<ckpt>.fast/); then eager and cached-fast processes alternate, REPEATS of each, so that drift on a shared
# machine falls on both alike. timings.tsv holds every process's wall seconds, summary.txt the medians and
# their ratio, and outputs must be identical (checked).
# Run from the repository root: bash results/fast-cache/run.sh
set -euo pipefail
out=results/fast-cache
ckpt=${CKPT:-outputs/long-fit/results-run/checkpoints/last.ckpt}
repeats=${REPEATS:-5}
work=outputs/fast-cache
mkdir -p "$work"
head -n 20 outputs/long-fit/pairs.tsv | cut -f1 > "$work/input.txt"
rm -rf "$ckpt.fast" "$work"/*.out "$work"/*.out.parts
timed() {  # timed NAME ARGS...: one hybrid generate process, its wall seconds on a line of timings.tsv
    local name=$1; shift
    local start end
    start=$EPOCHREALTIME
    hybrid generate "ckpt_path=$ckpt" "input=$work/input.txt" "output=$work/$name.out" resume=false "$@" \
        > /dev/null 2>> "$work/console.txt"
    end=$EPOCHREALTIME
    printf '%s\t%s\n' "$name" "$(awk "BEGIN {print $end - $start}")" >> "$out/timings.tsv"
}
printf 'process\twall_seconds\n' > "$out/timings.tsv"
timed fast_export optimize=true
for _ in $(seq "$repeats"); do
    timed eager
    timed fast_cached optimize=true
done
cmp "$work/eager.out" "$work/fast_cached.out"
cmp "$work/eager.out" "$work/fast_export.out"
python - "$out" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(f"{sys.argv[1]}/timings.tsv"), delimiter="\t"))
times = {name: [float(r["wall_seconds"]) for r in rows if r["process"] == name] for name in ("fast_export", "eager", "fast_cached")}
median = {name: statistics.median(values) for name, values in times.items()}
lines = [f"{name}: median {median[name]:.2f} s of {len(times[name])} processes" for name in times]
lines.append(f"fast_cached / eager: {median['fast_cached'] / median['eager']:.2f}x; "
             f"fast_export / fast_cached: {median['fast_export'] / median['fast_cached']:.2f}x")
open(f"{sys.argv[1]}/summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY

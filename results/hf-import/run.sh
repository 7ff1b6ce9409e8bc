#!/usr/bin/env bash
# The same trained weights in every engine (issue 28). From the teacher that train_teacher.py trained with
# transformers' own code (work/teacher/), this:
#   1. imports it (hybrid import) and scores it with hybrid test on the whole G2P test split, with 4 beams
#      (the teacher's own generation default) and greedy (a copy whose generation_config.json says num_beams 1);
#   2. decodes every test word with hybrid generate, both ways, and checks that each prediction equals
#      transformers' generate() (evaluate_transformers.py) to the token, and hybrid test's PER and WER theirs:
#      import_parity.json, and the script fails on any difference;
#   3. exports the imported model back to transformers (hybrid export format=transformers) and converts that
#      folder with CTranslate2's own converter;
#   4. times every engine on the test split (bench_engines.py): engines.json, engines.md, bench.log;
#   5. the students table (issue 29, students.py): the teacher converted to lstm, ssru, aan, t2r and performer, each
#      trained three ways (and the control: the teacher fine-tuned alike) on 4000 of its training words at 320
#      steps, lstm also by sequence-level distillation, then 3 seeds of each mixer's best way: students.json,
#      students.md, students.log;
#   6. the best student of each mixer timed on the fast path beside CTranslate2 running the teacher
#      (bench_engines.py --student): students-speed/engines.json, engines.md, students-speed.log.
# Usage, from the repository root: bash results/hf-import/run.sh   (THREADS=2 by default, for step 4; UNTIL=4 stops
# after step 4)
# Steps 1-3 run on one thread; step 4 holds /tmp/bench_running while it times (a note to the machine's other users).
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=results/hf-import
WORK=$HERE/work
THREADS=${THREADS:-2}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

if [ ! -f "$WORK/teacher/model.safetensors" ]; then
  python "$HERE/train_teacher.py" --minutes 30 2>&1 | tee "$HERE/train.log"
fi
if [ ! -f "$HERE/transformers_quality.json" ] || [ "$HERE/transformers_quality.json" -ot "$WORK/teacher/model.safetensors" ]; then
  python "$HERE/evaluate_transformers.py"  # transformers_predictions_{greedy,beam4}.txt, transformers_quality.json
fi

# 1. Import, and hybrid test with the model's own generation defaults (4 beams) and greedy.
rm -rf "$WORK/imported" "$WORK/imported-greedy" "$WORK"/test-*
hybrid import hf="$WORK/teacher" output="$WORK/imported"
cp -r "$WORK/imported" "$WORK/imported-greedy"
python - "$WORK/imported-greedy/generation_config.json" <<'EOF'
import json, sys
path = sys.argv[1]
options = json.load(open(path))
options["num_beams"] = 1  # hybrid test decodes with the model's generation defaults; this twin's are greedy
open(path, "w").write(json.dumps(options, indent=2, sort_keys=True) + "\n")
EOF
# module.max_new_tokens=63: the teacher's own limit (max_length 64, the decoder start included), as generate() has it.
hybrid test data=g2p ckpt_path="$WORK/imported" module.max_new_tokens=63 hydra.run.dir="$WORK/test-beam4"
hybrid test data=g2p ckpt_path="$WORK/imported-greedy" module.max_new_tokens=63 hydra.run.dir="$WORK/test-greedy"

# 2. The same words through hybrid generate, line by line against transformers' predictions.
python -c "from hybrid.training.data import G2PDataModule
print('\n'.join(word for word, _ in G2PDataModule()._load_pairs()['test']))" > "$WORK/test_words.txt"
for search in greedy:1 beam4:4; do
  hybrid generate ckpt_path="$WORK/imported" input="$WORK/test_words.txt" output="$WORK/hybrid_predictions_${search%%:*}.txt" \
    num_beams="${search##*:}" max_new_tokens=63 progress=false resume=false
done
python - "$HERE" "$WORK" <<'EOF'
import csv, json, sys
from pathlib import Path
here, work = Path(sys.argv[1]), Path(sys.argv[2])
transformers = json.loads((here / "transformers_quality.json").read_text())
parity = {}
for search in ("greedy", "beam4"):
    rows = list(csv.DictReader(open(work / f"test-{search}" / "csv" / "metrics.csv")))
    tested = {name: float(next(row[f"test/{name}"] for row in rows if row.get(f"test/{name}")))
              for name in ("per", "wer")}
    theirs = (here / f"transformers_predictions_{search}.txt").read_text().splitlines()
    ours = (work / f"hybrid_predictions_{search}.txt").read_text().splitlines()
    parity[search] = {
        "hybrid_test": tested,
        "transformers_generate": {name: transformers[search][name] for name in ("per", "wer")},
        "scores_equal": all(abs(tested[name] - transformers[search][name]) < 1e-6 for name in tested),
        "words": len(theirs),
        "hybrid_generate_lines_differing": sum(a != b for a, b in zip(ours, theirs, strict=True)),
    }
(here / "import_parity.json").write_text(json.dumps(parity, indent=2) + "\n")
print(json.dumps(parity, indent=2))
if not all(p["scores_equal"] and p["hybrid_generate_lines_differing"] == 0 for p in parity.values()):
    sys.exit("hybrid and transformers' generate() disagree on the imported teacher: see import_parity.json")
EOF

# 3. Back to transformers, then CTranslate2's converter on the exported folder.
hybrid export ckpt_path="$WORK/imported" output="$WORK/exported" format=transformers
ct2-transformers-converter --model "$WORK/exported" --output_dir "$WORK/ct2" --force

# 4. Every engine, the whole test split, THREADS threads each. Batch 1 greedy is timed on the first 2048 words
# (the same for every engine; transformers' generate() alone would take ~7 minutes over all 6246 on this
# 2-core machine) and its quality is still scored on every word; batch 32 with 4 beams is timed on every word.
touch /tmp/bench_running
trap 'rm -f /tmp/bench_running' EXIT
OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS python "$HERE/bench_engines.py" --threads "$THREADS" \
  --batch1-timed-words 2048 2>&1 \
  | tee "$HERE/bench.log"

[ "${UNTIL:-6}" -le 4 ] && exit 0  # UNTIL=4 bash results/hf-import/run.sh: the same-weights table alone

# 5. The students (one thread per run, two side by side; a run with a result.json is not run again).
python "$HERE/students.py" --ways converted plain transfer distil --seeds 0 --jobs 2 2>&1 | tee "$HERE/students.log"
python "$HERE/students.py" --mixers attention lstm --ways plain seqkd --seeds 0 --jobs 2 2>&1 | tee -a "$HERE/students.log"
python "$HERE/students.py" --best-way-seeds 1 2 --jobs 2 2>&1 | tee -a "$HERE/students.log"

# 6. Each mixer's best student (seed 0) on the fast path, with the teacher's fast path and CTranslate2 beside it.
# shellcheck disable=SC2046  # one --student NAME=PATH option per mixer
OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS python "$HERE/bench_engines.py" --threads "$THREADS" \
  --batch1-timed-words 1024 --engines hybrid-fast-fp32 ct2-float32 ct2-int8 $(python "$HERE/students.py" --best-checkpoints) \
  --out "$HERE/students-speed" --predictions "$WORK/students-speed-predictions" --profile-words 256 2>&1 \
  | tee "$HERE/students-speed.log"

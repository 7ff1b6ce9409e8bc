#!/usr/bin/env bash
# The decoding strategies on the fast path against CTranslate2 (issue 31's cells), at the bench's default
# shape (d_model 256, 3+3 layers, vocabulary 128), one and two intra-op threads, contenders interleaved in each repeat.
# Each strategy is one `hybrid bench` run, so ratios are read within a run, never across runs.
# Usage: bash results/fast-strategies/run.sh [output folder] [default|opus|all]
#   default: the cells below (about 7 minutes on 2 cores); opus: greedy, sampling and beam 4 at OPUS-MT's shape
#   (configs/bench/opus-mt.yaml: d_model 512, 6+6 layers, vocabulary 58,101), about 11 minutes.
set -euo pipefail
out=${1:-results/fast-strategies}
part=${2:-default}
if [[ $part == opus || $part == all ]]; then
    hybrid bench bench=opus-mt output_dir="$out/opus-greedy"
    hybrid bench bench=opus-mt generation.do_sample=true generation.top_k=10 'cells=[[1,64]]' output_dir="$out/opus-sampling"
    hybrid bench bench=opus-mt generation.num_beams=4 output_dir="$out/opus-beam4"
fi
if [[ $part == default || $part == all ]]; then
common=(profile=false repeats=5 huggingface_bart=false "fast=[lstm,attention+kv-cache]"
        "models=[lstm+fast,lstm+int8,attention+kv-cache+fast,bart-ct2-float32,bart-ct2-int8]")
hybrid bench "${common[@]}" threads=1 "cells=[[1,128]]" output_dir="$out/greedy"
hybrid bench "${common[@]}" threads=1 generation.do_sample=true generation.top_k=10 "cells=[[1,128]]" output_dir="$out/sampling"
# Beam 4 with the attention decoder's own eager path too: the fast path must never be slower than it.
hybrid bench "${common[@]/#models=*/models=[lstm+fast,lstm+int8,attention+kv-cache,attention+kv-cache+fast,bart-ct2-float32,bart-ct2-int8]}" \
    threads=1 generation.num_beams=4 "cells=[[1,128],[32,64]]" output_dir="$out/beam4"
# Two intra-op threads for every engine (torch, ONNX Runtime, CTranslate2's intra_threads): greedy and sampling.
hybrid bench "${common[@]}" threads=2 "cells=[[1,128],[32,64]]" output_dir="$out/greedy-2threads"
hybrid bench "${common[@]}" threads=2 generation.do_sample=true generation.top_k=10 "cells=[[1,128],[32,64]]" \
    output_dir="$out/sampling-2threads"
fi
python - "$out" <<'PY'
# Each strategy's ms/token over CTranslate2's at the same precision, from each run's own rows.
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = ["| strategy | batch x tokens | lstm+fast / CT2 fp32 | lstm+int8 / CT2 int8 | attention+fast / CT2 fp32 "
         "| attention+fast / attention eager |", "|---|---|---|---|---|---|"]
for strategy in ("greedy", "sampling", "beam4", "greedy-2threads", "sampling-2threads", "opus-greedy", "opus-sampling",
                 "opus-beam4"):
    if not (out / strategy / "results.json").exists():
        continue
    rows = json.loads((out / strategy / "results.json").read_text())["rows"]
    for batch, tokens in sorted({(r["batch"], r["new_tokens"]) for r in rows}):
        ms = {r["model"]: r["ms_per_token"] for r in rows if (r["batch"], r["new_tokens"]) == (batch, tokens)}
        ratio = lambda a, b: f"{ms[a] / ms[b]:.2f}" if a in ms and b in ms else "-"
        lines.append(f"| {strategy} | {batch} x {tokens} | {ratio('lstm+fast', 'bart-ct2-float32')} | "
                     f"{ratio('lstm+int8', 'bart-ct2-int8')} | {ratio('attention+kv-cache+fast', 'bart-ct2-float32')} | "
                     f"{ratio('attention+kv-cache+fast', 'attention+kv-cache')} |")
(out / "ratios.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY

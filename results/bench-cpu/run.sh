#!/usr/bin/env bash
# The CPU figures the README quotes, from the repository root, one thread, nothing else running:
#   bash results/bench-cpu/run.sh            all three (about 2 hours on the 2-core machine)
#   bash results/bench-cpu/run.sh grid|batch1|routes|overhead|cpp|mixers
# grid:   the default grid (configs/bench/default.yaml) into results/bench-cpu. The CTranslate2 int8 row
#         and the attention fast rows stop at 1024 new tokens: at 64 x 2048 each takes longer than every
#         other row together and no target reads them there.
# batch1: the batch-1 cells the CTranslate2 targets read, again with 7 repeats, because batch-1 timings
#         on this shared machine swing by up to 2x between cells of one run.
# routes: the fast-path routes side by side (eager, ONNX Runtime fp32 and int8, torch.compile) for the
#         decision recorded in hybrid/accel/onnx.py.
# overhead: the same engines on a model so small (d_model 16) that a step's arithmetic is nothing:
#         what is left is each engine's fixed cost per generated token.
# mixers: the decoder of every registered mixer (hybrid.mixers.MIXERS), eager and on the fast path,
#         beside CTranslate2, into results/bench-cpu-mixers (about 15 minutes).
set -euo pipefail
part=${1:-all}
if [[ $part == all || $part == grid ]]; then
    hybrid bench threads=1 output_dir=results/bench-cpu \
        'row_max_new_tokens={bart-ct2-int8: 1024, attention+kv-cache+fast: 1024, attention+kv-cache+int8: 1024}'
fi
if [[ $part == all || $part == batch1 ]]; then
    hybrid bench threads=1 repeats=7 profile=false output_dir=results/bench-cpu-batch1 \
        'models=[lstm,lstm+fast,lstm+int8,attention+kv-cache,attention+kv-cache+fast,bart-hf-generate,bart-ct2-float32,bart-ct2-int8]' \
        'fast=[attention+kv-cache,lstm]' 'cells=[[1,256],[1,1024]]'
fi
if [[ $part == all || $part == routes ]]; then
    hybrid bench threads=1 repeats=5 profile=false huggingface_bart=false inductor=true output_dir=results/fast-routes \
        'fast=[lstm]' 'models=[lstm,lstm+fast,lstm+int8,lstm+inductor,bart-ct2-float32,bart-ct2-int8]' \
        'cells=[[1,256],[8,256],[64,256]]'
fi
if [[ $part == all || $part == overhead ]]; then
    hybrid bench threads=1 repeats=7 profile=false huggingface_bart=false output_dir=results/fast-routes/overhead \
        model.d_model=16 model.n_heads=2 model.d_ff=32 'fast=[attention+kv-cache,lstm]' \
        'models=[lstm,lstm+fast,lstm+int8,attention+kv-cache+fast,bart-ct2-float32,bart-ct2-int8]' 'cells=[[1,256]]'
fi
if [[ $part == all || $part == cpp ]]; then
    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python results/fast-routes/cpp_wrapper.py | tee results/fast-routes/cpp_wrapper.txt
fi
if [[ $part == all || $part == mixers ]]; then
    rows=$(python -c "from hybrid import MIXERS; from hybrid.bench.contenders import mixer_row; print(','.join(map(mixer_row, MIXERS)))")
    hybrid bench threads=1 huggingface_bart=false output_dir=results/bench-cpu-mixers "fast=[$rows]" 'fast_quantize=[null]' \
        'models=all' 'cells=[[1,64],[1,256],[1,1024],[8,256],[64,256]]'
fi

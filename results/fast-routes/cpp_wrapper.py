"""The inductor route with its C++ wrapper, which the bench's `inductor=true` row does not cover:
the default-shape all-LSTM decoder at 1 x 256, greedy, one thread, eager and compiled interleaved,
5 repeats. Run from the repository root (run.sh's `cpp` part):
    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python results/fast-routes/cpp_wrapper.py
"""

import copy
import time

import torch
import torch._inductor.config as inductor_config

from hybrid import ModelConfig, Seq2Seq
from hybrid.bench.contenders import _InductorStep

torch.set_num_threads(1)
inductor_config.cpp_wrapper = True
config = ModelConfig(vocab_size=128, d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3,
                     decoder_mixers=["lstm"] * 3, dropout=0.0, max_positions=4096)
torch.manual_seed(0)
eager = Seq2Seq(config).eval()
compiled = copy.deepcopy(eager)
compiled.accelerator = _InductorStep(compiled)
src = torch.randint(3, 128, (1, 32))
new_tokens = 256
with torch.inference_mode():
    begin = time.perf_counter()
    compiled.generate(src, max_new_tokens=4, min_new_tokens=4)
    print(f"compile: {time.perf_counter() - begin:.1f} s")
    times = {"eager": [], "inductor cpp_wrapper": []}
    for _ in range(5):
        for name, model in zip(times, (eager, compiled), strict=True):
            begin = time.perf_counter()
            model.generate(src, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
            times[name].append(1000 * (time.perf_counter() - begin) / new_tokens)
for name, values in times.items():
    values.sort()
    print(f"{name:22s} {values[2]:.3f} ms/token (median) [{values[0]:.3f}, {values[-1]:.3f}], prefill included")

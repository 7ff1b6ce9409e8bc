"""The encoder and cross-attention keys and values (``Seq2Seq.start``'s work), exported against eager, interleaved.

At the bench's default shape (d_model 256, 3+3 layers, random weights), one thread, median of 40 calls each,
the two calls alternating: ``python results/fast-strategies/memory_ab.py`` (memory-ab.txt holds a run).
"""

import statistics
import time

import torch

from hybrid import ModelConfig, Seq2Seq
from hybrid.accel import Accelerator

torch.set_num_threads(1)
torch.manual_seed(0)
config = ModelConfig(vocab_size=128, d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3,
                     decoder_mixers=["lstm"] * 3, max_positions=4096, dropout=0.0)
model = Seq2Seq(config).eval().optimize_for_inference()
fast = model.accelerator
for batch, length in ((1, 8), (1, 32), (8, 16), (32, 32)):
    src = torch.randint(3, 128, (batch, length))
    with torch.inference_mode():
        ids, mask = model._source(src, None)
        fast.memory(ids, mask)  # the export, once
        times = {"onnxruntime": [], "eager": []}
        for _ in range(40):
            for name, call in (("onnxruntime", fast.memory), ("eager", lambda *a: Accelerator.memory(fast, *a))):
                begin = time.perf_counter()
                call(ids, mask)
                times[name].append(time.perf_counter() - begin)
    ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    print(f"batch {batch} x source {length}: ONNX Runtime {ms['onnxruntime']:.3f} ms, eager {ms['eager']:.3f} ms "
          f"({ms['eager'] / ms['onnxruntime']:.2f}x)")

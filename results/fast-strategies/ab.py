"""ms/token of the LSTM model on the fast path at the bench's default shape, batch 1, 128 new tokens, one thread.

Run it alternately with two versions of hybrid on PYTHONPATH to compare them under the same machine load
(see README.md here): `python ab.py` times greedy decoding, `python ab.py sample` sampling from the top 10.
"""

import statistics
import sys
import time

import torch

import hybrid
from hybrid import ModelConfig, Seq2Seq

torch.set_num_threads(1)
torch.manual_seed(0)
config = ModelConfig(vocab_size=128, d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3,
                     decoder_mixers=["lstm"] * 3, max_positions=4096, dropout=0.0)
model = Seq2Seq(config).eval().optimize_for_inference()
src = torch.randint(3, 128, (1, 32))
options = dict(do_sample=True, top_k=10) if sys.argv[1:] == ["sample"] else {}
model.generate(src, max_new_tokens=64, min_new_tokens=64, **options)  # the export, and a warm-up
times = []
for _ in range(7):
    begin = time.perf_counter()
    model.generate(src, max_new_tokens=128, min_new_tokens=128, **options)
    times.append((time.perf_counter() - begin) / 128 * 1e3)
print(f"{hybrid.__file__}: {'sampling' if options else 'greedy'} {statistics.median(times):.3f} ms/token "
      f"(median of 7; {', '.join(f'{t:.3f}' for t in times)})")

"""ms/token of the LSTM model on the fast path at the bench's default shape, batch 1, 128 new tokens, one thread.

Run it alternately with two versions of hybrid on PYTHONPATH to compare them under the same machine load
(see README.md here): `python ab.py` times greedy decoding, `python ab.py sample` sampling from the top 10,
`python ab.py beam4` beam search with 4 beams; `python ab.py beam4 32 64` 32 sources and 64 new tokens;
`python ab.py beam4 32 64 attention` the same with the attention decoder (a KV cache) instead of the LSTM.
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
                     decoder_mixers=[sys.argv[4] if sys.argv[4:] else "lstm"] * 3, max_positions=4096, dropout=0.0)
model = Seq2Seq(config).eval().optimize_for_inference()
strategy = sys.argv[1] if sys.argv[1:] else "greedy"
batch, tokens = (int(sys.argv[2]), int(sys.argv[3])) if sys.argv[3:] else (1, 128)
options = {"greedy": {}, "sample": dict(do_sample=True, top_k=10), "beam4": dict(num_beams=4)}[strategy]
src = torch.randint(3, 128, (batch, 32))
model.generate(src, max_new_tokens=tokens // 2, min_new_tokens=tokens // 2, **options)  # the export, and a warm-up
times = []
for _ in range(7):
    begin = time.perf_counter()
    model.generate(src, max_new_tokens=tokens, min_new_tokens=tokens, **options)
    times.append((time.perf_counter() - begin) / tokens * 1e3)
print(f"{hybrid.__file__}: {config.decoder_mixers[0]} {strategy} {batch} x {tokens} "
      f"{statistics.median(times):.3f} ms/token (median of 7; {', '.join(f'{t:.3f}' for t in times)})")

"""``hybrid demo``: the benchmark's point in ten seconds, greedy decoding of small random LSTM and attention
decoders of one shape, timed side by side (the full, careful method is :mod:`hybrid.bench.runner`)."""

from __future__ import annotations

import functools
import statistics

import torch

from hybrid.bench.timing import timed
from hybrid.config import ModelConfig
from hybrid.mixers import MIXERS
from hybrid.model import Seq2Seq


def demo(*, batch_size: int, source_length: int, max_new_tokens: int, d_model: int, n_heads: int, vocab_size: int,
         repeats: int, threads: int | None, seed: int, uncached: bool) -> None:
    """Build one random model per registered mixer (``d_model`` wide, FFN 4x, default depths) and print each
    one's median ms per generated token over ``repeats`` runs after a warm-up, decoding ``batch_size`` random
    sources of ``source_length`` tokens for up to ``max_new_tokens``; ``uncached`` adds each mixer whose
    state grows (attention) without its cache (slow). ``threads`` sets torch's thread count (None: leave it)."""
    torch.manual_seed(seed)
    if threads is not None:
        torch.set_num_threads(threads)
    src = torch.randint(3, vocab_size, (batch_size, source_length))
    print(f"batch {batch_size}, source length {source_length}, up to {max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads, median of {repeats} runs after a warm-up")
    # Every registered mixer; the ones whose state grows (attention's KV cache) say so.
    rows = [(f"{name} decoder" + ("" if mixer.constant_state else ", KV cache"), name, True)
            for name, mixer in MIXERS.items()]
    if uncached:
        rows += [(f"{name} decoder, no cache", name, False) for name, mixer in MIXERS.items()
                 if not mixer.constant_state]
    for label, mixers, use_cache in rows:
        config = ModelConfig(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, d_ff=4 * d_model,
                             decoder_mixers=mixers, dropout=0.0)
        model = Seq2Seq(config).eval()
        decode = functools.partial(model.generate, src, max_new_tokens=max_new_tokens, use_cache=use_cache)
        decode()  # warm-up
        timings = []
        for _ in range(repeats):
            seconds, out = timed(src.device, decode)
            timings.append(seconds / out.shape[1])
        print(f"  {label:<30} {1000 * statistics.median(timings):7.3f} ms/token "
              f"({out.shape[1]} steps, {model.num_parameters():,} parameters)")

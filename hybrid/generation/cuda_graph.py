"""Greedy decoding with one decode step captured in a CUDA graph and replayed per token.

A step launches dozens of small kernels; at small batch on a GPU their launch overhead,
not the arithmetic, sets the speed. Because every mixer's state is preallocated and
updated in place, and the attention mixer has a shape-static step (the position lives
on the device), one step can be captured once and replayed with new input tokens, like
mamba's CUDA-graph decoding. The batch is fixed for the whole decode, so finished rows
are not dropped: this is the fixed-length path the benchmark times.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybrid.inputs import check_length, check_token_ids, source_mask


class CUDAGraphStep:
    """One captured ``step_unchecked`` over a fixed :class:`DecodeState`; :meth:`__call__` replays it."""

    def __init__(self, model, state, warmup_steps: int = 2) -> None:
        device = state.memory_mask.device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the state is on {device}")
        self.model, self.state = model, state
        self.tokens = torch.full((state.batch_size,), model.config.bos_id, dtype=torch.long, device=device)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capturing stream, as torch.cuda.graphs asks
            for _ in range(warmup_steps):
                model.step_unchecked(self.tokens, state, self.position)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = model.step_unchecked(self.tokens, state, self.position)
        self.reset()

    def reset(self) -> None:
        """Forget what warm-up and capture wrote: zero every mixer state and rewind the position."""
        for mixer_state in self.state.mixer_states:
            for tensor in mixer_state.tensors():
                tensor.zero_()
        self.position.zero_()

    def __call__(self, tokens: Tensor) -> Tensor:
        self.tokens.copy_(tokens)
        self.graph.replay()
        self.position += 1
        return self.logits  # (B, vocab), overwritten by the next replay


@torch.inference_mode()
def generate_with_cuda_graph(model, src_ids: Tensor, src_mask: Tensor | None = None,
                             max_new_tokens: int = 256) -> Tensor:
    """Greedy decoding of exactly ``max_new_tokens`` tokens through a captured step.

    EOS is not special (every row decodes the full length, as in the benchmark); padding
    and BOS are never generated, as in :func:`hybrid.generation.generate`.
    """
    config = model.config
    src_ids = check_token_ids("src_ids", src_ids, config.vocab_size, ndim=2)
    src_mask = source_mask(src_ids, src_mask, config.pad_id)
    check_length("max_new_tokens", max_new_tokens, config.max_positions, "max_positions")
    state = model.start(src_ids, src_mask, max_new_tokens=max_new_tokens)
    step = CUDAGraphStep(model, state)
    tokens = torch.full((src_ids.shape[0],), config.bos_id, dtype=torch.long, device=src_ids.device)
    output = torch.empty(src_ids.shape[0], max_new_tokens, dtype=torch.long, device=src_ids.device)
    never_generate = torch.tensor(sorted({config.pad_id, config.bos_id} - {config.eos_id}), device=src_ids.device)
    for position in range(max_new_tokens):
        tokens = step(tokens).index_fill(1, never_generate, float("-inf")).argmax(dim=-1)
        output[:, position] = tokens
    return output

"""Decoding with one step captured in a CUDA graph and replayed per token.

A step launches dozens of small kernels; at small batch on a GPU their launch overhead,
not the arithmetic, sets the speed. Because every mixer's state is preallocated and
updated in place, and the attention mixer has a shape-static step (the position lives
on the device), one step can be captured once and replayed with new input tokens, like
mamba's CUDA-graph decoding. The captured batch is fixed, so finished rows are not
dropped: they step on, fed padding, until every row is done. Everything else is
``generate``'s own code, the same strategy over the same :mod:`hybrid.generation.rules`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybrid.generation.config import GenerationConfig
from hybrid.generation.sessions import StaticSession


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
        """Forget what warm-up and capture wrote: every mixer state back to its start, position 0."""
        for mixer_state in self.state.mixer_states:
            mixer_state.reset()
        self.position.zero_()

    def __call__(self, tokens: Tensor) -> Tensor:
        self.tokens.copy_(tokens)
        self.graph.replay()
        self.position += 1
        return self.logits  # (B, vocab), overwritten by the next replay


class CUDAGraphSession(StaticSession):
    """A :class:`StaticSession` whose step is captured on its first call (after any ``expand``) and
    replayed from then on."""

    def __init__(self, model, src_ids: Tensor, src_mask: Tensor | None, max_steps: int) -> None:
        if src_ids.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; src_ids is on {src_ids.device}")
        super().__init__(model, src_ids, src_mask, max_steps)
        self.graph_step: CUDAGraphStep | None = None

    def step(self, tokens: Tensor) -> Tensor:
        if self.graph_step is None:
            self.graph_step = CUDAGraphStep(self.model, self.state)
        return self.graph_step(tokens)


@torch.inference_mode()
def generate_with_cuda_graph(model, src_ids: Tensor, src_mask: Tensor | None = None, **options):
    """:func:`hybrid.generation.generate` (greedy, sampling or beam search, any processor) through a
    captured step, as ``generate`` itself does for a model on a GPU after ``optimize_for_inference()``.

    Beam search reorders the beams of each source in place, so the graph's buffers keep their
    addresses. The batch never shrinks, so this pays off where launches, not rows, set the cost:
    small batches on a GPU.
    """
    from hybrid.generation.engine import decode

    config = GenerationConfig.from_kwargs(**options)
    if not config.use_cache:
        raise ValueError("CUDA-graph decoding steps the cached state; use_cache=False is the uncached loop")
    return decode(model, src_ids, src_mask, config, CUDAGraphSession)

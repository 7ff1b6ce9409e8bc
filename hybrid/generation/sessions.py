"""The ways to get next-token logits while decoding, behind one small interface.

Every search strategy talks only to a session: ``step(tokens) -> logits``,
``reorder(index)`` and ``expand(group_size)``. The cached session drives the
preallocated :class:`DecodeState` (any mixer) through the model's accelerator
(:mod:`hybrid.accel`); the uncached one reruns the decoder over the whole prefix at
every step, which is the crude loop that the fast path is checked and benchmarked
against; the static one steps a batch that never shrinks with the position on the
device, what an accelerator that keeps every row (CUDA graphs,
:mod:`hybrid.accel.cuda_graph`) replays. A session whose ``keeps_every_row`` is True
cannot drop rows: finished rows step on, fed padding, until every row is done.
"""

from __future__ import annotations

import torch
from torch import Tensor


class CachedSession:
    """Step-wise decoding over a :class:`hybrid.state.DecodeState` that ``model.start`` allocated."""

    keeps_every_row = False

    def __init__(self, model, src_ids: Tensor, src_mask: Tensor | None, max_steps: int) -> None:
        self.model = model
        self.state = model.start(src_ids, src_mask, max_steps=max_steps)

    def step(self, tokens: Tensor) -> Tensor:
        return self.model.step_unchecked(tokens, self.state)  # (B, vocab)

    def reorder(self, index: Tensor) -> None:
        self.state.reorder(index)

    def expand(self, group_size: int) -> None:
        self.state.expand(group_size)


class UncachedSession:
    """Reruns the decoder over the whole prefix each step (the encoder still runs once)."""

    keeps_every_row = False

    def __init__(self, model, src_ids: Tensor, src_mask: Tensor | None, max_steps: int) -> None:
        self.model = model
        with torch.inference_mode():
            self.memory, self.key_mask = model.encode(src_ids, src_mask)
        self.prefix = torch.empty(self.memory.shape[0], 0, dtype=torch.long, device=self.memory.device)

    @torch.inference_mode()
    def step(self, tokens: Tensor) -> Tensor:
        self.prefix = torch.cat([self.prefix, tokens[:, None]], dim=1)  # (B, t)
        return self.model.decode(self.prefix, self.memory, self.key_mask)[:, -1]  # (B, vocab)

    def reorder(self, index: Tensor) -> None:
        self.prefix = self.prefix.index_select(0, index)
        self.memory = self.memory.index_select(0, index)
        self.key_mask = self.key_mask.index_select(0, index)

    def expand(self, group_size: int) -> None:
        self.reorder(torch.arange(self.memory.shape[0], device=self.memory.device).repeat_interleave(group_size))


class StaticSession:
    """A batch that keeps every row, stepped with the position on the device (a 0-d tensor).

    No shape or host value changes from one step to the next, so the step can be captured once
    in a CUDA graph and replayed (:class:`hybrid.accel.cuda_graph.CUDAGraphAccelerator`); with the
    eager step it is the same computation, uncaptured, which is how the CPU tests check it.
    """

    keeps_every_row = True

    def __init__(self, model, src_ids: Tensor, src_mask: Tensor | None, max_steps: int) -> None:
        self.model = model
        self.state = model.start(src_ids, src_mask, max_steps=max_steps)
        self.position = torch.zeros((), dtype=torch.long, device=src_ids.device)
        self.steps = 0  # self.position's value, kept on the host too, so that the state can grow without a sync

    def step(self, tokens: Tensor) -> Tensor:
        self.steps += 1
        self.state.reserve(self.steps)
        logits = self.model.step_unchecked(tokens, self.state, self.position)  # (B, vocab)
        self.position += 1
        return logits

    def reorder(self, index: Tensor) -> None:
        """Reorder rows within their sources, in place (beam search): the tensors a captured graph reads
        keep their addresses. Dropping rows, or moving them between sources, is refused."""
        if index.shape[0] != self.state.batch_size or self.state.group_size == 1:
            raise ValueError("a static session keeps every row: it reorders the rows of each source in place "
                             "(beams), but cannot drop rows or reorder sources")
        self.state.reorder_in_place(index)

    def expand(self, group_size: int) -> None:
        self.state.expand(group_size)

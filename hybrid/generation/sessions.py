"""The two ways to get next-token logits while decoding, behind one small interface.

Every search strategy talks only to a session: ``step(tokens) -> logits``,
``reorder(index)`` and ``expand(group_size)``. The cached session drives the
preallocated :class:`DecodeState` (any mixer); the uncached one reruns the decoder over
the whole prefix at every step, which is the crude loop that the fast path is checked
and benchmarked against.
"""

from __future__ import annotations

import torch
from torch import Tensor


class CachedSession:
    """Step-wise decoding over a :class:`hybrid.state.DecodeState` that ``model.start`` allocated."""

    def __init__(self, model, src_ids: Tensor, src_mask: Tensor | None, max_length: int) -> None:
        self.model = model
        self.state = model.start(src_ids, src_mask, max_new_tokens=max_length)

    def step(self, tokens: Tensor) -> Tensor:
        return self.model.step_unchecked(tokens, self.state)  # (B, vocab)

    def reorder(self, index: Tensor) -> None:
        self.state.reorder(index)

    def expand(self, group_size: int) -> None:
        self.state.expand(group_size)


class UncachedSession:
    """Reruns the decoder over the whole prefix each step (the encoder still runs once)."""

    def __init__(self, model, src_ids: Tensor, src_mask: Tensor | None, max_length: int) -> None:
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

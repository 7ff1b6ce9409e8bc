"""DecodeState: everything a decode carries from one step to the next, for one batch."""

from __future__ import annotations

import torch
from torch import Tensor

from hybrid.mixers import MixerState


class DecodeState:
    """One entry per decoder layer (its mixer's own state) plus the cross-attention memory.

    The cross-attention keys/values are projected from the encoder output once, in
    :meth:`hybrid.Seq2Seq.start`, and reused at every step. ``position`` counts the
    tokens fed so far; all rows advance together. The state owns its batch size and
    refuses a step for a different one, instead of silently broadcasting.

    Several rows may decode the same source (beams, or several samples per source):
    :meth:`expand` gives each source ``group_size`` consecutive rows. The memory stays
    one copy per source; the rows of a group attend to it as a block of queries.
    """

    def __init__(self, mixer_states: list[MixerState], cross_keys: list[Tensor], cross_values: list[Tensor],
                 memory_mask: Tensor, max_length: int) -> None:
        self.mixer_states = mixer_states
        self.cross_keys = cross_keys  # per layer: (B, nh, S, hd)
        self.cross_values = cross_values  # per layer: (B, nh, S, hd)
        self.memory_mask = memory_mask  # (B, 1, 1, S) bool, True on real source tokens
        self.max_length = max_length
        self.group_size = 1  # rows per source
        self.position = 0

    @property
    def batch_size(self) -> int:
        """Number of rows (sequences) a step takes: sources x group_size."""
        return self.memory_mask.shape[0] * self.group_size

    def expand(self, group_size: int) -> None:
        """Give every row ``group_size`` consecutive copies (beams, samples); the memory is not copied."""
        rows = torch.arange(self.batch_size, device=self.memory_mask.device)
        for state in self.mixer_states:
            state.reorder(rows.repeat_interleave(group_size))
        self.group_size *= group_size

    def reorder(self, index: Tensor) -> None:
        """Keep and reorder sequences: row ``i`` becomes old row ``index[i]``.

        ``index`` may be shorter than the batch (drop finished sequences). Each state tensor
        is touched by one ``index_select``. With groups (after :meth:`expand`), ``index``
        must keep each source's rows together: an index as long as the batch reorders rows
        within their groups (beam search) and leaves the per-source memory alone; a shorter
        one keeps whole groups, and the memory follows their sources.
        """
        if index.dim() != 1:
            raise ValueError(f"reorder index must be 1-D, got shape {tuple(index.shape)}")
        index = index.to(self.memory_mask.device)
        for state in self.mixer_states:
            state.reorder(index)
        if self.group_size == 1 or index.shape[0] != self.batch_size:
            if index.shape[0] % self.group_size:
                raise ValueError(f"reorder index of length {index.shape[0]} splits a group of "
                                 f"{self.group_size} rows; keep or drop whole groups")
            sources = index[::self.group_size] // self.group_size
            self.cross_keys = [k.index_select(0, sources) for k in self.cross_keys]
            self.cross_values = [v.index_select(0, sources) for v in self.cross_values]
            self.memory_mask = self.memory_mask.index_select(0, sources)

    @property
    def mixer_nbytes(self) -> int:
        """Bytes of the decoder's self-mixing state: the LSTM's (h, c) or the KV cache."""
        return sum(state.nbytes for state in self.mixer_states)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole decoding state: mixer states plus cross-attention keys/values."""
        memory = sum(t.nelement() * t.element_size() for t in [*self.cross_keys, *self.cross_values])
        return self.mixer_nbytes + memory + self.memory_mask.nelement() * self.memory_mask.element_size()

    def __repr__(self) -> str:
        kinds = ", ".join(type(s).__name__ for s in self.mixer_states)
        return (f"DecodeState(batch_size={self.batch_size}, group_size={self.group_size}, position={self.position}, "
                f"max_length={self.max_length}, layers=[{kinds}], nbytes={self.nbytes})")

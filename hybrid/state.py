"""DecodeState: everything a decode carries from one step to the next, for one batch."""

from __future__ import annotations

import torch
from torch import Tensor

from hybrid.mixers import MixerState

# The steps a state whose size grows with the length is first allocated for: small enough that short
# decodes stay cheap, large enough that a long one reallocates only a few times (16, 32, 64, ...).
FIRST_CAPACITY = 16


class DecodeState:
    """One entry per decoder layer (its mixer's own state) plus the cross-attention memory.

    The cross-attention keys/values are projected from the encoder output once, in
    :meth:`hybrid.Seq2Seq.start`, and reused at every step. ``position`` counts the
    tokens fed so far; all rows advance together. The state owns its batch size and
    refuses a step for a different one, instead of silently broadcasting.

    Several rows may decode the same source (beams, or several samples per source):
    :meth:`expand` gives each source ``group_size`` consecutive rows. The memory stays
    one copy per source; the rows of a group attend to it as a block of queries.

    A state whose size depends on the length (a KV cache) is allocated for :attr:`capacity` steps, at
    first at most :data:`FIRST_CAPACITY`, and :meth:`reserve` doubles it as a decode feeds more tokens,
    up to ``max_steps``. A decode that ends early then never reads, writes, copies or attends over
    the positions it did not reach: capacity buckets, as in CTranslate2's and vLLM's growing caches.
    """

    def __init__(self, mixer_states: list[MixerState], cross_keys: list[Tensor], cross_values: list[Tensor],
                 memory_mask: Tensor, max_steps: int, capacity: int) -> None:
        self.mixer_states = mixer_states
        self.cross_keys = cross_keys  # per layer: (B, nh, S, hd)
        self.cross_values = cross_values  # per layer: (B, nh, S, hd)
        self.memory_mask = memory_mask  # (B, 1, 1, S) bool, True on real source tokens
        self.max_steps = max_steps  # the most tokens it can be fed: forced prefix plus new tokens
        self.capacity = capacity  # the steps its mixer states are allocated for (<= max_steps)
        self.group_size = 1  # rows per source
        self.position = 0

    @property
    def batch_size(self) -> int:
        """Number of rows (sequences) a step takes: sources x group_size."""
        return self.memory_mask.shape[0] * self.group_size

    def reserve(self, steps: int) -> None:
        """Make room for ``steps`` tokens fed: when they pass the capacity, double it (at least to ``steps``,
        at most to ``max_steps``, never past it), so that a decode of n tokens reallocates O(log n) times.
        Every loop that steps a state with positions on the device calls this first, with its count of steps
        on the host; it runs at every step, so it only compares until the state must grow."""
        if steps > self.capacity and self.capacity < self.max_steps:
            self._grow(min(self.max_steps, max(steps, 2 * self.capacity)))

    @torch.inference_mode()  # the state's tensors are inference tensors (made by Seq2Seq.start)
    def _grow(self, capacity: int) -> None:
        self.capacity = capacity
        for state in self.mixer_states:
            state.grow(capacity)

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
        if index.dtype in (torch.bool, torch.uint8) or index.is_floating_point() or index.is_complex():
            raise ValueError(f"reorder index must hold integer row numbers, got dtype {index.dtype}")
        # Checked where reading it is free (a CPU index); on a GPU the check would be a host sync at every
        # beam step, so there index_select's own device-side check stands.
        if index.device.type == "cpu" and index.numel() and not bool(((index >= 0) & (index < self.batch_size)).all()):
            raise ValueError(f"reorder index holds rows outside [0, {self.batch_size}) "
                             f"(min {int(index.min())}, max {int(index.max())})")
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

    def reorder_in_place(self, index: Tensor) -> None:
        """Reorder rows within their sources, in place (beam search): row ``i`` becomes old row ``index[i]``,
        ``index`` as long as the batch. Every mixer tensor keeps its address, which a compiled step (a CUDA
        graph, an exported beam step) holds, and the per-source memory is left alone. Unchecked: it runs inside
        compiled steps, where reading the index back would be a host sync."""
        for state in self.mixer_states:
            for tensor in state.tensors():
                tensor.copy_(tensor.index_select(0, index))

    @torch.inference_mode()  # the state's tensors are inference tensors (made by Seq2Seq.start)
    def refill(self, rows: Tensor, fresh: DecodeState, fresh_rows: Tensor | None = None,
               source_length: int | None = None) -> None:
        """Hand the slots ``rows`` to new sources: the memory of ``fresh``'s rows ``fresh_rows`` (all by default).

        This is continuous batching for a fixed-size state: the new sources' memory and
        cross-attention keys/values go into the freed rows and their mixer states restart
        (:meth:`hybrid.mixers.MixerState.reset`), while the other rows keep decoding. Only
        ``fresh``'s memory is read, so it may have been started for any length, and several
        refills can draw on one ``fresh`` state encoded for a block of sources.

        The memory becomes ``source_length`` positions long (default: the longer of the two),
        which must cover every row's real source tokens: a caller that knows its rows' source
        lengths passes their maximum, and the memory never stays longer than its longest row.
        """
        if self.group_size != 1 or fresh.group_size != 1:
            raise ValueError("refill works on states without groups (no beams or samples per source)")
        device = self.memory_mask.device
        rows = rows.to(device)
        fresh_rows = torch.arange(rows.shape[0], device=device) if fresh_rows is None else fresh_rows.to(device)
        if fresh_rows.shape != rows.shape:
            raise ValueError(f"refill needs one fresh row per slot, got {fresh_rows.shape[0]} for {rows.shape[0]}")
        length = source_length or max(self.memory_mask.shape[-1], fresh.memory_mask.shape[-1])

        def copy_in(old: Tensor, new: Tensor, dim: int) -> Tensor:
            return _fit(old, length, dim).index_copy_(0, rows, _fit(new.index_select(0, fresh_rows), length, dim))

        self.cross_keys = [copy_in(k, new, 2) for k, new in zip(self.cross_keys, fresh.cross_keys, strict=True)]
        self.cross_values = [copy_in(v, new, 2) for v, new in zip(self.cross_values, fresh.cross_values, strict=True)]
        self.memory_mask = copy_in(self.memory_mask, fresh.memory_mask, 3)
        for state in self.mixer_states:
            state.reset(rows)

    def trim_source(self, length: int) -> None:
        """Drop the source positions from ``length`` on, which must be padding in every row.

        After refills the memory is as long as the longest source it held; once that row has
        left, trimming makes every cross-attention step cheaper again.
        """
        if length < self.memory_mask.shape[-1]:
            self.cross_keys = [_fit(k, length, 2) for k in self.cross_keys]
            self.cross_values = [_fit(v, length, 2) for v in self.cross_values]
            self.memory_mask = _fit(self.memory_mask, length, 3)

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
                f"max_steps={self.max_steps}, capacity={self.capacity}, layers=[{kinds}], nbytes={self.nbytes})")


def _fit(tensor: Tensor, length: int, dim: int) -> Tensor:
    """``tensor`` with dimension ``dim`` (source positions) cut or zero-padded to ``length``, contiguous."""
    missing = length - tensor.shape[dim]
    if missing < 0:
        return tensor.narrow(dim, 0, length).contiguous()
    if missing == 0:
        return tensor
    padding = list(tensor.shape)
    padding[dim] = missing
    return torch.cat([tensor, tensor.new_zeros(padding)], dim)

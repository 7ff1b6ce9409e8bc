"""The contract every decoder token mixer fulfils.

A mixer is the swappable part of a decoder layer: it mixes information across target
positions (causally). It has two forms that must agree to float precision:

- ``forward(x)``: the parallel, teacher-forced form over a whole target (training);
- ``step(x, state, position)``: advance every sequence by one token, updating the
  state that :meth:`allocate_state` preallocated, in place.

Each mixer owns the class of its state, so the generation engine only ever talks to
the generic :class:`MixerState` interface (``reorder``, ``reset``, ``nbytes``).
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn


@dataclasses.dataclass
class MixerState:
    """Per-layer decoding state: every tensor field has the batch on dimension 0."""

    def reorder(self, index: Tensor) -> None:
        """Keep and reorder sequences: row ``i`` becomes old row ``index[i]`` (one index_select each)."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name).index_select(0, index))

    def reset(self, rows: Tensor) -> None:
        """Return ``rows`` to the state :meth:`Mixer.allocate_state` starts from: zeros. A mixer whose
        initial state is not zero overrides this. Continuous refill calls it for rows handed to new sources."""
        for tensor in self.tensors():
            tensor.index_fill_(0, rows, 0)

    @property
    def nbytes(self) -> int:
        return sum(t.nelement() * t.element_size() for t in self.tensors())

    def tensors(self) -> list[Tensor]:
        return [getattr(self, field.name) for field in dataclasses.fields(self)]


class Mixer(nn.Module):
    """Base class of decoder token mixers; subclasses register themselves in ``hybrid.mixers.MIXERS``."""

    def forward(self, x: Tensor) -> Tensor:
        """Causal mixing over a whole target: (B, T, D) -> (B, T, D)."""
        raise NotImplementedError

    def allocate_state(self, batch_size: int, max_length: int, device, dtype) -> MixerState:
        """Preallocate the state for ``batch_size`` sequences of up to ``max_length`` steps."""
        raise NotImplementedError

    def step(self, x: Tensor, state: MixerState, position: int | Tensor) -> Tensor:
        """One token per sequence: (B, D) at ``position`` -> (B, D); updates ``state`` in place.

        ``position`` is an int when stepping eagerly, or a 0-d device tensor when the step is
        captured in a CUDA graph; then no shape may depend on it.
        """
        raise NotImplementedError

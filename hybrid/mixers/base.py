"""The contract every decoder token mixer fulfils.

A mixer is the swappable part of a decoder layer: it mixes information across target
positions (causally). It has two forms that must agree to float precision:

- ``forward(x)``: the parallel, teacher-forced form over a whole target (training);
- ``step(x, state, position)``: advance every sequence by one token, updating the
  state that :meth:`allocate_state` preallocated, in place.

Each mixer owns the class of its state, so the generation engine only ever talks to
the generic :class:`MixerState` interface (``reorder``, ``reset``, ``nbytes``). A state
is allocated for ``max_steps`` steps: the most tokens a decode feeds (a forced prefix
plus the new tokens), the one name for its capacity everywhere.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

Position = int | Tensor
"""Where a step writes, in one of three forms that every mixer handles (or refuses with a ValueError):

- an ``int``: every row at the same position, known on the host (eager decoding);
- a 0-d device tensor: every row at the same position, with no shape depending on it, so that the
  step can be captured in a CUDA graph and replayed as the position advances;
- a (B,) device tensor: each row at its own position (continuous refill hands finished rows to new
  sources, which start again at 0).
"""


@dataclasses.dataclass
class MixerState:
    """Per-layer decoding state: every tensor field has the batch on dimension 0."""

    def reorder(self, index: Tensor) -> None:
        """Keep and reorder sequences: row ``i`` becomes old row ``index[i]`` (one index_select each)."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name).index_select(0, index))

    def reset(self, rows: Tensor | None = None) -> None:
        """Return ``rows`` (every row by default) to the state :meth:`Mixer.allocate_state` starts from:
        zeros. A mixer whose initial state is not zero overrides this. Continuous refill calls it for
        rows handed to new sources, and CUDA-graph decoding for the whole batch after its capture."""
        for tensor in self.tensors():
            if rows is None:
                tensor.zero_()
            else:
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

    def allocate_state(self, batch_size: int, max_steps: int, device, dtype) -> MixerState:
        """Preallocate the state for ``batch_size`` sequences of up to ``max_steps`` steps."""
        raise NotImplementedError

    def step(self, x: Tensor, state: MixerState, position: Position) -> Tensor:
        """One token per sequence: (B, D) at ``position`` (see :data:`Position`) -> (B, D); updates
        ``state`` in place. With a tensor position no shape may depend on its value."""
        raise NotImplementedError

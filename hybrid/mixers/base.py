"""The contract every decoder token mixer fulfils.

A mixer is the swappable part of a decoder layer: it mixes information across target
positions (causally). It has two forms that must agree to float precision:

- ``forward(x)``: the parallel, teacher-forced form over a whole target (training);
- ``step(x, state, position)``: advance every sequence by one token, updating the
  state that :meth:`allocate_state` preallocated, in place.

Each mixer owns the class of its state, so the generation engine only ever talks to
the generic :class:`MixerState` interface (``reorder``, ``reset``, ``grow``, ``nbytes``). A state
is allocated for a number of steps, its capacity; a state whose size depends on it (a KV cache)
grows by :meth:`MixerState.grow` as a decode feeds more tokens (:meth:`hybrid.state.DecodeState.reserve`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

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

    # The dimension of every tensor that is sized by the capacity in steps (a KV cache's positions), or
    # None for a state of fixed size; an export leaves it dynamic.
    steps_dim: ClassVar[int | None] = None

    def reorder(self, index: Tensor) -> None:
        """Keep and reorder sequences: row ``i`` becomes old row ``index[i]`` (one index_select each)."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name).index_select(0, index))

    def reset(self, rows: Tensor | None = None) -> None:
        """Return ``rows`` (every row by default) to the state :meth:`Mixer.allocate_state` starts from:
        zeros. A mixer whose initial state is not zero overrides this. Continuous refill calls it for
        rows handed to new sources."""
        for tensor in self.tensors():
            if rows is None:
                tensor.zero_()
            else:
                tensor.index_fill_(0, rows, 0)

    def grow(self, capacity: int) -> None:
        """Make room for ``capacity`` steps along :attr:`steps_dim`: new tensors, the filled steps copied in,
        the rest zero. Nothing for a state of fixed size."""
        if self.steps_dim is None:
            return
        for field in dataclasses.fields(self):
            old = getattr(self, field.name)
            shape = list(old.shape)
            shape[self.steps_dim] = capacity
            new = old.new_zeros(shape)
            new.narrow(self.steps_dim, 0, old.shape[self.steps_dim]).copy_(old)
            setattr(self, field.name, new)

    @property
    def nbytes(self) -> int:
        return sum(t.nelement() * t.element_size() for t in self.tensors())

    def tensors(self) -> list[Tensor]:
        return [getattr(self, field.name) for field in dataclasses.fields(self)]


@dataclasses.dataclass(frozen=True)
class MixerOptions:
    """A mixer's own hyperparameters (none here): a subclass per mixer, as ``Mixer.Options``.

    ``ModelConfig.mixer_options`` keeps them as plain data, ``{mixer name: {option: value}}``, so a
    new mixer adds options without adding a field to the shared config. A subclass checks its values
    in ``__post_init__`` with :mod:`hybrid.validators`, whose messages start with the option's name, so
    :meth:`from_dict` can prefix where it sits (``mixer_options.lstm.hidden_size must be ...``).
    """

    @classmethod
    def from_dict(cls, data: object, where: str) -> MixerOptions:
        """The options in ``data`` (a dict; missing ones take their defaults); ``where`` names it in errors."""
        allowed = [field.name for field in dataclasses.fields(cls)]
        if not isinstance(data, dict):
            raise ValueError(f"{where} must be a dict of options (allowed: {allowed}), got {data!r}")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ValueError(f"{where}: unknown options {unknown}; allowed: {allowed}")
        try:
            return cls(**data)
        except ValueError as error:
            raise ValueError(f"{where}.{error}") from None

    @classmethod
    def from_saved(cls, data: object) -> object:
        """Options as a saved config holds them, in today's form: an option added later is set to what the
        saved layout built, where its default would build another. Here nothing; a subclass that adds
        such an option says it. (``data`` is checked later, by :meth:`from_dict`.)"""
        return data

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Mixer(nn.Module):
    """Base class of decoder token mixers; subclasses register themselves in ``hybrid.mixers.MIXERS``.

    ``Options`` is the class of the mixer's own hyperparameters; the constructor receives the
    shared config and an instance of it.

    Dropout on the mixer's output belongs to the decoder layer, which applies it once to every mixer's
    branch alike: a mixer never drops its own output (it may drop inside, as attention drops its
    weights), or its arm of an ablation would train with about twice the dropout of the others.
    """

    Options: ClassVar[type[MixerOptions]] = MixerOptions
    # Whether the state's size is fixed, whatever the length decoded (a KV cache's is not): the
    # property the project is about, declared by each mixer and checked by the tests.
    constant_state: ClassVar[bool] = True
    # What `hybrid convert` keeps when a layer's mixer becomes this one: {old mixer: names of the
    # submodules it shares with this one, same names and shapes}, copied bit for bit; everything else
    # in the new mixer is freshly initialised.
    carried_over: ClassVar[dict[str, tuple[str, ...]]] = {}

    def forward(self, x: Tensor) -> Tensor:
        """Causal mixing over a whole target: (B, T, D) -> (B, T, D)."""
        raise NotImplementedError

    def allocate_state(self, batch_size: int, max_steps: int, device, dtype) -> MixerState:
        """Preallocate the state for ``batch_size`` sequences of up to ``max_steps`` steps (its capacity,
        which :meth:`MixerState.grow` may raise later)."""
        raise NotImplementedError

    def step(self, x: Tensor, state: MixerState, position: Position) -> Tensor:
        """One token per sequence: (B, D) at ``position`` (see :data:`Position`) -> (B, D); updates
        ``state`` in place. With a tensor position no shape may depend on its value."""
        raise NotImplementedError

"""The decoding-accelerator interface: what steps a model's decoder, and how generation asks it to.

Every path that decodes token by token (``generate``'s greedy decoding, sampling and beam search,
continuous refill, and so the bulk job) steps the model through one object, ``model.accelerator``:

- :class:`Eager`, every model's own: the step in PyTorch;
- :class:`hybrid.accel.onnx.OnnxAccelerator`, which :meth:`hybrid.Seq2Seq.optimize_for_inference` installs
  on a CPU: the step exported to ONNX and run by ONNX Runtime;
- :class:`hybrid.accel.cuda_graph.CUDAGraphAccelerator`, which it installs on a GPU: the step captured in
  a CUDA graph and replayed.

Generation asks an accelerator for one of three things. :meth:`Accelerator.step` feeds one token per row
and returns the logits (every strategy, any rules). :meth:`Accelerator.advance` moves rows that each sit
at their own position one token on (:func:`hybrid.generation.stepping.advance`: step, choose by the rules,
record), and :meth:`Accelerator.advance_beams` moves beam search one token on
(:func:`hybrid.generation.beams.advance_beams`: step, rules, choice of beams, reorder of the state);
where :meth:`Accelerator.advances` says so, each is one call into the compiled step, rules and all, else
it is the step and the rules in Python. :attr:`Accelerator.keeps_every_row` says whether the
batch must keep its shape (a CUDA graph's), so that finished rows step on instead of leaving.

Like mamba's decoding cache (one cache on the model, a CUDA graph per batch size and length, captured
once and replayed by every later decode), what an accelerator compiles stays in
:attr:`Accelerator.compiled`, keyed by the shape it serves, :func:`shape_key`: a later decode of the same
shape replays it. An accelerator talks to the rules only through :class:`~hybrid.generation.rules.DecodingRules`'
public interface.
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TypeVar

from torch import Tensor

from hybrid.generation.beams import Beams, advance_beams
from hybrid.generation.stepping import Rows, advance
from hybrid.state import DecodeState

Compiled = TypeVar("Compiled")


class Accelerator(ABC):
    """What steps a model's decoder; subclasses run the same step faster (see the module's docstring)."""

    keeps_every_row = False  # True: its step serves one batch shape, so finished rows step on, fed padding
    max_compiled = 64  # entries of :attr:`compiled`; the oldest goes first, since decodes of new shapes keep coming

    def __init__(self, model) -> None:
        self.model = model
        self.compiled: dict[tuple, object] = {}  # what it made per shape (shape_key, with its kind of call)
        self.setup_seconds = 0.0  # time spent making them: exports, loads from a cache, captures

    @abstractmethod
    def step(self, tokens: Tensor, state: DecodeState, position: int | Tensor) -> Tensor:
        """``Seq2Seq.eager_step``'s logits (rows, vocab) for ``tokens`` (rows,) fed at ``position`` (see
        :data:`hybrid.mixers.base.Position`), updating ``state`` in place as it does."""

    def memory(self, src_ids: Tensor, key_mask: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """``Seq2Seq.eager_memory``: the encoder and every layer's cross-attention keys and values, once per
        source (``Seq2Seq.start``)."""
        return self.model.eager_memory(src_ids, key_mask)

    def advances(self, rules) -> bool:
        """Whether :meth:`advance` runs these rules inside the compiled step: one call per token."""
        return False

    def advance(self, rules, state: DecodeState, rows: Rows) -> None:
        """Step every row of ``rows`` once and apply ``rules``, in place
        (:func:`~hybrid.generation.stepping.advance` over :meth:`step`)."""
        advance(self.step, rules, state, rows)

    def advance_beams(self, rules, state: DecodeState, beams: Beams, generated: int) -> None:
        """One beam-search step of every group, in place (:func:`~hybrid.generation.beams.advance_beams` over
        :meth:`step`), ``generated`` tokens into the search; one call where :meth:`advances` says so."""
        advance_beams(self.step, rules, state, beams, generated)

    def check_weights(self) -> None:
        """Raise if the model's weights changed in a way that what it compiled would not decode
        (``Seq2Seq.start`` asks before every decode); nothing here holds weights of its own."""
        return None

    def _cached(self, key: tuple, make: Callable[[], Compiled]) -> Compiled:
        """``compiled[key]``, made (and timed into :attr:`setup_seconds`) the first time it is asked for."""
        if key not in self.compiled:
            if len(self.compiled) >= self.max_compiled:
                del self.compiled[next(iter(self.compiled))]
            begin = time.perf_counter()
            self.compiled[key] = make()
            self.setup_seconds += time.perf_counter() - begin
        return self.compiled[key]


class Eager(Accelerator):
    """The step in PyTorch, as :meth:`hybrid.Seq2Seq.eager_step` computes it: every model's own accelerator."""

    def step(self, tokens: Tensor, state: DecodeState, position: int | Tensor) -> Tensor:
        return self.model.eager_step(tokens, state, position)


def shape_key(state: DecodeState) -> tuple[int, int, int]:
    """The shape a compiled step serves: (rows, rows per source, capacity in steps)."""
    return state.batch_size, state.group_size, state.capacity


def mixer_tensors(state: DecodeState) -> list[Tensor]:
    """Every mixer state tensor of every layer, layer by layer, in each state's field order."""
    return [tensor for mixer_state in state.mixer_states for tensor in mixer_state.tensors()]


def assign_mixer_tensors(state: DecodeState, tensors: list[Tensor]) -> None:
    """Make ``tensors`` (in :func:`mixer_tensors`' order) the state's mixer tensors."""
    remaining = iter(tensors)
    for mixer_state in state.mixer_states:
        for field in dataclasses.fields(mixer_state):
            setattr(mixer_state, field.name, next(remaining))


def state_tensors(state: DecodeState) -> list[Tensor]:
    """Every tensor of a state: the memory mask, each layer's cross-attention keys, then values, then the
    mixer tensors (:func:`mixer_tensors`)."""
    return [state.memory_mask, *state.cross_keys, *state.cross_values, *mixer_tensors(state)]


def assign_state_tensors(state: DecodeState, tensors: list[Tensor]) -> None:
    """Make ``tensors`` (in :func:`state_tensors`' order) the state's tensors."""
    layers = len(state.mixer_states)
    state.memory_mask = tensors[0]
    state.cross_keys, state.cross_values = list(tensors[1:1 + layers]), list(tensors[1 + layers:1 + 2 * layers])
    assign_mixer_tensors(state, tensors[1 + 2 * layers:])

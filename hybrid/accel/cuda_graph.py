"""The fast path on a GPU: the decoder step, or a whole advance (greedy or sampled), captured in a CUDA graph.

A step launches dozens of small kernels; at small batch on a GPU their launch overhead, not the
arithmetic, sets the speed. Every mixer's state is preallocated and updated in place, and every mixer
has a shape-static step (the position lives on the device), so a step can be captured once and
replayed, like mamba's CUDA-graph decoding. A graph reads and writes fixed addresses, so each one owns
static buffers: a :class:`~hybrid.state.DecodeState`, the rows of an advance, and the step's own
inputs and outputs. A decode's state is copied into them at its first step and then points at them,
so every later step replays with nothing copied but its tokens and positions.

The graphs stay in :attr:`CUDAGraphAccelerator.compiled`, one per kind of call and (rows, rows per source,
capacity): a later decode of the same shape replays them, never captures again. The source length is
not in the key: a graph's memory is padded, masked, to the power of two that covers its source, and a
longer source captures again at a longer one. A graph's batch is fixed, so the accelerator keeps every
row (:attr:`~hybrid.accel.Accelerator.keeps_every_row`): finished rows step on, fed padding, until every
row is done, and continuous refill hands their slots to new sources in place.

:func:`_capture` and :func:`_check_device` are the only code that needs a GPU; the tests put stand-ins
in their place to run everything else on a CPU.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from hybrid.accel import Accelerator, assign_state_tensors, shape_key, state_tensors
from hybrid.generation.stepping import Rows, advance
from hybrid.state import DecodeState


class CUDAGraphAccelerator(Accelerator):
    """A model's steps and advances (greedy or sampled), each shape captured once in a CUDA graph and replayed."""

    keeps_every_row = True
    max_compiled = 16  # each graph holds a decoding state of its own: keep fewer than the default

    def __init__(self, model, warmup_steps: int = 2) -> None:
        _check_device(next(model.parameters()).device)
        super().__init__(model)
        self.warmup_steps = warmup_steps
        self.captures = 0  # graphs captured so far: a decode of a shape seen before adds none
        self._parameters = _parameter_addresses(model)

    def check_weights(self) -> None:
        """A graph reads the parameters where they were at its capture: weights changed in place are read,
        but parameters that moved (``model.to``, a load that assigns new tensors) would leave it reading
        freed memory, so then every graph is dropped, to be captured again."""
        addresses = _parameter_addresses(self.model)
        if addresses != self._parameters:
            self.compiled.clear()
            self._parameters = addresses

    @torch.inference_mode()
    def step(self, tokens: Tensor, state: DecodeState, position: int | Tensor) -> Tensor:
        per_row = isinstance(position, Tensor) and position.dim() == 1
        graph = self._graph(("step", per_row), state, None, self._step_capture(per_row))
        graph.take(state)
        graph.inputs["tokens"].copy_(tokens)
        if isinstance(position, Tensor):
            graph.inputs["position"].copy_(position)
        else:
            graph.inputs["position"].fill_(position)
        graph.replay()
        return graph.inputs["logits"].clone()  # the buffer is overwritten by the next replay

    def advances(self, rules) -> bool:
        """Rules that read only the newest scores and lengths, greedy or sampled, run inside the graph
        (``DecodingRules.runs_in_graph``): no host reads, and every id and setting they use is a constant
        of the graph. A sample's noise is drawn into a buffer of the graph before each replay."""
        return rules.runs_in_graph

    @torch.inference_mode()
    def advance(self, rules, state: DecodeState, rows: Rows) -> None:
        """:func:`hybrid.generation.stepping.advance` of every row in one replay where :meth:`advances`
        says so; else the captured step, with the rules in Python."""
        if not self.advances(rules):
            super().advance(rules, state, rows)
            return
        kind = ("advance", *rules.graph_signature, rows.outputs.shape[1])
        graph = self._graph(kind, state, rows, self._advance_capture(rules))
        graph.take(state, rows)
        graph.set_limits(rules.min_new_tokens, rules.max_new_tokens)
        if "noise" in graph.inputs:
            rules.sampling_noise(graph.inputs["noise"])  # drawn as the eager step's torch.multinomial draws it
        graph.replay()

    def _graph(self, kind: tuple, state: DecodeState, rows: Rows | None,
               capture: Callable[[_Graph], Callable[[], None]]) -> _Graph:
        """The graph of ``kind`` for this state's shape: the one captured before, unless its memory is
        shorter than this state's source; else captured now."""
        key = (*kind, *shape_key(state))
        source_length = state.memory_mask.shape[-1]
        graph = self.compiled.get(key)
        if graph is not None and graph.source_length < source_length:
            del self.compiled[key]
        padded = min(self.model.config.max_positions, 1 << (source_length - 1).bit_length())
        return self._cached(key, lambda: self._capture(_Graph(state, rows, padded), capture))

    def _capture(self, graph: _Graph, capture: Callable[[_Graph], Callable[[], None]]) -> _Graph:
        graph.replay = _capture(capture(graph), graph.state.memory_mask.device, self.warmup_steps)
        self.captures += 1
        return graph

    def _step_capture(self, per_row: bool) -> Callable[[_Graph], Callable[[], None]]:
        """What a step's graph runs: the eager step on its buffers, the logits copied into one of them."""
        model = self.model

        def capture(graph: _Graph) -> Callable[[], None]:
            rows, device = graph.state.batch_size, graph.state.memory_mask.device
            dtype = next(model.parameters()).dtype
            graph.inputs = {"tokens": torch.full((rows,), model.config.bos_id, dtype=torch.long, device=device),
                            "position": torch.zeros((rows,) if per_row else (), dtype=torch.long, device=device),
                            "logits": torch.empty(rows, model.config.vocab_size, dtype=dtype, device=device)}
            inputs = graph.inputs
            return lambda: inputs["logits"].copy_(model.eager_step(inputs["tokens"], graph.state, inputs["position"]))

        return capture

    def _advance_capture(self, rules) -> Callable[[_Graph], Callable[[], None]]:
        """What an advance's graph runs: :func:`advance` over the eager step, with the length limits read
        from two of its buffers, so that one graph serves every ``max_new_tokens``, and when sampling the
        noise from a third."""
        model = self.model

        def capture(graph: _Graph) -> Callable[[], None]:
            device = graph.state.memory_mask.device
            graph.inputs = {name: torch.zeros((), dtype=torch.long, device=device)
                            for name in ("min_new_tokens", "max_new_tokens")}
            noise = None
            if rules.config.do_sample:  # ones for the warm-up, which must not advance the user's generator
                noise = graph.inputs["noise"] = torch.ones(graph.state.batch_size, model.config.vocab_size,
                                                           device=device)
            graph.set_limits(rules.min_new_tokens, rules.max_new_tokens)  # the warm-up steps need real ones
            # Made once, outside the graph: the rules' own tensors (EOS ids, masks) come into being at the
            # warm-up and are read from the same addresses at every replay.
            limited = rules.with_length_limits(graph.inputs["min_new_tokens"], graph.inputs["max_new_tokens"])
            return lambda: advance(model.eager_step, limited, graph.state, graph.rows, noise)

        return capture


class _Graph:
    """One captured call and the static buffers it reads and writes: a state, rows, and its own inputs.

    The buffers start as a copy of the state (and rows) it was captured for, its memory padded to
    ``source_length`` positions. :meth:`take` lends them to a decode's state and rows.
    """

    def __init__(self, state: DecodeState, rows: Rows | None, source_length: int) -> None:
        self.source_length = source_length
        self.state = copy.copy(state)
        self.state.mixer_states = [copy.copy(mixer_state) for mixer_state in state.mixer_states]
        memory = [_padded(tensor, source_length, dim) for tensor, dim in _memory(state)]
        assign_state_tensors(self.state, [*memory, *(tensor.clone() for tensor in state_tensors(state)[len(memory):])])
        self.rows = None if rows is None else Rows(*(tensor.clone() for tensor in _tensors(rows)))
        self.inputs: dict[str, Tensor] = {}
        self.replay: Callable[[], None] = lambda: None
        self._limits: tuple[int, int] | None = None
        self._owners: list[tuple[weakref.ref, DecodeState | Rows]] = []  # who points at which buffers

    def take(self, state: DecodeState, rows: Rows | None = None) -> None:
        """Make ``state`` (and ``rows``) decode in this graph's buffers: copy them in and point them at the
        buffers, unless they already are. Whoever held the buffers before gets copies of its own first,
        so two decodes of one shape that take turns stay apart."""
        holders = [state] if rows is None else [state, rows]
        buffers = [self.state] if rows is None else [self.state, self.rows]
        if all(_same(_tensors(holder), _tensors(held)) for holder, held in zip(holders, buffers, strict=True)):
            return
        for reference, held in self._owners:
            owner = reference()
            if owner is not None and all(owner is not holder for holder in holders) and \
                    _same(_tensors(owner), _tensors(held)):
                _assign(owner, [tensor.clone() for tensor in _tensors(owner)])
        memory = _memory(state)
        for (buffer, dim), (tensor, _) in zip(_memory(self.state), memory, strict=True):
            buffer.zero_().narrow(dim, 0, tensor.shape[dim]).copy_(tensor)  # padding past the source stays masked
        for buffer, tensor in zip(_tensors(self.state)[len(memory):], _tensors(state)[len(memory):], strict=True):
            buffer.copy_(tensor)
        if rows is not None:
            for buffer, tensor in zip(_tensors(self.rows), _tensors(rows), strict=True):
                buffer.copy_(tensor)
        for holder, held in zip(holders, buffers, strict=True):
            _assign(holder, _tensors(held))
        self._owners = [(weakref.ref(holder), held) for holder, held in zip(holders, buffers, strict=True)]

    def set_limits(self, min_new_tokens: int, max_new_tokens: int) -> None:
        """The length limits an advance reads; written only when they change."""
        if self._limits != (min_new_tokens, max_new_tokens):
            self.inputs["min_new_tokens"].fill_(min_new_tokens)
            self.inputs["max_new_tokens"].fill_(max_new_tokens)
            self._limits = (min_new_tokens, max_new_tokens)


def _tensors(holder: DecodeState | Rows) -> list[Tensor]:
    """A state's tensors (:func:`~hybrid.accel.state_tensors`) or rows' (field order)."""
    if isinstance(holder, DecodeState):
        return state_tensors(holder)
    return [getattr(holder, field.name) for field in dataclasses.fields(holder)]


def _assign(holder: DecodeState | Rows, tensors: list[Tensor]) -> None:
    """Make ``tensors``, in :func:`_tensors`' order, the state's or rows' own."""
    if isinstance(holder, DecodeState):
        assign_state_tensors(holder, tensors)
        return
    for field, tensor in zip(dataclasses.fields(holder), tensors, strict=True):
        setattr(holder, field.name, tensor)


def _memory(state: DecodeState) -> list[tuple[Tensor, int]]:
    """The state's tensors over source positions, each with the dimension of those positions, in
    :func:`~hybrid.accel.state_tensors`' order: the mask (B, 1, 1, S), then keys and values (B, nh, S, hd)."""
    return [(state.memory_mask, 3), *((tensor, 2) for tensor in [*state.cross_keys, *state.cross_values])]


def _padded(tensor: Tensor, length: int, dim: int) -> Tensor:
    """A copy of ``tensor`` whose dimension ``dim`` is zero-padded to ``length``."""
    shape = list(tensor.shape)
    shape[dim] = length
    padded = tensor.new_zeros(shape)
    padded.narrow(dim, 0, tensor.shape[dim]).copy_(tensor)
    return padded


def _same(tensors, others) -> bool:
    return all(tensor is other for tensor, other in zip(tensors, others, strict=True))


def _parameter_addresses(model) -> tuple[int, ...]:
    return tuple(parameter.data_ptr() for parameter in model.parameters())


def _check_device(device: torch.device) -> None:
    if device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device; the model is on {device}")


def _capture(run: Callable[[], None], device: torch.device, warmup_steps: int) -> Callable[[], None]:
    """Capture ``run`` in a CUDA graph and return the graph's replay. It first runs ``warmup_steps`` times
    on a side stream, as ``torch.cuda.graphs`` asks, so that what is made lazily (kernels, workspaces,
    the rules' tensors) exists before the capture."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup_steps):
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay

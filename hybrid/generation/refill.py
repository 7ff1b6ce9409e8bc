"""Decoding a large stream of sources with the hardware kept full: bucketing, token budgets, refill.

- :func:`bucketed_batches` reads a window of sources ahead, sorts it by length and cuts
  batches by a token budget, so short inputs batch wide, long ones narrow, and little
  padding is decoded.
- :class:`RefillDecoder` keeps a fixed number of slots decoding: when a sequence ends,
  the next source is encoded and its memory and cross-attention keys/values are written
  into the freed slot (:meth:`hybrid.state.DecodeState.refill`), so the batch stays full
  instead of draining to its longest member. Every mixer supports it; the attention
  mixer does so through its shape-static step, paying attention over the whole
  preallocated cache per step (its slots sit at different positions). The slots step
  through the model's accelerator (:mod:`hybrid.accel`), as ``generate`` does: on the fast
  path a greedy step is one call into ONNX Runtime or one CUDA-graph replay.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from hybrid.generation.config import GenerationConfig, with_model_defaults
from hybrid.generation.rules import DecodingRules
from hybrid.generation.stepping import Rows
from hybrid.validators import check_int


@dataclass
class Source:
    """One input of a bulk job: its position in the input and its token ids."""

    index: int
    ids: list[int]


def bucketed_batches(sources: Iterable[Source], max_tokens: int, window: int = 1000,
                     max_batch_size: int | None = None) -> Iterator[list[Source]]:
    """Batches of sources sorted by length within each ``window``, each within ``max_tokens``.

    A batch's cost is its size times its longest source (what padding makes it cost);
    a source longer than ``max_tokens`` alone still forms a batch of one.
    """
    check_int("max_tokens", max_tokens, at_least=1)
    check_int("window", window, at_least=1)
    iterator = iter(sources)
    while chunk := list(itertools.islice(iterator, window)):
        chunk.sort(key=lambda source: len(source.ids))
        batch: list[Source] = []
        for source in chunk:  # ascending, so the newcomer is the batch's longest
            full = max_batch_size is not None and len(batch) >= max_batch_size
            if batch and (full or len(source.ids) * (len(batch) + 1) > max_tokens):
                yield batch
                batch = []
            batch.append(source)
        if batch:
            yield batch


def pad_sources(batch: list[Source], pad_id: int, device) -> Tensor:
    """Right-padded (B, S) ids of a batch of sources."""
    longest = max(len(source.ids) for source in batch)
    ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
    for row, source in enumerate(batch):
        ids[row, :len(source.ids)] = torch.tensor(source.ids, dtype=torch.long)
    return ids.to(device)


class RefillDecoder:
    """Greedy or sampled decoding over ``slots`` rows that are refilled as sequences finish.

    It takes :func:`hybrid.generation.generate`'s options, laid over the model's own defaults as there,
    and applies them through the same :class:`~hybrid.generation.rules.DecodingRules`. Rows sit at
    different positions, so only the rules that declare ``supports_continuous_batching`` can run here,
    each given the newest column as ``input_ids``; what cannot is refused, naming it, and
    :meth:`obstacles` tells a caller beforehand, so it can decode those options through ``generate``
    (both ask :meth:`~hybrid.generation.rules.DecodingRules.continuous_batching_obstacles`).
    Knowing which slots to refill reads the end-of-sequence flags on the host, every
    ``eos_check_interval`` steps (as in ``generate``: by default every step on a CPU, where the
    read is free, and every 8 on a GPU, where it stalls the queue of kernels); rows that finish
    in between wait for the check. Where the accelerator keeps every row (a CUDA graph's fixed
    batch), slots left empty at the end step on, finished, instead of leaving, and the memory is
    refilled in place, never trimmed.
    """

    def __init__(self, model, slots: int, **options) -> None:
        check_int("slots", slots, at_least=1)
        self.model, self.slots = model, slots
        self.config = GenerationConfig.from_kwargs(**with_model_defaults(model, options))
        self.rules = DecodingRules(self.config, model.config)
        obstacles = self.rules.continuous_batching_obstacles()
        if obstacles:
            raise ValueError(f"continuous refill cannot honour {obstacles}: decode these options with "
                             "generate() (hybrid generate does so by itself when refill cannot)")

    @staticmethod
    def obstacles(model, **options) -> list[str]:
        """What of ``generate``'s ``options`` refill cannot do for ``model``, by name; empty when it can."""
        config = GenerationConfig.from_kwargs(**with_model_defaults(model, options))
        return DecodingRules(config, model.config).continuous_batching_obstacles()

    def next_tokens(self, logits: Tensor, tokens: Tensor, positions: Tensor) -> Tensor:
        """Each row's next token (B,) from its step's ``logits`` (B, vocab), the ``tokens`` just fed (the only
        column of ``input_ids`` the rules see) and how many ``positions`` each row has generated."""
        return self.rules.choose(self.rules.process(tokens[:, None], logits.float(), positions))

    @torch.inference_mode()
    def run(self, batches: Iterable[list[Source]]) -> Iterator[tuple[int, list[int]]]:
        """Decode every source; yields ``(index, ids)`` as each finishes (EOS included, no BOS)."""
        model, config, rules = self.model, self.config, self.rules
        accelerator = model.accelerator
        device = next(model.parameters()).device
        pad_id, bos_id = model.config.pad_id, rules.bos_id
        incoming = _EncodedSources(model, (source for batch in batches for source in batch), self.slots, device)

        sources = list(itertools.islice(incoming.sources, self.slots))
        if not sources:
            return
        state = model.start(pad_sources(sources, pad_id, device), max_steps=config.max_new_tokens)
        owners = [source.index for source in sources]  # which input each slot decodes; None: an empty slot
        source_lengths = [len(source.ids) for source in sources]  # on the host: how long the memory must be
        rows = Rows.start(len(sources), config.max_new_tokens, bos_id, rules.pad_id, device)
        interval = config.check_interval(device)
        step = 0
        while any(owner is not None for owner in owners):
            state.reserve(step + 1)  # no row has been fed more steps than the batch
            accelerator.advance(rules, state, rows)
            step += 1
            if step % interval:
                continue
            # The only host read, every `interval` steps; an empty slot stays finished.
            done = [row for row in rows.finished.nonzero().flatten().tolist() if owners[row] is not None]
            if not done:
                continue
            index = torch.tensor(done, dtype=torch.long, device=device)
            for row, ids, generated in zip(done, rows.outputs[index].tolist(), rows.positions[index].tolist(),
                                           strict=True):
                yield owners[row], ids[:generated]
                owners[row], source_lengths[row] = None, 0
            free = done
            while free and (taken := incoming.take(len(free))) is not None:
                sources, fresh, fresh_rows = taken
                slots, free = free[:len(sources)], free[len(sources):]
                for row, source in zip(slots, sources, strict=True):
                    owners[row], source_lengths[row] = source.index, len(source.ids)
                index = torch.tensor(slots, dtype=torch.long, device=device)
                # A fixed batch keeps its memory's length, so that the refill writes in place.
                length = None if accelerator.keeps_every_row else max(source_lengths)
                state.refill(index, fresh, fresh_rows, source_length=length)
                rows.restart(index, bos_id, rules.pad_id)
            if free and not accelerator.keeps_every_row:  # nothing left to read: the batch shrinks
                keep = [row for row, owner in enumerate(owners) if owner is not None]
                index = torch.tensor(keep, dtype=torch.long, device=device)
                state.reorder(index)
                owners = [owners[row] for row in keep]
                source_lengths = [source_lengths[row] for row in keep]
                rows = rows.select(index)
                if owners:
                    state.trim_source(max(source_lengths))


class _EncodedSources:
    """The refill queue: sources encoded ``block`` at a time, handed out a few at a time.

    Encoding a block in one call instead of each refill's one or two sources amortises the
    encoder's per-call cost; only the block's memory is kept (its mixer states are never used).
    """

    def __init__(self, model, sources: Iterator[Source], block: int, device) -> None:
        self.model, self.sources, self.block, self.device = model, sources, block, device
        self.encoded: list[Source] = []
        self.fresh = None
        self.used = 0

    def take(self, count: int) -> tuple[list[Source], object, Tensor] | None:
        """Up to ``count`` encoded sources from the current block, its state, and their rows in it; None at the end."""
        if self.used == len(self.encoded):
            self.encoded, self.used = list(itertools.islice(self.sources, self.block)), 0
            if not self.encoded:
                return None
            self.fresh = self.model.start(pad_sources(self.encoded, self.model.config.pad_id, self.device),
                                          max_steps=1)
        first, self.used = self.used, min(len(self.encoded), self.used + count)
        rows = torch.arange(first, self.used, device=self.device)
        return self.encoded[first:self.used], self.fresh, rows

"""Decoding a large stream of sources with the hardware kept full: bucketing, token budgets, refill.

- :func:`bucketed_batches` reads a window of sources ahead, sorts it by length and cuts
  batches by a token budget, so short inputs batch wide, long ones narrow, and little
  padding is decoded.
- :class:`RefillDecoder` keeps a fixed number of slots decoding: when a sequence ends,
  the next source is encoded and its memory and cross-attention keys/values are written
  into the freed slot (:meth:`hybrid.state.DecodeState.refill`), so the batch stays full
  instead of draining to its longest member. Every mixer supports it; the attention
  mixer does so through its shape-static step, paying attention over the whole
  preallocated cache per step (its slots sit at different positions).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from hybrid.generation.config import GenerationConfig


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
    if max_tokens < 1 or window < 1:
        raise ValueError(f"max_tokens and window must be >= 1, got {max_tokens} and {window}")
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

    Supported options: ``max_new_tokens``, ``min_new_tokens``, ``eos_token_id``, ``do_sample``
    with ``temperature``/``top_k``/``top_p``/``min_p``, and ``generator``. Options whose
    processors read each row's history (penalties, n-gram and word bans, custom
    processors), beam search and forced prefixes need rows that advance together: use
    bucketed batches through ``generate`` for those. Knowing which slots to refill reads
    the end-of-sequence flags on the host every step; with wide batches that read is small
    next to the step itself.
    """

    SUPPORTED = {"max_new_tokens", "min_new_tokens", "eos_token_id", "do_sample", "temperature", "top_k",
                 "top_p", "min_p", "generator"}

    def __init__(self, model, slots: int, **options) -> None:
        unsupported = sorted(set(options) - self.SUPPORTED)
        if unsupported:
            raise ValueError(f"continuous refill does not support {unsupported}; supported: "
                             f"{sorted(self.SUPPORTED)} (decode without refill for the others)")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.model, self.slots = model, slots
        self.config = GenerationConfig.from_kwargs(**options)
        model_config = model.config
        self.eos_ids = self.config.eos_ids(model_config)
        self.warpers = self.config.logits_processors(self.eos_ids)
        self.never_generate = sorted({model_config.pad_id, model_config.bos_id} - set(self.eos_ids))

    @torch.inference_mode()
    def run(self, batches: Iterable[list[Source]]) -> Iterator[tuple[int, list[int]]]:
        """Decode every source; yields ``(index, ids)`` as each finishes (EOS included, no BOS)."""
        model, config = self.model, self.config
        device = next(model.parameters()).device
        pad_id, bos_id = model.config.pad_id, model.config.bos_id
        queue = (source for batch in batches for source in batch)
        length = config.max_new_tokens

        first = list(itertools.islice(queue, self.slots))
        if not first:
            return
        state = model.start(pad_sources(first, pad_id, device), max_new_tokens=length)
        owners = [source.index for source in first]  # which input each slot decodes
        rows = len(first)
        positions = torch.zeros(rows, dtype=torch.long, device=device)
        tokens = torch.full((rows,), bos_id, dtype=torch.long, device=device)
        outputs = torch.full((rows, length), pad_id, dtype=torch.long, device=device)
        eos = torch.tensor(self.eos_ids, device=device)
        never = torch.tensor(self.never_generate, device=device)
        while rows:
            logits = model.step_unchecked(tokens, state, positions).float()  # (rows, vocab)
            logits.index_fill_(1, never, float("-inf"))
            if config.min_new_tokens:
                too_short = (positions + 1 < config.min_new_tokens)[:, None]
                logits[:, eos] = logits[:, eos].masked_fill(too_short, float("-inf"))
            if config.do_sample:
                scores = self.warpers(tokens[:, None], logits)  # the warpers read scores only
                tokens = torch.multinomial(F.softmax(scores, dim=-1), 1, generator=config.generator).squeeze(1)
            else:
                tokens = logits.argmax(dim=-1)
            outputs.scatter_(1, positions[:, None], tokens[:, None])
            positions += 1
            done = (torch.isin(tokens, eos) | (positions >= length)).nonzero().flatten().tolist()
            if not done:
                continue
            for row in done:
                finished = outputs[row, :int(positions[row])].tolist()
                yield owners[row], finished
            incoming = list(itertools.islice(queue, len(done)))
            refill = torch.tensor(done[:len(incoming)], dtype=torch.long, device=device)
            if incoming:
                state.refill(refill, model.start(pad_sources(incoming, pad_id, device), max_new_tokens=length))
                for row, source in zip(done, incoming, strict=False):
                    owners[row] = source.index
                positions[refill] = 0
                tokens[refill] = bos_id
                outputs[refill] = pad_id
            emptied = done[len(incoming):]
            if emptied:  # nothing left to read: the batch shrinks
                keep = [row for row in range(rows) if row not in set(emptied)]
                index = torch.tensor(keep, dtype=torch.long, device=device)
                state.reorder(index)
                owners = [owners[row] for row in keep]
                positions, tokens, outputs = positions[index], tokens[index], outputs[index]
                rows = len(keep)

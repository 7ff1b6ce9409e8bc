"""The training loader: an order drawn from the seed and the epoch alone, resumable part-way through an epoch."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sized
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler


class EpochSeededSampler(DistributedSampler):
    """The training order: epoch ``e`` is a permutation drawn from ``seed + e`` alone, sharded by rank.

    That is DistributedSampler's rule (Lightning calls ``set_epoch`` at each epoch), so an epoch's
    order never depends on what ran before it. ``start`` skips this rank's first indices once, for
    a run resumed mid-epoch (:class:`ResumableDataLoader` sets it).
    """

    def __init__(self, dataset: Sized, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        start, self.start = self.start, 0
        return itertools.islice(super().__iter__(), start, None)


class ResumableDataLoader(DataLoader):
    """A training loader that can start part-way through an epoch: where a resumed run left off.

    ``position()`` is the epoch and the batches already yielded in it; ``resume_from(position)``
    makes the next iterator of that epoch skip those and yield the rest, in the order the
    interrupted run would have. The data module carries the position in Lightning's checkpoint.
    Batches are counted as they are yielded (Lightning does not prefetch from a loader with a
    length), so worker prefetching does not shift the count.

    ``current_epoch`` (the Trainer's, where one runs the loader) numbers the epochs, not the
    ``set_epoch`` calls of Lightning's fit loop: that loop counts an epoch too many after resuming
    from a checkpoint written at an epoch's end under a ``max_steps`` budget (it replays the
    finished epoch, empty, and counts it again: Lightning issue 19617), which would give every later
    epoch the next epoch's order.
    """

    sampler: EpochSeededSampler

    def __init__(self, *args: Any, current_epoch: Callable[[], int] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current_epoch = current_epoch
        self.batches_yielded = 0
        self._resume_at: dict[str, int] | None = None  # a position, until the next iterator starts

    def __iter__(self) -> Iterator[Any]:
        # A generator: this body runs at the first batch, after Lightning's set_epoch and after it
        # restored the checkpoint, although Lightning calls iter() before both.
        if self.current_epoch is not None:
            self.sampler.set_epoch(self.current_epoch())
        resume, self._resume_at = self._resume_at, None
        # A position from the end of an epoch, or from another epoch, is no reason to skip anything.
        done = resume["batches_yielded"] if resume and resume["epoch"] == self.sampler.epoch else 0
        self.sampler.start = done * self.batch_size
        self.batches_yielded = done
        for batch in super().__iter__():
            self.batches_yielded += 1
            yield batch

    def position(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "batches_yielded": self.batches_yielded}

    def resume_from(self, position: dict[str, int]) -> None:
        self._resume_at = dict(position)

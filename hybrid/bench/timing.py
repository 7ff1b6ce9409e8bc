"""Wall-clock timing of a call on a CPU or a GPU, with the device's queued work finished on both sides."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def synchronize(device: torch.device) -> None:
    """Wait until ``device`` has finished the work queued on it (a no-op on a CPU, whose calls return done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, call: Callable[[], T]) -> tuple[float, T]:
    """Seconds that ``call()`` takes on ``device``, and what it returned. A GPU's queue is drained before the
    clock starts and again before it stops, so the time is the call's kernels, not how long queuing them took."""
    synchronize(device)
    begin = time.perf_counter()
    result = call()
    synchronize(device)
    return time.perf_counter() - begin, result

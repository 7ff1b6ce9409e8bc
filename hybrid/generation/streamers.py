"""Streamers: hand tokens to the caller while generation is still running.

The search strategy calls `streamer.put(token_ids)` once per step with the LongTensor [B] of tokens just
chosen, and `streamer.end()` once when it is done. The BOS column is never put; this differs from
Hugging Face transformers, whose `generate` puts the prompt first, so its `TextStreamer(skip_prompt=True)`
would drop our first token.
"""

import queue
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from torch import Tensor

from hybrid.validators import check_float


def _check_step_tokens(token_ids: Tensor) -> None:
    if token_ids.dim() != 1:
        raise ValueError(f"put expects the [B] tokens of one step, got shape {tuple(token_ids.shape)}")


class BaseStreamer(ABC):
    """What a search strategy needs from a streamer: `put` each step's [B] tokens, then `end`."""

    @abstractmethod
    def put(self, token_ids: Tensor) -> None:
        """Receive the LongTensor [B] of tokens chosen at one step."""

    @abstractmethod
    def end(self) -> None:
        """Learn that generation is over; nothing is put afterwards."""


class TokenStreamer(BaseStreamer):
    """Collect the generated tokens of each batch row, optionally calling `on_token` at every step.

    `token_ids[b]` is the list of tokens put so far for row b, and `finished` turns True at `end()`.
    `on_token` receives each step's [B] tensor as put, on whatever device the search strategy uses.
    Use one streamer per generation: the batch size is fixed by the first `put`.
    """

    def __init__(self, on_token: Callable[[Tensor], None] | None = None) -> None:
        self.on_token = on_token
        self.token_ids: list[list[int]] = []
        self.finished = False

    def put(self, token_ids: Tensor) -> None:
        _check_step_tokens(token_ids)
        if not self.token_ids:
            self.token_ids = [[] for _ in range(token_ids.shape[0])]
        elif len(self.token_ids) != token_ids.shape[0]:
            raise ValueError(
                f"put got {token_ids.shape[0]} tokens, but the batch has {len(self.token_ids)} rows"
            )
        for row, token_id in zip(self.token_ids, token_ids.tolist(), strict=True):
            row.append(token_id)
        if self.on_token is not None:
            self.on_token(token_ids)

    def end(self) -> None:
        self.finished = True


class TokenIteratorStreamer(BaseStreamer):
    """A queue between threads: generation puts each step's [B] tokens, a consumer iterates over them.

    Run generation in one thread and `for token_ids in streamer:` in another; the loop ends after
    `end()`. Each step's tensor is copied on `put`, because the search strategy may overwrite one buffer
    in place every step. With a `timeout` (seconds, > 0), waiting longer than that for the next step
    raises `queue.Empty`, so a consumer never hangs on a generation thread that died.
    """

    _END = object()

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = check_float("timeout", timeout, above=0, optional=True)
        self._queue: queue.Queue[object] = queue.Queue()

    def put(self, token_ids: Tensor) -> None:
        _check_step_tokens(token_ids)
        self._queue.put(token_ids.clone())

    def end(self) -> None:
        self._queue.put(self._END)

    def __iter__(self) -> Iterator[Tensor]:
        return self

    def __next__(self) -> Tensor:
        token_ids = self._queue.get(timeout=self.timeout)
        if token_ids is self._END:
            raise StopIteration
        return token_ids

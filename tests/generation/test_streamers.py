"""Streamers hand back exactly what generation put, in order, within one thread or across two."""

import queue
import threading

import pytest
import torch

from hybrid.generation.streamers import BaseStreamer, TokenIteratorStreamer, TokenStreamer


def steps(batch: int = 3, count: int = 5) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 100, (batch,), generator=generator) for _ in range(count)]


def test_token_streamer_collects_rows_and_calls_back() -> None:
    seen = []
    streamer = TokenStreamer(on_token=seen.append)
    tokens = steps()
    for token_ids in tokens:
        streamer.put(token_ids)
    assert not streamer.finished
    streamer.end()
    assert streamer.finished
    assert streamer.token_ids == torch.stack(tokens, dim=1).tolist()
    assert seen == tokens


def test_token_streamer_refuses_a_changed_batch_or_shape() -> None:
    streamer = TokenStreamer()
    streamer.put(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="rows"):
        streamer.put(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="shape"):
        streamer.put(torch.tensor([[1], [2]]))


def test_iterator_streamer_across_threads() -> None:
    streamer = TokenIteratorStreamer(timeout=5.0)
    tokens = steps()
    buffer = torch.zeros(3, dtype=torch.long)

    def generate() -> None:
        for token_ids in tokens:
            buffer.copy_(token_ids)  # one reused buffer, as CUDA-graph decoding would have
            streamer.put(buffer)
        streamer.end()

    producer = threading.Thread(target=generate)
    producer.start()
    received = list(streamer)
    producer.join()
    assert len(received) == len(tokens)
    assert all(torch.equal(got, put) for got, put in zip(received, tokens, strict=True))


def test_iterator_streamer_times_out() -> None:
    streamer = TokenIteratorStreamer(timeout=0.01)
    with pytest.raises(queue.Empty):
        next(streamer)


def test_streamers_are_base_streamers() -> None:
    assert isinstance(TokenStreamer(), BaseStreamer)
    assert isinstance(TokenIteratorStreamer(), BaseStreamer)
    with pytest.raises(TypeError):
        BaseStreamer()


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), "1"])
def test_bad_timeout_raises_naming_the_argument(timeout: object) -> None:
    with pytest.raises(ValueError, match="timeout"):
        TokenIteratorStreamer(timeout=timeout)

"""Streamers receive, step by step, exactly what a real ``generate`` call returns, and then the end:
in one thread or across two, as transformers' streamers receive the same steps from transformers'
``generate``, less the prompt that transformers puts first and hybrid never does."""

import queue
import threading

import pytest
import torch
from conftest import padded_batch, tiny_model

from hybrid.generation.streamers import BaseStreamer, TokenIteratorStreamer, TokenStreamer

# Seed 3's rows all end before the limit, at different steps (the last after two); seed 5's end at
# different steps, and two of them run to the limit.
ENDINGS = {"every row ends early": 3, "some rows run to the limit": 5}


def model_and_sources(seed: int) -> tuple[torch.nn.Module, torch.Tensor]:
    return tiny_model(["lstm", "attention"], seed=seed), padded_batch([5, 3, 7, 4], seed=seed)


class Recorder(BaseStreamer):
    """Every call, in order: each step's tokens as put, and "end"."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor | str] = []

    def put(self, token_ids: torch.Tensor) -> None:
        self.calls.append(token_ids.clone())

    def end(self) -> None:
        self.calls.append("end")


@pytest.mark.parametrize("seed", ENDINGS.values(), ids=ENDINGS.keys())
@pytest.mark.parametrize("options", [
    {},
    {"do_sample": True, "num_return_sequences": 2},
    {"decoder_input_ids": torch.tensor([[7, 9]] * 4)},  # forced tokens are streamed as they are fed
], ids=["greedy", "sampling", "forced prefix"])
def test_a_token_streamer_receives_every_step_generate_returns_then_the_end(seed, options):
    model, sources = model_and_sources(seed)
    finished_at_each_step = []
    streamer = TokenStreamer(on_token=lambda token_ids: finished_at_each_step.append(streamer.finished))
    generator = torch.Generator().manual_seed(0) if options.get("do_sample") else None
    out = model.generate(sources, max_new_tokens=12, streamer=streamer, generator=generator, **options)
    assert streamer.token_ids == out.tolist()  # each row, step by step, padding after its EOS, never BOS
    assert finished_at_each_step == [False] * out.shape[1] and streamer.finished  # the end comes last


def test_nothing_is_put_after_every_row_has_ended_whatever_the_check_interval():
    model, sources = model_and_sources(ENDINGS["every row ends early"])
    streamer = TokenStreamer()
    out = model.generate(sources, max_new_tokens=12, streamer=streamer, eos_check_interval=4)
    assert streamer.token_ids == out.tolist()


@pytest.mark.parametrize("seed", ENDINGS.values(), ids=ENDINGS.keys())
def test_an_iterator_streamer_hands_each_step_of_generate_to_another_thread(seed):
    model, sources = model_and_sources(seed)
    streamer = TokenIteratorStreamer(timeout=60.0)
    returned = {}
    producer = threading.Thread(target=lambda: returned.update(
        out=model.generate(sources, max_new_tokens=12, streamer=streamer)))
    producer.start()
    received = list(streamer)  # the loop ends because generate ends the streamer
    producer.join()
    assert torch.equal(torch.stack(received, dim=1), returned["out"])


@pytest.mark.parametrize("seed", ENDINGS.values(), ids=ENDINGS.keys())
def test_the_steps_are_those_transformers_streams_after_its_prompt(seed):
    pytest.importorskip("transformers")
    from test_transformers_conformance import BOS, FILL, PAD, HybridForTransformers

    model, sources = model_and_sources(seed)
    model = model.double()  # transformers reruns the decoder: float64 keeps both on the same argmax
    ours, theirs = Recorder(), Recorder()
    model.generate(sources, max_new_tokens=12, pad_token_id=FILL, streamer=ours)
    with torch.no_grad():
        HybridForTransformers(model).eval().generate(
            input_ids=sources, attention_mask=sources.ne(PAD), use_cache=False, suppress_tokens=[PAD, BOS, FILL],
            max_new_tokens=12, streamer=theirs)
    prompt, *their_steps = theirs.calls
    assert prompt.tolist() == [[BOS]] * len(sources)  # transformers puts the decoder start first; hybrid never
    assert len(ours.calls) == len(their_steps) and ours.calls[-1] == their_steps[-1] == "end"
    assert all(torch.equal(mine, their) for mine, their in zip(ours.calls[:-1], their_steps[:-1], strict=True))


def test_token_streamer_refuses_a_changed_batch_or_shape() -> None:
    streamer = TokenStreamer()
    streamer.put(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="rows"):
        streamer.put(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="shape"):
        streamer.put(torch.tensor([[1], [2]]))


def test_iterator_streamer_copies_each_step_because_decoding_may_reuse_one_buffer() -> None:
    streamer = TokenIteratorStreamer(timeout=5.0)
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, 100, (3,), generator=generator) for _ in range(5)]
    buffer = torch.zeros(3, dtype=torch.long)

    def generate() -> None:
        for token_ids in tokens:
            buffer.copy_(token_ids)  # one reused buffer, as CUDA-graph decoding has
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


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), "1"])
def test_bad_timeout_raises_naming_the_argument(timeout: object) -> None:
    with pytest.raises(ValueError, match="timeout"):
        TokenIteratorStreamer(timeout=timeout)

"""CUDA-graph decoding: the shape-static step (position on the device) that CUDA graphs replay equals the
eager one; ``generate`` over a batch that never shrinks equals ``generate``; and the CUDA-graph accelerator,
its capture stubbed on a CPU, decodes as the eager step does (every strategy, and refill), caching one
graph per shape that later decodes replay."""

import random

import pytest
import torch
from conftest import padded_batch, tiny_model

from hybrid import MIXERS
from hybrid.accel import cuda_graph
from hybrid.accel.cuda_graph import CUDAGraphAccelerator
from hybrid.generation import engine
from hybrid.generation.config import GenerationConfig
from hybrid.generation.refill import RefillDecoder, Source
from hybrid.generation.sessions import StaticSession


@pytest.fixture
def stubbed_capture(monkeypatch):
    """CUDA graphs on a CPU: a capture runs the same warm-up, then returns a replay that reruns what it was
    given, and the device check passes. Everything else (the cache of graphs, their static buffers, the
    copies into them) is the accelerator's own. Returns the list of captured calls."""
    captured = []

    def capture(run, device, warmup_steps):
        for _ in range(warmup_steps):
            run()
        captured.append(run)
        return run

    monkeypatch.setattr(cuda_graph, "_capture", capture)
    monkeypatch.setattr(cuda_graph, "_check_device", lambda device: None)
    return captured


def graphed(model):
    """``model`` with the CUDA-graph accelerator installed (its capture stubbed by the fixture)."""
    model.accelerator = CUDAGraphAccelerator(model)
    return model


def test_step_with_a_device_position_equals_teacher_forcing(mixer_pattern):
    model = tiny_model(mixer_pattern, seed=3)
    src, tgt = padded_batch([5, 2, 7], seed=4), padded_batch([9, 9, 9], seed=5)
    state = model.start(src, max_steps=9)
    position = torch.zeros((), dtype=torch.long)
    stepped = []
    for t in range(9):
        stepped.append(model.step_unchecked(tgt[:, t], state, position))
        position += 1
    assert (torch.stack(stepped, dim=1) - model(src, tgt)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_every_mixer_takes_each_form_of_position(mixer):
    # An int, a 0-d tensor and one position per row are the same step; any other shape is refused.
    model = tiny_model([mixer, mixer], seed=4)
    src, tgt = padded_batch([5, 3], seed=5), padded_batch([4, 4], seed=6)
    forms = [lambda t: None, lambda t: torch.tensor(t), lambda t: torch.tensor([t, t])]
    outputs = []
    for form in forms:
        state = model.start(src, max_steps=4)
        outputs.append(torch.stack([model.step_unchecked(tgt[:, t], state, form(t)) for t in range(4)]))
    for other in outputs[1:]:
        assert (other - outputs[0]).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="one position per row"):
        model.step_unchecked(tgt[:, 0], model.start(src, max_steps=4), torch.tensor([0, 0, 0]))


@pytest.mark.parametrize("options", [
    dict(), dict(min_new_tokens=5, eos_token_id=[2, 7]), dict(repetition_penalty=1.3, no_repeat_ngram_size=2),
    dict(decoder_input_ids=torch.tensor([[1, 5, 6], [1, 8, 0], [1, 0, 0]])),
    dict(do_sample=True, top_k=4, num_return_sequences=2, min_new_tokens=10),
    dict(num_beams=3, num_return_sequences=2), dict(num_beams=2, length_penalty=0.5, early_stopping=True),
], ids=["greedy", "min-length-eos-list", "penalties", "forced-prefix", "sampling", "beams", "beams-early"])
def test_a_batch_that_keeps_every_row_decodes_like_generate(mixer_pattern, options):
    # What the CUDA-graph loop runs, without the capture: finished rows step on, fed padding, and beams
    # are reordered in place. Sampling lets no row end early, so both draw from the generator in the
    # same order.
    model = tiny_model(mixer_pattern, seed=6)
    src = padded_batch([5, 2, 7], seed=6)
    sampled = {"generator": torch.Generator().manual_seed(0)} if options.get("do_sample") else {}
    config = GenerationConfig.from_kwargs(max_new_tokens=10, **options, **sampled)
    static = engine.decode(model, src, None, config, StaticSession)
    sampled = {"generator": torch.Generator().manual_seed(0)} if options.get("do_sample") else {}
    assert torch.equal(static, model.generate(src, max_new_tokens=10, **options, **sampled))


def test_a_static_session_refuses_to_shrink():
    model = tiny_model(["lstm"])
    session = StaticSession(model, padded_batch([3, 2]), None, 4)
    with pytest.raises(ValueError, match="keeps every row"):
        session.reorder(torch.tensor([0]))


def test_cuda_graphs_refuse_a_model_on_a_cpu():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        CUDAGraphAccelerator(tiny_model(["lstm"]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("options", [dict(), dict(min_new_tokens=24), dict(no_repeat_ngram_size=2),
                                     dict(num_beams=3, num_return_sequences=2)])
def test_cuda_graph_decoding_equals_eager_generate(mixer_pattern, options):
    model = tiny_model(mixer_pattern, seed=6).cuda()
    src = padded_batch([5, 2, 7], seed=6).cuda()
    eager = model.generate(src, max_new_tokens=24, **options)
    model.optimize_for_inference()  # generate now replays captured graphs
    assert isinstance(model.accelerator, CUDAGraphAccelerator)
    assert torch.equal(model.generate(src, max_new_tokens=24, **options), eager)
    captures = model.accelerator.captures
    assert torch.equal(model.generate(src, max_new_tokens=24, **options), eager)
    assert model.accelerator.captures == captures  # the second decode of this shape replayed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("options", [dict(), dict(bad_words_ids=[[5]])], ids=["advance", "step"])
def test_cuda_graph_refill_equals_eager_refill(options):
    model = tiny_model(["lstm", "attention"], seed=6).cuda()
    sources = random_sources(11, seed=6)

    def run(model):
        return dict(RefillDecoder(model, slots=3, max_new_tokens=10, **options).run([sources]))

    eager = run(model)
    assert run(model.optimize_for_inference()) == eager


def test_rows_at_different_positions_step_like_each_row_alone(mixer_pattern):
    # What continuous refill needs: a slot-indexed state whose rows are at their own positions.
    model = tiny_model(mixer_pattern, seed=7)
    src, tgt = padded_batch([4, 6], seed=8), padded_batch([8, 8], seed=9)
    state = model.start(src, max_steps=8)
    positions = torch.tensor([0, 0])
    model.step_unchecked(tgt[:, 0], state, positions)
    positions = torch.tensor([1, 0])  # row 1 restarts: its state is reset and its position rewound
    with torch.inference_mode():
        for mixer_state in state.mixer_states:
            mixer_state.reset(torch.tensor([1]))
    logits = model.step_unchecked(torch.stack([tgt[0, 1], tgt[1, 0]]), state, positions)
    alone = model.start(src[1:], max_steps=8)
    assert (logits[1] - model.step(tgt[1:, 0], alone)[0]).abs().max().item() <= 1e-4
    assert (logits[0] - model(src[:1], tgt[:1, :2])[0, 1]).abs().max().item() <= 1e-4


def random_sources(count: int, seed: int) -> list[Source]:
    rng = random.Random(seed)
    return [Source(i, [rng.randrange(3, 13) for _ in range(rng.randint(1, 9))]) for i in range(count)]


@pytest.mark.parametrize("options", [
    dict(), dict(min_new_tokens=5, eos_token_id=[2, 7]), dict(repetition_penalty=1.3, no_repeat_ngram_size=2),
    dict(do_sample=True, top_k=4, num_return_sequences=2, min_new_tokens=10), dict(num_beams=3, num_return_sequences=2),
], ids=["greedy", "min-length-eos-list", "penalties", "sampling", "beams"])
def test_the_cuda_graph_accelerator_decodes_like_the_eager_step(stubbed_capture, mixer_pattern, options):
    # Greedy decoding replays a captured advance (step and rules), the rest a captured step; a capture's
    # warm-up writes into the graph's buffers, which must not show. Sampling lets no row end early, so both
    # draw from the generator in the same order.
    src = padded_batch([5, 2, 7], seed=6)

    def run(model):
        sampled = {"generator": torch.Generator().manual_seed(0)} if options.get("do_sample") else {}
        return model.generate(src, max_new_tokens=10, **options, **sampled)

    assert torch.equal(run(graphed(tiny_model(mixer_pattern, seed=6))), run(tiny_model(mixer_pattern, seed=6)))
    assert stubbed_capture  # the accelerator really replayed graphs


@pytest.mark.parametrize("options", [dict(), dict(min_new_tokens=4), dict(bad_words_ids=[[5]])],
                         ids=["greedy", "min-length", "bad-word"])
@pytest.mark.parametrize("mixers", [["lstm", "attention"], ["attention", "attention"]], ids="-".join)
def test_the_cuda_graph_accelerator_refills_like_the_eager_step(stubbed_capture, mixers, options):
    # Greedy rules that read only lengths replay a captured advance; a bad word needs the rules in Python,
    # around a captured step at each row's own position. Slots are refilled in place in the graph's batch,
    # a source longer than its memory's padded length (16 here) grows it (a second capture), and slots
    # left empty at the end step on.
    sources = [Source(0, list(range(3, 12))), *random_sources(11, seed=6)[1:], Source(11, list(range(3, 13)) * 2)]

    def run(model):
        return dict(RefillDecoder(model, slots=3, max_new_tokens=10, **options).run([sources]))

    model = graphed(tiny_model(mixers, seed=6))
    assert run(model) == run(tiny_model(mixers, seed=6))
    assert model.accelerator.captures == 2


def test_a_decode_of_a_shape_seen_before_replays_its_graph(stubbed_capture):
    model = graphed(tiny_model(["lstm", "attention"], seed=8))
    src = padded_batch([5, 2, 7], seed=8)
    first = model.generate(src, max_new_tokens=6)
    graphs = dict(model.accelerator.compiled)
    assert model.accelerator.captures == 1
    assert torch.equal(model.generate(src, max_new_tokens=6), first)
    assert model.accelerator.compiled == graphs and model.accelerator.captures == 1
    # A shorter source fits the graph's memory; a source past its padded length, or another capacity,
    # is another graph.
    model.generate(padded_batch([3, 2, 1], seed=9), max_new_tokens=6)
    assert model.accelerator.captures == 1
    model.generate(padded_batch([9, 2, 1], seed=9), max_new_tokens=6)
    assert model.accelerator.captures == 2
    model.generate(src, max_new_tokens=7)
    assert model.accelerator.captures == 3


def test_decodes_that_take_turns_on_one_graph_stay_apart(stubbed_capture, mixer_pattern):
    # Two states of one shape share a graph's buffers; each must find its own state when its turn comes.
    model, eager = graphed(tiny_model(mixer_pattern, seed=10)), tiny_model(mixer_pattern, seed=10)
    sources = [padded_batch([4, 3], seed=11), padded_batch([2, 4], seed=12)]
    tokens = padded_batch([6, 6], seed=13)
    states = [[m.start(src, max_steps=6) for src in sources] for m in (model, eager)]
    for t in range(6):
        for turn in range(2):
            position = torch.tensor(t)
            got = model.step_unchecked(tokens[:, t], states[0][turn], position)
            expected = eager.step_unchecked(tokens[:, t], states[1][turn], position)
            assert torch.equal(got, expected)
    assert model.accelerator.captures == 1


def test_moved_parameters_drop_the_graphs_that_read_them(stubbed_capture):
    model = graphed(tiny_model(["lstm", "attention"], seed=14))
    src = padded_batch([3, 5], seed=14)
    expected = model.generate(src, max_new_tokens=5)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data = parameter.data.clone()  # what model.to(another device) does to a graph
    assert torch.equal(model.generate(src, max_new_tokens=5), expected)
    assert model.accelerator.captures == 2

"""The shape-static step (position on the device) that CUDA graphs replay equals the eager one, and
``generate`` over a batch that never shrinks (the CUDA-graph loop, uncaptured) equals ``generate``."""

import pytest
import torch
from conftest import padded_batch, tiny_model

from hybrid import MIXERS
from hybrid.generation import engine
from hybrid.generation.config import GenerationConfig
from hybrid.generation.cuda_graph import CUDAGraphStep, generate_with_cuda_graph
from hybrid.generation.sessions import StaticSession


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


def test_cuda_graphs_refuse_a_cpu_state():
    model = tiny_model(["lstm"])
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        CUDAGraphStep(model, model.start(padded_batch([3]), max_steps=4))
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        generate_with_cuda_graph(model, padded_batch([3]), num_beams=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("options", [dict(), dict(min_new_tokens=24), dict(no_repeat_ngram_size=2),
                                     dict(num_beams=3, num_return_sequences=2)])
def test_cuda_graph_decoding_equals_eager_generate(mixer_pattern, options):
    model = tiny_model(mixer_pattern, seed=6).cuda()
    src = padded_batch([5, 2, 7], seed=6).cuda()
    eager = model.generate(src, max_new_tokens=24, **options)
    assert torch.equal(generate_with_cuda_graph(model, src, max_new_tokens=24, **options), eager)
    model.optimize_for_inference()  # generate itself now replays the captured step
    assert model.cuda_graphs and torch.equal(model.generate(src, max_new_tokens=24, **options), eager)


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


def test_a_captured_step_restarts_every_mixer_state_through_its_own_reset(monkeypatch):
    # A mixer whose initial state is not zero overrides MixerState.reset; the graph must go through it.
    model = tiny_model(["lstm", "attention"])
    step = CUDAGraphStep.__new__(CUDAGraphStep)  # the capture itself needs a GPU; reset does not
    step.state, step.position = model.start(padded_batch([3]), max_steps=4), torch.tensor(3)
    calls = []
    for layer, mixer_state in enumerate(step.state.mixer_states):
        monkeypatch.setattr(mixer_state, "reset", lambda rows=None, layer=layer: calls.append((layer, rows)))
    step.reset()
    assert calls == [(0, None), (1, None)] and step.position.item() == 0

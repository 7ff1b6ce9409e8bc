"""The shape-static step (position on the device) that CUDA graphs replay equals the eager one."""

import pytest
import torch
from conftest import padded_batch, tiny_model

from hybrid.generation.cuda_graph import CUDAGraphStep, generate_with_cuda_graph


def test_step_with_a_device_position_equals_teacher_forcing(mixer_pattern):
    model = tiny_model(mixer_pattern, seed=3)
    src, tgt = padded_batch([5, 2, 7], seed=4), padded_batch([9, 9, 9], seed=5)
    state = model.start(src, max_new_tokens=9)
    position = torch.zeros((), dtype=torch.long)
    stepped = []
    for t in range(9):
        stepped.append(model.step_unchecked(tgt[:, t], state, position))
        position += 1
    assert (torch.stack(stepped, dim=1) - model(src, tgt)).abs().max().item() <= 1e-4


def test_cuda_graph_refuses_a_cpu_state():
    model = tiny_model(["lstm"])
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        CUDAGraphStep(model, model.start(padded_batch([3]), max_new_tokens=4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_graph_decoding_equals_eager_greedy(mixer_pattern):
    model = tiny_model(mixer_pattern, seed=6).cuda()
    src = padded_batch([5, 2, 7], seed=6).cuda()
    graphed = generate_with_cuda_graph(model, src, max_new_tokens=24)
    state, tokens, eager = model.start(src, max_new_tokens=24), torch.ones(3, dtype=torch.long).cuda(), []
    for _ in range(24):
        logits = model.step(tokens, state)
        logits[:, [model.config.pad_id, model.config.bos_id]] = float("-inf")
        tokens = logits.argmax(dim=-1)
        eager.append(tokens)
    assert torch.equal(graphed, torch.stack(eager, dim=1))


def test_rows_at_different_positions_step_like_each_row_alone(mixer_pattern):
    # What continuous refill needs: a slot-indexed state whose rows are at their own positions.
    model = tiny_model(mixer_pattern, seed=7)
    src, tgt = padded_batch([4, 6], seed=8), padded_batch([8, 8], seed=9)
    state = model.start(src, max_new_tokens=8)
    positions = torch.tensor([0, 0])
    model.step_unchecked(tgt[:, 0], state, positions)
    positions = torch.tensor([1, 0])  # row 1 restarts: its state is reset and its position rewound
    with torch.inference_mode():
        for mixer_state in state.mixer_states:
            for tensor in mixer_state.tensors():
                tensor[1].zero_()
    logits = model.step_unchecked(torch.stack([tgt[0, 1], tgt[1, 0]]), state, positions)
    alone = model.start(src[1:], max_new_tokens=8)
    assert (logits[1] - model.step(tgt[1:, 0], alone)[0]).abs().max().item() <= 1e-4
    assert (logits[0] - model(src[:1], tgt[:1, :2])[0, 1]).abs().max().item() <= 1e-4

"""Cached generation equals the uncached loop; a padded batch decodes like each source alone."""

import pytest
import torch
from conftest import padded_batch, tiny_model

from hybrid import MIXERS
from hybrid.state import FIRST_CAPACITY

LENGTHS = [9, 2, 5, 7, 1, 4]


def test_cached_generation_equals_uncached_loop(mixer_pattern):
    model = tiny_model(mixer_pattern, seed=1)
    src = padded_batch(LENGTHS, seed=11)
    cached = model.generate(src, max_new_tokens=40)
    uncached = model.generate(src, max_new_tokens=40, use_cache=False)
    assert torch.equal(cached, uncached)


def test_padded_batch_decodes_like_each_source_alone(mixer_pattern):
    model = tiny_model(mixer_pattern, seed=2)
    src = padded_batch(LENGTHS, seed=12)
    batched = model.generate(src, max_new_tokens=30)
    for row, length in enumerate(LENGTHS):
        alone = model.generate(src[row:row + 1, :length], max_new_tokens=30)
        assert torch.equal(batched[row, :alone.shape[1]], alone[0]), row
        assert (batched[row, alone.shape[1]:] == model.config.pad_id).all()


def test_output_format_eos_then_padding():
    model = tiny_model(["lstm", "attention"], seed=3)
    out = model.generate(padded_batch([3, 5, 7, 2] * 4, seed=13), max_new_tokens=25)
    config = model.config
    assert out.shape[0] == 16 and 1 <= out.shape[1] <= 25
    assert not (out == config.bos_id).any()
    ended = 0
    for row in out.tolist():
        if config.eos_id in row:
            ended += 1
            end = row.index(config.eos_id)
            assert all(token == config.pad_id for token in row[end + 1:])
            assert config.pad_id not in row[:end]
        else:
            assert len(row) == 25 and config.pad_id not in row
    assert ended > 0, "the fixture should make some sequences stop early"


def test_eos_check_interval_does_not_change_the_result():
    model = tiny_model(["attention", "lstm"], seed=4)
    src = padded_batch(LENGTHS, seed=14)
    reference = model.generate(src, max_new_tokens=30)
    for interval in (2, 5, 30):
        assert torch.equal(model.generate(src, max_new_tokens=30, eos_check_interval=interval), reference)


@pytest.mark.parametrize("name", sorted(name for name, mixer in MIXERS.items() if mixer.constant_state))
def test_a_constant_state_does_not_grow_with_length(name):
    model = tiny_model([name] * 3)
    src = padded_batch([4, 6])
    short, long = model.start(src, max_steps=8), model.start(src, max_steps=512)
    tokens = torch.full((2,), model.config.bos_id)
    for _ in range(8):
        model.step(tokens, short)
    addresses = [tensor.data_ptr() for state in long.mixer_states for tensor in state.tensors()]
    for _ in range(512):
        model.step(tokens, long)
    assert short.mixer_nbytes == long.mixer_nbytes > 0
    assert short.nbytes == long.nbytes
    # Updated in place, never reallocated.
    assert [tensor.data_ptr() for state in long.mixer_states for tensor in state.tensors()] == addresses


def test_attention_cache_grows_with_the_tokens_fed_in_doubling_buckets_up_to_max_steps():
    model = tiny_model(["attention"] * 3)
    src = padded_batch([4, 6])
    short, long = model.start(src, max_steps=8), model.start(src, max_steps=100)
    assert (short.capacity, long.capacity) == (8, FIRST_CAPACITY)
    assert long.mixer_nbytes == FIRST_CAPACITY // 8 * short.mixer_nbytes
    tokens = torch.full((2,), model.config.bos_id)
    capacities = []
    for _ in range(100):
        model.step(tokens, long)
        capacities.append(long.capacity)
    assert sorted(set(capacities)) == [16, 32, 64, 100]
    assert capacities.index(32) == 16 and capacities.index(100) == 64  # grown on the step that needs it
    assert 8 * long.mixer_nbytes == 100 * short.mixer_nbytes


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_reorder_selects_and_shrinks_state(name):
    model = tiny_model([name, name], seed=5)
    src = padded_batch([3, 5, 4], seed=15)
    tokens = padded_batch([6, 6, 6], seed=16)
    full = model.start(src, max_steps=6)
    for t in range(3):
        model.step(tokens[:, t], full)
    full.reorder(torch.tensor([2, 0]))
    assert full.batch_size == 2
    alone = model.start(src[[2, 0]], max_steps=6)
    for t in range(3):
        model.step(tokens[[2, 0], t], alone)
    for t in range(3, 6):
        expected = model.step(tokens[[2, 0], t], alone)
        assert (model.step(tokens[[2, 0], t], full) - expected).abs().max().item() <= 1e-4

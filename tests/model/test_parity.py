"""The backbone: step-wise (cached) decoding equals the parallel, teacher-forced pass, for every mixer."""

import pytest
import torch
from conftest import TRANSFORMERS_FAMILIES, VOCAB, family_architecture, padded_batch, tiny_model

from hybrid import MIXERS


def test_step_logits_equal_teacher_forced_logits(mixer_pattern):
    assert_steps_equal_parallel(tiny_model(mixer_pattern))


@pytest.mark.parametrize("family", TRANSFORMERS_FAMILIES)
def test_step_logits_equal_teacher_forced_logits_in_every_imported_familys_architecture(family):
    # Every mixer, stacked, under the family's positions, norms, activation and embedding scale.
    assert_steps_equal_parallel(tiny_model(list(MIXERS), **family_architecture(family)))


def assert_steps_equal_parallel(model):
    src = padded_batch([7, 3, 5, 1], seed=1)
    tgt = padded_batch([6, 2, 9, 4], seed=2)
    tgt = torch.cat([torch.full((4, 1), model.config.bos_id), tgt], dim=1)  # decoder input starts with BOS

    parallel = model(src, tgt)  # (B, T, V)
    state = model.start(src, max_steps=tgt.shape[1])
    stepped = torch.stack([model.step(tgt[:, t], state) for t in range(tgt.shape[1])], dim=1)

    assert stepped.shape == parallel.shape == (4, tgt.shape[1], VOCAB)
    assert (stepped - parallel).abs().max().item() <= 1e-4


def test_parity_with_a_narrower_projected_lstm():
    model = tiny_model(["lstm", "attention"], mixer_options={"lstm": {"hidden_size": 20}})
    src, tgt = padded_batch([5, 8], seed=3), padded_batch([7, 7], seed=4)
    state = model.start(src, max_steps=7)
    stepped = torch.stack([model.step(tgt[:, t], state) for t in range(7)], dim=1)
    assert (stepped - model(src, tgt)).abs().max().item() <= 1e-4


def test_parity_holds_at_long_positions_for_every_mixer():
    # Rotary tables and the KV cache must stay exact deep into the sequence.
    for name in MIXERS:
        model = tiny_model([name, name], max_positions=600)
        src, tgt = padded_batch([4, 6], seed=5), padded_batch([600, 600], seed=6)
        state = model.start(src, max_steps=600)
        stepped = torch.stack([model.step(tgt[:, t], state) for t in range(600)], dim=1)
        assert (stepped - model(src, tgt)).abs().max().item() <= 1e-4, name


def test_left_and_right_padded_sources_encode_alike():
    # Rotary positions are relative, so where the padding sits does not matter.
    model = tiny_model(["lstm"])
    right = padded_batch([5, 3], seed=7)
    left = right.clone()
    left[1] = torch.cat([torch.zeros(2, dtype=torch.long), right[1, :3]])
    tgt = padded_batch([4, 4], seed=8)
    assert (model(left, tgt)[1] - model(right, tgt)[1]).abs().max().item() <= 1e-4

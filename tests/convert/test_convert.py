"""Conversion keeps every weight but the swapped mixers, bit for bit, and stays exact step-wise."""

import pytest
import torch
from conftest import padded_batch, tiny_model

from hybrid import MIXERS
from hybrid.convert import convert, parse_pattern


@pytest.mark.parametrize("pattern, expected", [
    ("lstm", ["lstm"] * 4),
    ("lstm,lstm,attention,lstm", ["lstm", "lstm", "attention", "lstm"]),
    ("0-2:lstm,3:attention", ["lstm", "lstm", "lstm", "attention"]),
    (["attention", "lstm", "lstm", "lstm"], ["attention", "lstm", "lstm", "lstm"]),
    (["0-2:lstm", "3:attention"], ["lstm", "lstm", "lstm", "attention"]),  # Hydra's pattern=[0-2:lstm,3:attention]
    (["attention"], ["attention"] * 4),
])
def test_patterns(pattern, expected):
    assert parse_pattern(pattern, 4) == expected


@pytest.mark.parametrize("pattern, message", [
    ("gru", "unknown mixer 'gru'"),
    ("lstm,lstm", "names 2 layers but the model has 4"),
    ("0-1:lstm", r"leaves decoder layers \[2, 3\]"),
    ("0-2:lstm,2-3:attention", "names layer 2 twice"),
    ("0-9:lstm", r"layers must lie in \[0, 3\]"),
    ("a:lstm", "must look like"),
])
def test_bad_patterns(pattern, message):
    with pytest.raises(ValueError, match=message):
        parse_pattern(pattern, 4)


@pytest.mark.parametrize("target", sorted(MIXERS))
def test_every_copied_tensor_is_bit_identical(target):
    source = tiny_model(["attention"] * 3, seed=1)
    converted, fresh = convert(source, f"0-1:{target},2:attention")
    before = source.state_dict()
    swapped = ("decoder_layers.0.mixer.", "decoder_layers.1.mixer.") if target != "attention" else ()
    for key, value in converted.state_dict().items():
        if swapped and key.startswith(swapped):
            assert key in fresh
        else:
            assert torch.equal(value, before[key]), key
    assert all(name.startswith(swapped) for name in fresh) and bool(fresh) == bool(swapped)
    assert converted.config.decoder_mixers == [target, target, "attention"]


def test_converted_model_is_exact_step_wise():
    converted, _ = convert(tiny_model(["attention"] * 3, seed=2), "lstm,attention,lstm", lstm_hidden_size=24)
    converted.eval()
    src, tgt = padded_batch([5, 3], seed=3), padded_batch([6, 6], seed=4)
    state = converted.start(src, max_steps=6)
    stepped = torch.stack([converted.step(tgt[:, t], state) for t in range(6)], dim=1)
    assert (stepped - converted(src, tgt)).abs().max().item() <= 1e-4
    assert torch.equal(converted.generate(src, max_new_tokens=12),
                       converted.generate(src, max_new_tokens=12, use_cache=False))

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
    ("no-such-mixer", "unknown mixer 'no-such-mixer'"),
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
    carried = tuple(f"{layer}{module}." for layer in swapped
                    for module in MIXERS[target].carried_over.get("attention", ()))
    drawn = {name for name, _ in converted.named_buffers()}  # new but never trained: performer's features
    for key, value in converted.state_dict().items():
        if key.startswith(swapped) and not key.startswith(carried):
            assert key in fresh or key in drawn, key
        else:
            assert torch.equal(value, before[key]), key
    assert all(name.startswith(swapped) and not name.startswith(carried) for name in fresh)
    new_parameters = sum(1 for name, _ in converted.named_parameters() if name.startswith(swapped)
                         and not name.startswith(carried))
    assert len(fresh) == new_parameters
    assert converted.config.decoder_mixers == [target, target, "attention"]


def _converted_keeping_projections(target: str, options: dict):
    """A 3-layer attention model converted to ``target`` with ``options``, after checking that every layer kept
    the attention layer's Q/K/V and output projections bit for bit."""
    source = tiny_model(["attention"] * 3, seed=5)
    converted, fresh = convert(source, target, mixer_options={target: options})
    before = source.state_dict()
    for layer in range(3):
        prefix = f"decoder_layers.{layer}.mixer."
        for name in ("qkv.weight", "qkv.bias", "out.weight", "out.bias"):
            assert torch.equal(converted.state_dict()[prefix + name], before[prefix + name]), prefix + name
    return converted, fresh, before


def test_t2r_keeps_the_attention_projections_and_learns_only_its_feature_map():
    converted, fresh, _ = _converted_keeping_projections("t2r", {"feature_size": 8})
    for layer in range(3):  # (heads, r, head_dim)
        assert converted.get_parameter(f"decoder_layers.{layer}.mixer.feature_weight").shape == (4, 8, 8)
    assert sorted(fresh) == sorted(f"decoder_layers.{layer}.mixer.{name}" for layer in range(3)
                                   for name in ("feature_weight", "feature_bias"))


def test_performer_keeps_the_attention_projections_and_draws_only_its_features():
    converted, fresh, before = _converted_keeping_projections("performer", {"feature_size": 12})
    for layer in range(3):  # (m, head_dim), shared by heads
        assert converted.get_buffer(f"decoder_layers.{layer}.mixer.projection").shape == (12, 8)
    assert fresh == []  # nothing to learn first: the features are drawn, not trained
    assert sorted(key for key in converted.state_dict() if key not in before) == [
        f"decoder_layers.{layer}.mixer.projection" for layer in range(3)]


@pytest.mark.parametrize("source_mixer, target", [("performer", "t2r"), ("t2r", "performer"), ("linear", "performer"),
                                                   ("performer", "linear")])
def test_the_linear_attentions_keep_each_others_projections(source_mixer, target):
    source = tiny_model([source_mixer] * 2, seed=6)
    converted, _ = convert(source, target)
    for name in ("qkv.weight", "qkv.bias", "out.weight", "out.bias"):
        key = f"decoder_layers.1.mixer.{name}"
        assert torch.equal(converted.state_dict()[key], source.state_dict()[key]), key


def test_converted_model_is_exact_step_wise():
    converted, _ = convert(tiny_model(["attention"] * 3, seed=2), "lstm,attention,lstm",
                           mixer_options={"lstm": {"hidden_size": 24}})
    converted.eval()
    src, tgt = padded_batch([5, 3], seed=3), padded_batch([6, 6], seed=4)
    state = converted.start(src, max_steps=6)
    stepped = torch.stack([converted.step(tgt[:, t], state) for t in range(6)], dim=1)
    assert (stepped - converted(src, tgt)).abs().max().item() <= 1e-4
    assert torch.equal(converted.generate(src, max_new_tokens=12),
                       converted.generate(src, max_new_tokens=12, use_cache=False))

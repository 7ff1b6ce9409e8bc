import json

import pytest

from hybrid import MIXERS, ModelConfig


def test_single_name_expands_to_every_layer():
    config = ModelConfig(decoder_layers=4, decoder_mixers="lstm")
    assert config.decoder_mixers == ["lstm"] * 4


def test_round_trips_through_json():
    config = ModelConfig(vocab_size=40, d_model=64, n_heads=2, decoder_layers=3,
                         decoder_mixers=["lstm", "attention", "lstm"], lstm_hidden_size=40)
    rebuilt = ModelConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert rebuilt == config


def test_lstm_width_defaults_to_d_model():
    assert ModelConfig(d_model=96, n_heads=3).lstm_width == 96
    assert ModelConfig(d_model=96, n_heads=3, lstm_hidden_size=50).lstm_width == 50


@pytest.mark.parametrize("fields, names", [
    (dict(decoder_mixers="gru"), ["decoder_mixers", "gru", *MIXERS]),
    (dict(decoder_layers=3, decoder_mixers=["lstm", "lstm"]), ["decoder_mixers", "2", "decoder_layers"]),
    (dict(d_model=100, n_heads=3), ["d_model", "n_heads"]),
    (dict(d_model=0), ["d_model", "positive"]),
    (dict(vocab_size=-5), ["vocab_size", "positive"]),
    (dict(encoder_layers=0), ["encoder_layers"]),
    (dict(d_ff=2.5), ["d_ff"]),
    (dict(lstm_hidden_size=0), ["lstm_hidden_size"]),
    (dict(max_positions=0), ["max_positions"]),
    (dict(vocab_size=10, eos_id=10), ["eos_id", "vocab_size=10"]),
    (dict(pad_id=-1), ["pad_id"]),
    (dict(bos_id=0, pad_id=0), ["pad_id", "bos_id"]),
    (dict(dropout=1.5), ["dropout"]),
])
def test_bad_fields_raise_value_error_naming_them(fields, names):
    with pytest.raises(ValueError) as error:
        ModelConfig(**fields)
    for name in names:
        assert name in str(error.value)


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown ModelConfig fields.*'widht'"):
        ModelConfig.from_dict({"widht": 3})

import json

import pytest

from hybrid import MIXERS, ModelConfig


def test_single_name_expands_to_every_layer():
    config = ModelConfig(decoder_layers=4, decoder_mixers="lstm")
    assert config.decoder_mixers == ["lstm"] * 4


def test_round_trips_through_json():
    config = ModelConfig(vocab_size=40, d_model=64, n_heads=2, decoder_layers=3,
                         decoder_mixers=["lstm", "attention", "lstm"], mixer_options={"lstm": {"hidden_size": 40}})
    rebuilt = ModelConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert rebuilt == config


def test_each_mixer_keeps_its_own_options_with_defaults_spelled_out():
    assert ModelConfig(d_model=96, n_heads=3).options_for("lstm").width(96) == 96
    config = ModelConfig(d_model=96, n_heads=3, mixer_options={"lstm": {"hidden_size": 50}, "attention": {}})
    assert config.options_for("lstm").width(96) == 50
    assert config.mixer_options == {"attention": {}, "lstm": {"hidden_size": 50, "output_projection": True,
                                                              "forget_bias": None}}
    # A mixer the decoder uses is spelled out even when not given, so a saved config says what was built.
    assert ModelConfig(decoder_mixers="gru").mixer_options == {"gru": {"hidden_size": None, "output_projection": True}}
    for name in MIXERS:  # every registered mixer's defaults make a valid config
        assert ModelConfig(mixer_options={name: {}}).options_for(name) == MIXERS[name].Options()


def test_a_config_saved_before_the_architecture_fields_builds_what_it_built():
    saved = ModelConfig(d_model=64, n_heads=2).to_dict()
    for name in ("positions", "position_offset", "pre_norm", "embedding_norm", "final_norm", "activation",
                 "embedding_scale", "final_logits_bias"):
        del saved[name]
    assert ModelConfig.from_saved(saved) == ModelConfig(d_model=64, n_heads=2)


def test_the_decoder_may_start_from_padding_or_eos_as_imported_models_do():
    assert ModelConfig(pad_id=5, bos_id=5, eos_id=0).bos_id == 5  # Marian: decoding starts from its pad id
    assert ModelConfig(pad_id=1, bos_id=2, eos_id=2).bos_id == 2  # BART: from </s>


def test_a_config_saved_with_the_old_shared_lstm_hidden_size_field_still_loads():
    saved = {**ModelConfig(d_model=64, n_heads=2).to_dict(), "lstm_hidden_size": 40}
    del saved["mixer_options"]
    config = ModelConfig.from_dict(saved)
    assert config.options_for("lstm").hidden_size == 40


@pytest.mark.parametrize("fields, names", [
    (dict(decoder_mixers="no-such-mixer"), ["decoder_mixers", "no-such-mixer", *MIXERS]),
    (dict(decoder_layers=3, decoder_mixers=["lstm", "lstm"]), ["decoder_mixers", "2", "decoder_layers"]),
    (dict(d_model=100, n_heads=3), ["d_model", "n_heads"]),
    (dict(d_model=0), ["d_model", "positive"]),
    (dict(vocab_size=-5), ["vocab_size", "positive"]),
    (dict(encoder_layers=0), ["encoder_layers"]),
    (dict(d_ff=2.5), ["d_ff"]),
    (dict(mixer_options={"lstm": {"hidden_size": 0}}), ["mixer_options.lstm.hidden_size", "positive"]),
    (dict(mixer_options={"lstm": {"width": 3}}), ["mixer_options.lstm", "width", "hidden_size"]),
    (dict(mixer_options={"no-such-mixer": {}}), ["mixer_options", "no-such-mixer", *MIXERS]),
    (dict(mixer_options=[]), ["mixer_options"]),
    (dict(mixer_options={"lstm": 5}), ["mixer_options.lstm", "dict"]),
    (dict(max_positions=0), ["max_positions"]),
    (dict(vocab_size=10, eos_id=10), ["eos_id", "vocab_size=10"]),
    (dict(pad_id=-1), ["pad_id"]),
    (dict(eos_id=0, pad_id=0), ["pad_id", "eos_id"]),
    (dict(positions="alibi"), ["positions", "rotary", "learned", "sinusoidal"]),
    (dict(positions="learned", position_offset=-2), ["position_offset"]),
    (dict(activation="tanh"), ["activation", "gelu", "relu", "silu"]),
    (dict(pre_norm="yes"), ["pre_norm"]),
    (dict(final_logits_bias=1), ["final_logits_bias"]),
    (dict(embedding_scale=0), ["embedding_scale"]),
    (dict(dropout=1.5), ["dropout"]),
    (dict(dropout=float("nan")), ["dropout"]),
    (dict(layer_norm_eps=-1), ["layer_norm_eps"]),
    (dict(layer_norm_eps=float("nan")), ["layer_norm_eps"]),
    (dict(layer_norm_eps="x"), ["layer_norm_eps"]),
    (dict(tie_embeddings="no"), ["tie_embeddings"]),
    (dict(extra=[1]), ["extra"]),
    (dict(decoder_mixers=None), ["decoder_mixers", *MIXERS]),
    (dict(decoder_mixers=5), ["decoder_mixers"]),
    (dict(decoder_layers=2, decoder_mixers=[["lstm"], ["lstm"]]), ["decoder_mixers", "['lstm']"]),
])
def test_bad_fields_raise_value_error_naming_them(fields, names):
    with pytest.raises(ValueError) as error:
        ModelConfig(**fields)
    for name in names:
        assert name in str(error.value)


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown ModelConfig fields.*'widht'"):
        ModelConfig.from_dict({"widht": 3})


def test_from_dict_rejects_missing_fields_rather_than_filling_in_defaults():
    data = ModelConfig(d_model=64, n_heads=2).to_dict()
    del data["d_model"]  # a default would build a model of another width than the saved weights
    with pytest.raises(ValueError, match=r"fields \['d_model'\] are missing"):
        ModelConfig.from_dict(data)
    with pytest.raises(ValueError, match="JSON object"):
        ModelConfig.from_dict(["not", "a", "dict"])


@pytest.mark.parametrize("mixer", ["lstm", "gru"])
def test_a_recurrent_model_saved_before_output_projection_rebuilds_its_layout_and_loads_its_weights(mixer):
    import torch

    from hybrid import Seq2Seq

    old = ModelConfig(vocab_size=12, d_model=16, n_heads=2, d_ff=32, decoder_mixers=[mixer, "attention", mixer],
                      mixer_options={mixer: {"output_projection": False}})
    weights = Seq2Seq(old).state_dict()  # equal width, no projection: the layout before the option
    saved = old.to_dict()
    del saved["mixer_options"][mixer]["output_projection"]  # what such a model's config.json holds
    rebuilt = ModelConfig.from_saved(json.loads(json.dumps(saved)))
    assert rebuilt.options_for(mixer).output_projection is False
    model = Seq2Seq(rebuilt)
    model.load_state_dict(weights, strict=True)
    assert isinstance(model.decoder_layers[0].mixer.out, torch.nn.Identity)
    # A config saved today spells the option out, and from_saved leaves it as it was.
    assert ModelConfig.from_saved(ModelConfig(decoder_mixers=mixer).to_dict()).options_for(mixer).output_projection
    # An equal-width layer built today has its projection, initialised small like attention's.
    layer = Seq2Seq(ModelConfig(vocab_size=12, d_model=16, n_heads=2, d_ff=32, decoder_mixers=mixer))
    assert isinstance(layer.decoder_layers[0].mixer.out, torch.nn.Linear)
    assert layer.decoder_layers[0].mixer.out.weight.std() < 0.05

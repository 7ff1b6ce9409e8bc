"""The registry of decoder token mixers: a name in ``ModelConfig.decoder_mixers`` -> its class.

Adding a mixer is one file with its parallel form, step form, state class and options class
(``Mixer.Options``: its own hyperparameters, kept in ``ModelConfig.mixer_options``), plus one
line here; config validation, the model, the tests, conversion and the benchmark all
read this registry.
"""

from hybrid.mixers.aan import AverageAttentionMixer
from hybrid.mixers.attention import AttentionMixer, KVCache
from hybrid.mixers.base import Mixer, MixerOptions, MixerState
from hybrid.mixers.gru import GRUMixer
from hybrid.mixers.linear import LinearAttentionMixer
from hybrid.mixers.lstm import LSTMMixer, LSTMOptions, LSTMState, RecurrentOptions
from hybrid.mixers.performer import PerformerMixer
from hybrid.mixers.ssru import SSRUMixer
from hybrid.mixers.t2r import T2RMixer

MIXERS: dict[str, type[Mixer]] = {
    "attention": AttentionMixer,
    "lstm": LSTMMixer,
    "gru": GRUMixer,
    "ssru": SSRUMixer,
    "aan": AverageAttentionMixer,
    "linear": LinearAttentionMixer,
    "t2r": T2RMixer,
    "performer": PerformerMixer,
}

__all__ = ["MIXERS", "Mixer", "MixerOptions", "MixerState", "AttentionMixer", "KVCache", "LSTMMixer", "LSTMState",
           "RecurrentOptions", "LSTMOptions", "GRUMixer", "SSRUMixer", "AverageAttentionMixer", "LinearAttentionMixer",
           "T2RMixer", "PerformerMixer"]

"""The registry of decoder token mixers: a name in ``ModelConfig.decoder_mixers`` -> its class.

Adding a mixer is one file with its parallel form, step form and state class, plus one
line here; config validation, the model, the tests, conversion and the benchmark all
read this registry.
"""

from hybrid.mixers.attention import AttentionMixer, KVCache
from hybrid.mixers.base import Mixer, MixerState
from hybrid.mixers.lstm import LSTMMixer, LSTMState

MIXERS: dict[str, type[Mixer]] = {
    "attention": AttentionMixer,
    "lstm": LSTMMixer,
}

__all__ = ["MIXERS", "Mixer", "MixerState", "AttentionMixer", "KVCache", "LSTMMixer", "LSTMState"]

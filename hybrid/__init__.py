"""hybrid: a transformer encoder with an LSTM (or any registered mixer) decoder, built for fast decoding."""

from hybrid.config import ModelConfig
from hybrid.mixers import MIXERS
from hybrid.model import Seq2Seq
from hybrid.state import DecodeState

__all__ = ["ModelConfig", "Seq2Seq", "DecodeState", "MIXERS"]
__version__ = "0.1.0"

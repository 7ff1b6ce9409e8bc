"""hybrid: a transformer encoder with an LSTM (or any registered mixer) decoder, built for fast decoding."""

from hybrid.config import ModelConfig
from hybrid.mixers import MIXERS
from hybrid.model import Seq2Seq
from hybrid.state import DecodeState

__all__ = ["ModelConfig", "Seq2Seq", "DecodeState", "MIXERS", "LitSeq2Seq"]
__version__ = "0.1.0"


def __getattr__(name: str) -> type:
    # LitSeq2Seq is imported on first use, so `import hybrid` (and inference) never needs Lightning.
    if name == "LitSeq2Seq":
        from hybrid.training.module import LitSeq2Seq

        return LitSeq2Seq
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Training: the Lightning module, the data modules and the synthetic tasks, plus what turns a config into them
(``builders``) and a checkpoint into a model (``checkpoint``).

The tasks and ``checkpoint`` are plain Python. Everything that needs Lightning (``LitSeq2Seq``, the data
modules) is imported on first use, so inference can read a checkpoint without Lightning; the configs name
the data modules here (``hybrid.training.G2PDataModule``).
"""

import importlib
from typing import Any

from hybrid.training.tasks import SyntheticTask

_LIGHTNING_EXPORTS = {
    "LitSeq2Seq": "hybrid.training.module",
    "Seq2SeqDataModule": "hybrid.training.data",
    "SyntheticDataModule": "hybrid.training.data",
    "G2PDataModule": "hybrid.training.data",
    "TextDataModule": "hybrid.training.data",
    "collate": "hybrid.training.data",
}

__all__ = ["SyntheticTask", *_LIGHTNING_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _LIGHTNING_EXPORTS:
        return getattr(importlib.import_module(_LIGHTNING_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The Lightning data modules: synthetic tasks, CMUdict grapheme-to-phoneme, and users' parallel text.

Each turns `(source, target)` string pairs into padded batches through `Seq2SeqDataModule` (`base`), and
declares its task: `task_name`, `metrics()` and `example_row`. The training loader is `loading`'s. The
tokenizer is cheap to build and available before `setup()`, because the training entry point reads
`vocab_size` to build the model before the Trainer runs. Everything is determined by `seed`: the data,
the splits and the order of training batches.
"""

from hybrid.training.data.base import Example, Seq2SeqDataModule, collate
from hybrid.training.data.g2p import G2PDataModule
from hybrid.training.data.loading import EpochSeededSampler, ResumableDataLoader
from hybrid.training.data.synthetic import SyntheticDataModule
from hybrid.training.data.text import TextDataModule

__all__ = ["Example", "Seq2SeqDataModule", "collate", "EpochSeededSampler", "ResumableDataLoader",
           "SyntheticDataModule", "G2PDataModule", "TextDataModule"]

"""Users' parallel text: TSV or JSONL files of (source, target) pairs, with held-out splits given or cut off."""

from __future__ import annotations

import random
from typing import Any, Literal

from hybrid.records import Pair, ParseReport, read_parallel_file
from hybrid.tokenizer import Seq2SeqTokenizer
from hybrid.training.data.base import Seq2SeqDataModule, check_fractions


class TextDataModule(Seq2SeqDataModule):
    """Users' parallel text from TSV or JSONL files (see `read_parallel_file`).

    Without `val_path`/`test_path`, that split is cut from the training file: the training pairs
    are shuffled with `seed` and `val_fraction`/`test_fraction` of them are set aside. The
    tokenizer (`"char"`, `"space"` or `"bpe"` with `bpe_vocab_size`; `target_tokenizer` splits
    the target differently when given) is trained on the training split only, so symbols that
    appear only in validation or test become `<unk>`, as they would for new data, and are
    logged. `max_source_length`/`max_target_length` (in tokens, the source's eos included) limit the pairs
    as `too_long` says. Every dropped line is counted in `reports[split]`; `skipped` sums them.
    """

    def __init__(
        self,
        train_path: str,
        val_path: str | None = None,
        test_path: str | None = None,
        format: Literal["auto", "tsv", "jsonl"] = "auto",
        tokenizer: Literal["char", "space", "bpe"] = "char",
        target_tokenizer: Literal["char", "space", "bpe"] | None = None,
        bpe_vocab_size: int = 8000,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        **loader_options: Any,
    ) -> None:
        super().__init__(**loader_options)
        check_fractions(val_fraction, test_fraction)
        self.paths = {"train": train_path, "val": val_path, "test": test_path}
        self.fractions = {"val": val_fraction, "test": test_fraction}
        self.format = format
        self.source_level = tokenizer
        self.target_level = target_tokenizer or tokenizer
        self.bpe_vocab_size = bpe_vocab_size

    @property
    def task_name(self) -> str:
        return "text"

    def metrics(self) -> tuple[str, ...]:
        return ("exact_match", "bleu", "chrf")  # on torchmetrics' 0-1 scale

    def _load_pairs(self) -> dict[str, list[Pair]]:
        train, self.reports["train"] = read_parallel_file(self.paths["train"], self.format)
        random.Random(self.seed).shuffle(train)
        total = len(train)  # fractions are of the whole file, whatever was set aside before
        pairs = {}
        for split in ("val", "test"):
            if self.paths[split] is not None:
                pairs[split], self.reports[split] = read_parallel_file(self.paths[split], self.format)
            else:
                size = round(total * self.fractions[split])
                pairs[split], train = train[:size], train[size:]
                description = f"{self.paths['train']} ({self.fractions[split]:.1%} set aside for {split})"
                self.reports[split] = ParseReport(description, kept=size)
        self.reports["train"].kept = len(train)
        return {"train": train, **pairs}

    def _make_tokenizer(self) -> Seq2SeqTokenizer:
        train = self.pairs["train"]
        return Seq2SeqTokenizer.train(
            [source for source, _ in train],
            [target for _, target in train],
            self.source_level,
            self.target_level,
            vocab_size=self.bpe_vocab_size,
            source_eos=self.source_eos,
        )

"""Synthetic data: the algorithmic tasks of `hybrid.training.tasks` (copy, reverse, sort, addition, recall)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from hybrid.records import Pair
from hybrid.tokenizer import Seq2SeqTokenizer
from hybrid.training.data.base import Seq2SeqDataModule
from hybrid.training.tasks import SyntheticTask


def _sample_pairs(task: SyntheticTask, rng: random.Random, size: int, exclude: set[str]) -> list[Pair]:
    """`size` pairs from `task`, none of whose sources is in `exclude`."""
    pairs: list[Pair] = []
    attempts_left = 20 * size + 1000  # only a task space about as small as `size` gets near this
    while len(pairs) < size:
        if attempts_left == 0:
            raise ValueError(f"{task} has too few distinct sources for {size} examples unseen in training")
        attempts_left -= 1
        source, target = task.sample(rng)
        if source not in exclude:
            pairs.append((source, target))
    return pairs


class SyntheticDataModule(Seq2SeqDataModule):
    """Algorithmic tasks (copy, reverse, sort, addition, recall) from `hybrid.training.tasks`.

    Each split is generated once, up front (not per index), from its own random stream seeded by
    `seed` and the split name, so the same `seed` gives the same data in every run, and every
    epoch revisits the same training examples in a new order. Validation and test sources never
    occur in the training set, so their scores measure generalisation rather than memorisation.
    The test split can use longer (or shorter) examples than training via `test_min_length`/
    `test_max_length` to measure length extrapolation; the validation split always matches
    training. See `SyntheticTask` for the tasks and their knobs.
    """

    def __init__(
        self,
        task: str = "copy",
        min_length: int = 1,
        max_length: int = 16,
        num_symbols: int = 10,
        num_queries: int = 8,
        table_order: str = "sorted",
        train_size: int = 10_000,
        val_size: int = 500,
        test_size: int = 500,
        test_min_length: int | None = None,
        test_max_length: int | None = None,
        **loader_options: Any,
    ) -> None:
        super().__init__(**loader_options)
        self.task = SyntheticTask(task, min_length, max_length, num_symbols, num_queries, table_order)
        self.test_task = dataclasses.replace(
            self.task,
            min_length=min_length if test_min_length is None else test_min_length,
            max_length=max_length if test_max_length is None else test_max_length,
        )
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}

    @property
    def task_name(self) -> str:
        return self.task.name

    def metrics(self) -> tuple[str, ...]:
        return ("exact_match", "cer")  # symbols, not words: the character error rate

    def _make_tokenizer(self) -> Seq2SeqTokenizer:
        # The alphabet is known in advance and does not depend on lengths, so no data is needed.
        return Seq2SeqTokenizer.train([self.task.alphabet], [self.task.alphabet], "char", "char",
                                      source_eos=self.source_eos)

    def _load_pairs(self) -> dict[str, list[Pair]]:
        def rng(split: str) -> random.Random:
            return random.Random(f"{self.seed}/{split}")  # str seeds are hashed stably across runs

        train = _sample_pairs(self.task, rng("train"), self.sizes["train"], exclude=set())
        seen = {source for source, _ in train}
        return {
            "train": train,
            "val": _sample_pairs(self.task, rng("val"), self.sizes["val"], exclude=seen),
            "test": _sample_pairs(self.test_task, rng("test"), self.sizes["test"], exclude=seen),
        }

"""Synthetic seq2seq tasks that probe what the decoder can carry in its recurrent state.

Every task draws `(source, target)` string pairs from a `random.Random`, so a seed fixes the data.
Symbols are printable characters (letters for the sequence tasks, digits for addition), which
keeps the char-level tokenizer sufficient and makes examples readable when printed.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from hybrid.validators import check_choice, check_int

SEQUENCE_SYMBOLS = string.ascii_lowercase + string.ascii_uppercase  # 52 symbols; sorted() orders "A" < "a"
RECALL_SEPARATOR = "|"  # ends the sequence, in the source and in the target
RECALL_KEYS = string.digits  # one token per position, so that a key is one content match
QUERY_SEPARATOR = ","  # between the query positions of the recall task
TABLE_ORDERS = ("sorted", "source")  # the order of the recall table's letters


@dataclass(frozen=True)
class SyntheticTask:
    """One synthetic task and the knobs that size its examples.

    Tasks (`name`):
      - `copy`: target = source;  `reverse`: target = source reversed;  `sort`: target = sorted(source).
        The source is `min_length..max_length` symbols drawn from the first `num_symbols` letters.
      - `addition`: source "123+4567", target "4690". Each operand has `min_length..max_length`
        digits (no leading zero), so `num_symbols` is unused.
      - `recall`: multi-query associative recall (Zoology's MQAR) over the decoder's own output.
        Source: a sequence `a` of n = `min_length..max_length` letters (n <= 10), "|", then
        `num_queries` 0-based positions in 0..n-1 separated by ",". Target: a table of the letters,
        each keyed by its position, "|", then each queried key followed by its value. The table's
        letters are in `table_order`: `"sorted"`, "dbca|3,0" -> "0a1b2c3d|3d0a", or `"source"`,
        "dbca|3,0" -> "0d1b2c3a|3a0d". For self-attention a value is one content lookup in its own
        output (find the key, copy the token after it). A sorted table is a function of the source's
        letter counts, which a constant state holds whatever the table's length, and which
        cross-attention reads at every step; a table in source order is not: a constant-state
        decoder must hold its n letters, or find source position p through cross-attention. Keys
        are single digits, hence n <= 10.
    """

    name: str
    min_length: int = 1
    max_length: int = 16
    num_symbols: int = 10
    num_queries: int = 8
    table_order: str = "sorted"

    def __post_init__(self) -> None:
        check_choice("task", self.name, sorted(_GENERATORS))  # the data module's option that names it
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {self.min_length}, {self.max_length}")
        if not 1 <= self.num_symbols <= len(SEQUENCE_SYMBOLS):
            raise ValueError(f"num_symbols must be in 1..{len(SEQUENCE_SYMBOLS)}, got {self.num_symbols}")
        check_int("num_queries", self.num_queries, at_least=1)
        check_choice("table_order", self.table_order, TABLE_ORDERS)
        if self.name == "recall" and self.max_length > len(RECALL_KEYS):
            raise ValueError(f"recall keys are the single digits, so max_length must be at most "
                             f"{len(RECALL_KEYS)}, got {self.max_length}")

    @property
    def alphabet(self) -> str:
        """Every character this task can put in a source or a target; the tokenizer's vocabulary."""
        if self.name == "addition":
            return string.digits + "+"
        letters = SEQUENCE_SYMBOLS[: self.num_symbols]
        if self.name == "recall":
            return letters + RECALL_SEPARATOR + QUERY_SEPARATOR + RECALL_KEYS
        return letters

    def sample(self, rng: random.Random) -> tuple[str, str]:
        """Draw one `(source, target)` pair using `rng` as the only source of randomness."""
        return _GENERATORS[self.name](self, rng)


def _random_letters(task: SyntheticTask, rng: random.Random) -> str:
    length = rng.randint(task.min_length, task.max_length)
    return "".join(rng.choices(SEQUENCE_SYMBOLS[: task.num_symbols], k=length))


def _copy(task: SyntheticTask, rng: random.Random) -> tuple[str, str]:
    source = _random_letters(task, rng)
    return source, source


def _reverse(task: SyntheticTask, rng: random.Random) -> tuple[str, str]:
    source = _random_letters(task, rng)
    return source, source[::-1]


def _sort(task: SyntheticTask, rng: random.Random) -> tuple[str, str]:
    source = _random_letters(task, rng)
    return source, "".join(sorted(source))


def _addition(task: SyntheticTask, rng: random.Random) -> tuple[str, str]:
    def operand() -> int:
        digits = rng.randint(task.min_length, task.max_length)
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    left, right = operand(), operand()
    return f"{left}+{right}", str(left + right)


def _recall(task: SyntheticTask, rng: random.Random) -> tuple[str, str]:
    sequence = _random_letters(task, rng)
    ordered = "".join(sorted(sequence)) if task.table_order == "sorted" else sequence
    positions = [rng.randrange(len(sequence)) for _ in range(task.num_queries)]
    source = sequence + RECALL_SEPARATOR + QUERY_SEPARATOR.join(RECALL_KEYS[p] for p in positions)
    table = "".join(RECALL_KEYS[p] + letter for p, letter in enumerate(ordered))
    answers = "".join(RECALL_KEYS[p] + ordered[p] for p in positions)
    return source, table + RECALL_SEPARATOR + answers


_GENERATORS: dict[str, Callable[[SyntheticTask, random.Random], tuple[str, str]]] = {
    "copy": _copy,
    "reverse": _reverse,
    "sort": _sort,
    "addition": _addition,
    "recall": _recall,
}
TASK_NAMES: tuple[str, ...] = tuple(_GENERATORS)

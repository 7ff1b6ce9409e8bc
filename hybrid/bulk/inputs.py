"""Reading a bulk job's input: one source per line, streamed, and cut into shards.

The input is plain lines, TSV (the first field) or JSONL (the ``"source"``), gzip or not, or
standard input, read by the parser training data uses (:mod:`hybrid.records`). Item ``i`` always
stands for input line ``i``: a line that holds no source is a :class:`Rejected`, never dropped, so
that output line ``i`` can answer input line ``i``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from hybrid.files import open_input
from hybrid.records import BadLine, read_records


@dataclass(frozen=True)
class Rejected:
    """An input line that cannot be decoded: its 1-based number in the input, and why."""

    line: int
    reason: str


def read_sources(path: str | os.PathLike | None, input_format: str = "auto") -> Iterator[str | Rejected]:
    """Every source of the input, one per line, streamed (:func:`hybrid.records.read_records`): the line
    (``text``), its first tab-separated field (``tsv``) or its ``"source"`` (``jsonl``); ``auto`` goes by
    the name, else the first line. A blank line is an empty source, and a line that holds no source
    (invalid UTF-8, a JSONL line without a string ``"source"``) is a :class:`Rejected`, so item ``i``
    always stands for input line ``i``."""
    for number, record in enumerate(read_records(path, input_format, target=False), start=1):
        if not isinstance(record, BadLine):
            yield record[0]
        elif record.reason == "blank_line":
            yield ""  # decoded as nothing: its output line is empty
        else:
            yield Rejected(number, record.detail)


def count_sources(path: str | os.PathLike | None) -> int | None:
    """The number of inputs of a file (None for standard input, which can be read only once)."""
    if path is None or str(path) == "-":
        return None
    with open_input(path, encoding=None) as stream:  # bytes: lines end at b"\n", as read_sources' do
        return sum(1 for _ in stream)


@dataclass
class Shard:
    """Inputs ``start`` to ``end`` (exclusive): the ``index``-th range of ``shard_size``."""

    index: int
    start: int
    texts: list[str | Rejected]

    @property
    def end(self) -> int:
        return self.start + len(self.texts)


class ShardReader:
    """The shards of ``sources`` for which ``wanted(index, start)`` holds, read in one pass; the others
    are read past. ``total`` is the number of sources once the input is exhausted."""

    def __init__(self, sources: Iterable[str | Rejected], shard_size: int,
                 wanted: Callable[[int, int], bool]) -> None:
        self.sources, self.shard_size, self.wanted = iter(sources), shard_size, wanted
        self.total: int | None = None

    def __iter__(self) -> Iterator[Shard]:
        for index in itertools.count():
            start = index * self.shard_size
            texts = list(itertools.islice(self.sources, self.shard_size))
            if texts and self.wanted(index, start):
                yield Shard(index, start, texts)
            if len(texts) < self.shard_size:
                self.total = start + len(texts)
                return

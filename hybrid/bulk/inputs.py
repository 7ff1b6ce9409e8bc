"""Reading a bulk job's input: one source per line, streamed, and cut into shards.

The input is plain lines, TSV (the first field) or JSONL (the ``"source"``), gzip or not, or
standard input (:func:`hybrid.files.open_input`, :func:`hybrid.files.detect_format`). Item ``i``
always stands for input line ``i``: a line that holds no source is a :class:`Rejected`, never
dropped, so that output line ``i`` can answer input line ``i``.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from hybrid.files import INPUT_FORMATS, detect_format, open_input

FORMATS = ("auto", *INPUT_FORMATS)


@dataclass(frozen=True)
class Rejected:
    """An input line that cannot be decoded: its 1-based number in the input, and why."""

    line: int
    reason: str


def read_sources(path: str | os.PathLike | None, input_format: str = "auto") -> Iterator[str | Rejected]:
    """Every source of the input, one per line, streamed: the line (``text``), its first tab-separated
    field (``tsv``) or its ``"source"`` (``jsonl``). ``auto`` applies :func:`hybrid.files.detect_format`
    (the name, else the first line). A blank line is an empty source, and a line that holds no source
    (invalid UTF-8, a JSONL line without a string ``"source"``) is a :class:`Rejected`, so item ``i``
    always stands for input line ``i``."""
    if input_format not in FORMATS:
        raise ValueError(f"input_format must be one of {FORMATS}, got {input_format!r}")
    # surrogateescape: a line of invalid UTF-8 is read (its bad bytes as lone surrogates) and rejected
    # on its own, instead of a UnicodeDecodeError ending the whole input.
    with open_input(path, errors="surrogateescape") as stream:
        lines = (line.rstrip("\r\n") for line in stream)
        first = next(lines, None)
        if first is None:
            return
        kind = detect_format(path, first) if input_format == "auto" else input_format
        for number, line in enumerate(itertools.chain([first], lines), start=1):
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:
                yield Rejected(number, "the line is not valid UTF-8")
                continue
            if kind == "text":
                yield line
            elif not line.strip():
                yield ""
            elif kind == "tsv":
                yield line.split("\t", 1)[0]
            else:
                yield _jsonl_source(line, number)


def _jsonl_source(line: str, number: int) -> str | Rejected:
    """The ``"source"`` string of one JSONL line, or why there is none (null, a list, a number: not text)."""
    expected = 'expected a JSON object with a string "source"'
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        return Rejected(number, f"{expected}; the line is not JSON ({error})")
    if not isinstance(record, dict) or "source" not in record:
        return Rejected(number, f"{expected}; got {type(record).__name__}" +
                        (" without one" if isinstance(record, dict) else ""))
    if not isinstance(record["source"], str):
        return Rejected(number, f"{expected}; its \"source\" is {json.dumps(record['source'])[:40]}")
    return record["source"]


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

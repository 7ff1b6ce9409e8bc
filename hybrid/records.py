"""Reading records, one per line, from text, TSV and JSONL files: one parser for training data and bulk jobs.

A record is a source and, in a file of pairs, its target. The rule for one line is :func:`parse_line`,
and :func:`read_records` streams a file's lines through it, item ``i`` for line ``i``, each a record
or a :class:`BadLine` saying why it holds none. Training reads pairs (:func:`read_parallel_file`:
bad lines skipped and counted in a :class:`ParseReport`); a bulk job reads sources
(:mod:`hybrid.bulk.inputs`: a bad line keeps its place, so output line ``i`` answers input line ``i``).
Plain Python (no Lightning, no torch), so inference reads the same files as training.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from hybrid.files import INPUT_FORMATS, Format, detect_format, open_input
from hybrid.validators import check_choice

logger = logging.getLogger(__name__)

Pair = tuple[str, str]

_LINES_PER_REASON = 5  # line numbers a report keeps: enough to find the problem, short enough to log


@dataclasses.dataclass
class ParseReport:
    """What happened to the lines of one input file: how many were kept, which were skipped and why.

    `skipped` counts lines per reason (blank_line, bad_utf8, wrong_field_count, bad_json,
    missing_key, not_a_string, empty_text; and source_too_long/target_too_long from the length
    filter), and `first_lines` keeps the first few line numbers (1-based) of each reason.
    """

    path: str
    kept: int = 0
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)
    first_lines: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    truncated: int = 0  # kept, but cut to the length limits (too_long="truncate")

    def skip(self, reason: str, line_number: int | None = None) -> None:
        """Count one skipped line; `line_number` is None where it is no longer known (length filter)."""
        self.skipped[reason] += 1
        examples = self.first_lines.setdefault(reason, [])
        if line_number is not None and len(examples) < _LINES_PER_REASON:
            examples.append(line_number)

    def log(self) -> None:
        """A warning naming each reason, its count and its first line numbers; info if nothing was skipped."""
        if not self.skipped and not self.truncated:
            logger.info("%s: read %d pairs", self.path, self.kept)
            return
        logger.warning("%s: read %d pairs, %s", self.path, self.kept, self.describe())

    def describe(self) -> str:
        """What was skipped or truncated: each reason with its count and its first line numbers."""
        parts = []
        if self.skipped:
            reasons = "; ".join(self._describe(reason) for reason in sorted(self.skipped))
            parts.append(f"skipped {self.skipped.total()} lines: {reasons}")
        if self.truncated:
            parts.append(f"truncated {self.truncated} to the length limits")
        return ", ".join(parts) or "nothing skipped"

    def _describe(self, reason: str) -> str:
        count, lines = self.skipped[reason], self.first_lines[reason]
        if not lines:
            return f"{reason}: {count}"
        more = ", ..." if count > len(lines) else ""
        return f"{reason}: {count} (lines {', '.join(map(str, lines))}{more})"


@dataclasses.dataclass(frozen=True)
class BadLine:
    """Why one line holds no record: ``reason``, the short name a :class:`ParseReport` counts it under
    (blank_line, bad_utf8, wrong_field_count, bad_json, missing_key, not_a_string), and ``detail``, what a
    person reads."""

    reason: str
    detail: str


def parse_line(line: str, format: Format, target: bool = True) -> tuple[str, ...] | BadLine:
    """The record on one line (its ending stripped) of a ``format`` file: ``(source, target)``, or ``(source,)``
    with ``target=False``; else why the line holds none.

    A plain-text line is a source (``target=False`` only). A TSV line's first field is the source and its
    second the target: a line of pairs holds exactly those two, while a source is read from the first
    field of any line. A JSONL line is an object whose ``"source"`` (and ``"target"``) are strings; other
    keys are ignored. A TSV or JSONL line of nothing but whitespace holds no record (``blank_line``)."""
    if format == "text":
        return (line,)
    if not line.strip():
        return BadLine("blank_line", "the line is blank")
    keys = ("source", "target") if target else ("source",)
    if format == "tsv":
        fields = line.split("\t")
        if target and len(fields) != 2:
            return BadLine("wrong_field_count", f"expected source<TAB>target (one tab), got {len(fields) - 1} tabs")
        return tuple(fields[:len(keys)])
    expected = "expected a JSON object with " + " and ".join(f'a string "{key}"' for key in keys)
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        return BadLine("bad_json", f"{expected}; the line is not JSON ({error})")
    if not isinstance(record, dict) or any(key not in record for key in keys):
        return BadLine("missing_key", f"{expected}; got {type(record).__name__}" +
                       (" without one" if isinstance(record, dict) else ""))
    for key in keys:
        if not isinstance(record[key], str):  # null, a list, a number: not text
            return BadLine("not_a_string", f'{expected}; its "{key}" is {json.dumps(record[key])[:40]}')
    return tuple(record[key] for key in keys)


def read_records(path: str | os.PathLike | None, format: str = "auto",
                 target: bool = True) -> Iterator[tuple[str, ...] | BadLine]:
    """Every line of ``path`` (gzip or not, told by its first bytes; standard input for None or ``"-"``) as
    its record by :func:`parse_line`, or why it holds none, streamed: item ``i`` stands for line ``i``.

    Lines end at ``"\n"`` only, and are read as bytes, so a line of invalid UTF-8 is a ``bad_utf8``
    :class:`BadLine` instead of an error ending the whole file. ``format="auto"`` applies
    :func:`record_format` to the first line; a file of pairs (``target=True``) cannot be plain text.
    """
    allowed, key = _formats(target)
    check_choice(key, format, ("auto", *allowed))
    with open_input(path, encoding=None) as stream:
        first = stream.readline()
        format = record_format(path, first, target) if format == "auto" else format
        for raw in itertools.chain([first] if first else [], stream):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield BadLine("bad_utf8", "the line is not valid UTF-8")
                continue
            yield parse_line(line, format, target)


def record_format(path: str | os.PathLike | None, first_line: bytes, target: bool = True) -> Format:
    """The format of a file of records by :func:`hybrid.files.detect_format`: its name, else ``first_line``
    (``b""`` for an empty file). A file of pairs must be TSV or JSONL (``data.format``); a bulk job's input
    may also be plain text (``input_format``)."""
    allowed, key = _formats(target)
    return detect_format(path, first_line.decode("utf-8", errors="replace"), allowed=allowed, format_key=key)


def _formats(target: bool) -> tuple[tuple[Format, ...], str]:
    """The formats a file may have, and the key that names one: a file of pairs is training data."""
    return (("tsv", "jsonl"), "data.format") if target else (INPUT_FORMATS, "input_format")


def read_parallel_file(path: str | Path, format: str = "auto") -> tuple[list[Pair], ParseReport]:
    """Read `(source, target)` pairs from a TSV (`source<TAB>target`) or JSONL
    (`{"source": ..., "target": ...}`) file, gzip-compressed or not (told by its first bytes).
    `format="auto"` goes by the file's name, else its first line (:func:`hybrid.files.detect_format`);
    one that reads as plain text is refused with a `ValueError`.

    Bad lines are never fatal and never silently lost: each is skipped, counted by reason in the
    returned `ParseReport`, and the report is logged. Text is kept exactly as written apart from
    the line ending, since spaces can matter at the character level.
    """
    if format == "auto":
        with open_input(path, encoding=None) as stream:
            format = record_format(path, stream.readline())  # named in the error below
    report = ParseReport(str(path))
    pairs: list[Pair] = []
    for line_number, record in enumerate(read_records(path, format), start=1):
        if isinstance(record, BadLine):
            report.skip(record.reason, line_number)
        elif not record[0].strip() or not record[1].strip():  # a pair with an empty side teaches nothing
            report.skip("empty_text", line_number)
        else:
            pairs.append(record)
    report.kept = len(pairs)
    if not pairs:
        lines = report.skipped.total()
        found = f": {report.describe()}" if lines else " (the file is empty)"
        expected = "source<TAB>target" if format == "tsv" else '{"source": "...", "target": "..."}'
        raise ValueError(f"{path}: no usable (source, target) pair in {lines} lines{found}; "
                         f"expected one {expected} per line")
    report.log()
    return pairs, report


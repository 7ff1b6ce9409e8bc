"""Reading source/target records from TSV and JSONL files: one parser for training data and bulk jobs.

A record is a `(source, target)` pair of strings. `read_parallel_file` reads a whole file of them,
skipping and counting the bad lines in a `ParseReport`; `parse_line` is the rule for one line. Plain
Python (no Lightning, no torch), so inference can read the same files as training.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from hybrid.files import detect_format, open_input

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


def parallel_format(path: str | Path) -> Literal["tsv", "jsonl"]:
    """The format of a parallel-text file by :func:`hybrid.files.detect_format`: its name, else its first line."""
    with open_input(path, encoding=None) as stream:
        first_line = stream.readline().decode("utf-8", errors="replace")
    return detect_format(path, first_line, allowed=("tsv", "jsonl"), format_key="data.format")


def parse_line(line: str, format: str) -> Pair | str:
    """The `(source, target)` pair on one decoded, non-blank `format` ("tsv" or "jsonl") line, or the reason
    it is unusable (a `ParseReport` reason: wrong_field_count, bad_json, missing_key, not_a_string, empty_text)."""
    if format == "tsv":
        fields = line.split("\t")
        if len(fields) != 2:
            return "wrong_field_count"
        source, target = fields
    else:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return "bad_json"
        if not isinstance(record, dict) or "source" not in record or "target" not in record:
            return "missing_key"
        source, target = record["source"], record["target"]
        if not isinstance(source, str) or not isinstance(target, str):
            return "not_a_string"
    if not source.strip() or not target.strip():
        return "empty_text"
    return source, target


def read_parallel_file(path: str | Path, format: str = "auto") -> tuple[list[Pair], ParseReport]:
    """Read `(source, target)` pairs from a TSV (`source<TAB>target`) or JSONL
    (`{"source": ..., "target": ...}`) file, gzip-compressed or not (told by its first bytes).
    `format="auto"` goes by the file's name, else its first line (:func:`hybrid.files.detect_format`);
    one that reads as plain text is refused with a `ValueError`.

    Bad lines are never fatal and never silently lost: each is skipped, counted by reason in the
    returned `ParseReport`, and the report is logged. Text is kept exactly as written apart from
    the line ending, since spaces can matter at the character level.
    """
    format = parallel_format(path) if format == "auto" else format
    if format not in ("tsv", "jsonl"):
        raise ValueError(f"format must be 'auto', 'tsv' or 'jsonl', got {format!r}")
    report = ParseReport(str(path))
    pairs: list[Pair] = []
    for line_number, raw in enumerate(read_lines(path), start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            report.skip("bad_utf8", line_number)
            continue
        if not line.strip():
            report.skip("blank_line", line_number)
            continue
        parsed = parse_line(line, format)
        if isinstance(parsed, str):
            report.skip(parsed, line_number)
        else:
            pairs.append(parsed)
    report.kept = len(pairs)
    if not pairs:
        lines = report.skipped.total()
        found = f": {report.describe()}" if lines else " (the file is empty)"
        expected = "source<TAB>target" if format == "tsv" else '{"source": "...", "target": "..."}'
        raise ValueError(f"{path}: no usable (source, target) pair in {lines} lines{found}; "
                         f"expected one {expected} per line")
    report.log()
    return pairs, report


def read_lines(path: str | Path) -> Iterator[bytes]:
    """The lines of `path` (gzip or not) as bytes, line endings kept: bytes, so that one badly encoded line
    is skipped by the caller instead of aborting the whole file."""
    with open_input(path, encoding=None) as file:
        yield from file

"""The report's Markdown: the runs' or configurations' table, and converted models beside their references.

A configuration's measurements read ``mean ± std`` over its seeds (:mod:`hybrid.report.seeds`), the mean alone
for one seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybrid.report.seeds import SIGNIFICANCE, group_seeds, significant, std_column

# The columns of the table, in order; the test metrics follow them. A run's row has its ``seed``; a
# configuration's row (see group_seeds) has ``seeds``, how many runs it pools, instead.
COLUMNS = ("task", "run", "decoder", "layers", "mixer_options", "init", "steps", "total_steps", "seed", "seeds",
           "parameters", "mixer_parameters", "state_bytes", "train_time_s", "train_tokens_per_s", "ms_per_token")
# A row's quality in one number: the task's error rate (lower is better), the first one a row has.
ERROR_METRICS = ("test/per", "test/cer", "test/wer")


def error_of(row: dict[str, Any]) -> tuple[str, float] | None:
    """The row's error rate (a configuration's: the mean) as (metric, value): the first of
    :data:`ERROR_METRICS` it has, or None."""
    for name in ERROR_METRICS:
        if row.get(name) not in (None, ""):
            return name, float(row[name])
    return None


def metric_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The ``test/...`` columns any row has (their standard deviations aside), error rates first."""
    names = {key for row in rows for key in row if key.startswith("test/")}
    names -= {std_column(name) for name in names}
    return [name for name in ERROR_METRICS if name in names] + sorted(names - set(ERROR_METRICS))


def columns_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The table's columns that any row fills: :data:`COLUMNS` in order, then the test metrics."""
    present = {key for row in rows for key in row}
    return [name for name in COLUMNS if name in present] + metric_columns(rows)


def _number(name: str, value: Any) -> str:
    if value is None or value == "":
        return "-"
    if name in ("parameters", "mixer_parameters", "train_tokens_per_s", "state_bytes"):
        return f"{float(value):,.0f}"
    if name == "train_time_s":
        return f"{float(value):.1f}"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def cell(name: str, row: dict[str, Any]) -> str:
    """The row's ``name`` as text: the value, and ``± std`` where the row pools several seeds."""
    text, spread = _number(name, row.get(name)), row.get(std_column(name))
    return text if spread is None else f"{text} ± {_number(name, spread)}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table, one line per row: a run, or a configuration of
    :func:`~hybrid.report.seeds.group_seeds`, whose measurements read ``mean ± std`` (the mean alone for one
    seed)."""
    columns = columns_of(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(name, row) for name in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def conversions(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: each converted-then-fine-tuned configuration beside the same decoder trained from scratch
    for the same total steps, and beside the model it was converted from (found by decoder and steps), the
    runs' seeds pooled; the last two columns give the converted error rate's difference from each and whether
    it stands out of the spread between seeds. Empty when no configuration was converted."""

    def quality(row: dict[str, Any] | None) -> str:
        if row is None:
            return "-"
        error = error_of(row)
        parts = [f"{error[0]} {cell(error[0], row)}"] if error else []
        if row.get("test/exact_match") is not None:
            parts.append(f"exact match {cell('test/exact_match', row)}")
        return ", ".join(parts) or "-"

    def difference(row: dict[str, Any], other: dict[str, Any] | None) -> str:
        error = error_of(row)
        if other is None or error is None or other.get(error[0]) in (None, ""):
            return "-"
        return f"{error[1] - float(other[error[0]]):+.3f}, {SIGNIFICANCE[significant(row, other, error[0])]}"

    groups = group_seeds(rows)
    lines = []
    for row in groups:
        if not str(row.get("init", "")).startswith("converted from "):
            continue
        same = [other for other in groups if other["task"] == row["task"] and other["init"] == "scratch"]
        scratch = next((o for o in same if o["decoder"] == row["decoder"] and o["steps"] == row["total_steps"]), None)
        source = next((o for o in same if o["decoder"] == row["init"].removeprefix("converted from ")
                       and o["steps"] == row["total_steps"] - row["steps"]), None)
        lines.append(f"| {row['task']} | {row['decoder']} | {row['steps']} of {row['total_steps']} | {quality(row)} | "
                     f"{quality(scratch)} | {quality(source)} | {difference(row, scratch)} | "
                     f"{difference(row, source)} |")
    if not lines:
        return ""
    return ("\nConversion: fine-tuned after `hybrid convert` (steps: fine-tune of total) against the same decoder "
            "from scratch at equal total steps, and the model it was converted from; the error rate's difference "
            "(converted minus the other) and whether it exceeds the spread between seeds:\n\n"
            "| task | decoder | steps | converted + fine-tuned | scratch, equal total | converted from "
            "| vs scratch | vs converted from |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")

"""Write a report's files and read its CSVs back.

The files: ``ablations.csv`` (one row per run), ``ablations_grouped.csv`` (one per configuration),
``ablations.md`` (the tables) and ``pareto.png`` (the plot).
"""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybrid.files import write_atomically
from hybrid.report.plot import pareto_figure
from hybrid.report.seeds import group_seeds, std_column
from hybrid.report.tables import columns_of, conversions, markdown_table

NAMES = ("ablations.csv", "ablations_grouped.csv", "ablations.md", "pareto.png")


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as CSV: the table's columns, each measurement followed by its standard deviation where the
    rows have one, then every other field."""
    present = {key for row in rows for key in row}
    fields = [field for name in columns_of(rows) for field in (name, std_column(name)) if field in present]
    fields += sorted(present - set(fields))
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return table.getvalue()


def write_results(rows: Sequence[dict[str, Any]], directory: str | Path, note: str = "") -> list[Path]:
    """Write the runs' ``rows`` (as :func:`hybrid.report.runs.collect` gives them) into ``directory``.

    ``ablations.csv`` holds one row per run, every field, each seed its own row; ``ablations_grouped.csv``
    one row per configuration (:func:`~hybrid.report.seeds.group_seeds`: the means, their ``<name>_std`` and
    ``seeds``); ``ablations.md`` the ``note``, the configurations' table and the conversion table, then,
    where some configuration has several seeds, the runs' table; and ``pareto.png`` the configurations.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    grouped = group_seeds(rows)
    write_atomically(directory / "ablations.csv", csv_text(rows))
    write_atomically(directory / "ablations_grouped.csv", csv_text(grouped))
    pooled = ("One row per configuration: each measurement is the mean ± sample standard deviation over its "
              "`seeds` runs (the mean alone for one seed).\n\n")
    every_run = ("\nEvery run, one row per seed:\n\n" + markdown_table(rows)
                 if any(group["seeds"] > 1 for group in grouped) else "")
    write_atomically(directory / "ablations.md", (note + "\n\n" if note else "") + pooled + markdown_table(grouped)
                     + conversions(grouped) + every_run)
    figure = pareto_figure(grouped)
    write_atomically(directory / "pareto.png", functools.partial(figure.savefig, dpi=120))
    return [directory / name for name in NAMES]


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The rows of an ``ablations.csv`` (one per run) or an ``ablations_grouped.csv`` (one per configuration),
    numbers as numbers and empty cells as None."""

    def value(text: str) -> Any:
        if text == "":
            return None
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    with open(path, newline="") as handle:
        return [{key: value(text) for key, text in row.items()} for row in csv.DictReader(handle)]

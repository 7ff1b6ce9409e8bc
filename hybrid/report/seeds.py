"""Pool the runs of one configuration that differ only in their seed, and say when two configurations differ.

A configuration's row holds, for each measurement, the mean over its seeds and the sample standard deviation
(:func:`std_column`); :func:`significant` says whether a difference between two configurations stands out of
that spread, so that seed noise is not read as an effect.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

# What a run measures besides its test metrics: these vary between the seeds of one configuration, every
# other column describes the configuration.
MEASURED = ("train_time_s", "train_tokens_per_s", "ms_per_token")
# What significant() says of a difference between two configurations; None: a side has no spread (one seed).
SIGNIFICANCE = {True: "significant", False: "not significant", None: "n=1, significance unknown"}


def is_measured(name: str) -> bool:
    """Whether column ``name`` is a measurement (a test metric or one of :data:`MEASURED`), which varies
    between the seeds of one configuration, rather than a description of the configuration."""
    return name in MEASURED or name.startswith("test/")


def std_column(name: str) -> str:
    """The column of a configuration's row that holds the sample standard deviation of measurement ``name``."""
    return f"{name}_std"


def group_seeds(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration, pooling the runs that differ only in their seed, in the order first seen.

    A configuration is everything a run's row holds but its ``seed`` and its measurements (see
    :func:`is_measured`): task, run name, decoder, layers, mixer options, init, steps and the rest. Its row
    keeps those columns and holds, for each measurement, the mean over the seeds that have it and, under
    :func:`std_column`, the sample standard deviation (n - 1; None for a single value, which has no spread),
    and ``seeds``, the number of runs pooled. Rows already grouped (all with ``seeds``, as
    ``ablations_grouped.csv`` reads back) come back as they are.
    """
    if rows and all("seeds" in row for row in rows):
        return [dict(row) for row in rows]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        # Empty and absent cells alike: a CSV read back has every column, a collected row only its own.
        configuration = tuple(sorted((name, value) for name, value in row.items()
                                     if name != "seed" and not is_measured(name) and value not in (None, "")))
        groups.setdefault(configuration, []).append(row)
    grouped = []
    for runs in groups.values():
        group = {name: value for name, value in runs[0].items() if name != "seed" and not is_measured(name)}
        group["seeds"] = len(runs)
        for name in dict.fromkeys(name for run in runs for name in run if is_measured(name)):
            values = [float(run[name]) for run in runs if run.get(name) not in (None, "")]
            if values:
                group[name] = statistics.fmean(values)
                group[std_column(name)] = statistics.stdev(values) if len(values) > 1 else None
        grouped.append(group)
    return grouped


def significant(a: dict[str, Any], b: dict[str, Any], metric: str) -> bool | None:
    """Whether configurations ``a`` and ``b`` (rows of :func:`group_seeds`) differ in ``metric`` by more
    than the spread between their seeds.

    The rule: the difference of the means counts only when it exceeds the two sample standard deviations
    added, ``|mean_a - mean_b| > std_a + std_b``, i.e. when the mean ± 1 std intervals do not overlap; a
    difference inside that spread is not significant. It screens out seed noise read as an effect; it is
    not a statistical test (with a few seeds the standard deviation is itself rough). None where either
    side has fewer than two seeds measuring ``metric``: there is no spread to compare with.
    """
    spread_a, spread_b = a.get(std_column(metric)), b.get(std_column(metric))
    if spread_a is None or spread_b is None:
        return None
    return abs(float(a[metric]) - float(b[metric])) > spread_a + spread_b

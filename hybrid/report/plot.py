"""The report's Pareto plot: each configuration's error rate against its decoding ms/token, one panel per task."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hybrid.report.seeds import group_seeds, std_column
from hybrid.report.tables import error_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (lower is better in both)."""
    return [i for i, (x, y) in enumerate(points)
            if not any(a <= x and b <= y and (a, b) != (x, y) for a, b in points)]


def pareto_figure(rows: Sequence[dict[str, Any]]) -> Figure:
    """One panel per task: error rate against decoding ms/token, one point per configuration (the runs'
    seeds pooled by :func:`~hybrid.report.seeds.group_seeds`: the means, with ± std bars), each labelled by
    its run name (less the grid's ``ablate_<task>_`` prefix), the Pareto front joined."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers or in CI
    import matplotlib.pyplot as plt

    groups = group_seeds(rows)
    tasks = sorted({row["task"] for row in groups})
    figure, axes = plt.subplots(1, len(tasks), figsize=(6.4 * len(tasks), 4.8), squeeze=False)
    for axis, task in zip(axes[0], tasks, strict=True):
        scored = [(row, error_of(row)) for row in groups if row["task"] == task]
        scored = [(row, error) for row, error in scored if error and row.get("ms_per_token") not in (None, "")]
        points = [(float(row["ms_per_token"]), error[1]) for row, error in scored]
        if points:
            axis.errorbar([x for x, _ in points], [y for _, y in points],
                          xerr=[row.get(std_column("ms_per_token")) or 0.0 for row, _ in scored],
                          yerr=[row.get(std_column(error[0])) or 0.0 for row, error in scored],
                          fmt="o", color="tab:blue", elinewidth=1, capsize=2)
        for (row, _), (x, y) in zip(scored, points, strict=True):
            label = str(row["run"]).removeprefix(f"ablate_{task}_")
            label += f" (n={row['seeds']})" if row["seeds"] > 1 else ""
            axis.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        front = sorted(points[i] for i in pareto_front(points))
        if front:
            axis.plot([x for x, _ in front], [y for _, y in front], color="tab:red", alpha=0.6, label="Pareto front")
            axis.legend(fontsize=8)
        metrics = sorted({error[0] for _, error in scored})
        shape = {(row.get("decode_batch"), row.get("decode_new_tokens")) for row, _ in scored}
        batch, tokens = next(iter(shape)) if len(shape) == 1 else ("?", "?")
        axis.set_xlabel(f"greedy decoding, ms per token (batch {batch}, {tokens} new tokens)")
        axis.set_ylabel(f"{', '.join(metrics)} (lower is better)")
        several = any(row["seeds"] > 1 for row, _ in scored)
        axis.set_title(f"{task} (mean ± std over seeds)" if several else task)
        axis.grid(True, alpha=0.3)
    figure.tight_layout()
    return figure

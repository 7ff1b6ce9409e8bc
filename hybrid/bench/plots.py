"""The benchmark's three plots, shared by ``hybrid bench`` and ``notebooks/benchmark.ipynb``."""

from __future__ import annotations

import functools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers or in CI
import matplotlib.pyplot as plt  # noqa: E402

from hybrid.files import write_atomically  # noqa: E402


def _series(rows: list[dict], x: str, y: str, where: dict) -> dict[str, tuple[list, list]]:
    """Each model's (x, y) points among the rows that match ``where``, x ascending; a model with one point
    draws no line and is left out."""
    lines: dict[str, tuple[list, list]] = {}
    for row in sorted(rows, key=lambda r: r[x]):
        if all(row[k] == v for k, v in where.items()):
            xs, ys = lines.setdefault(row["model"], ([], []))
            xs.append(row[x])
            ys.append(row[y])
    return {name: line for name, line in lines.items() if len(line[0]) > 1}


def _most_common(rows: list[dict], key: str, fallback: int) -> int:
    values = [row[key] for row in rows]
    return max(set(values), key=values.count) if values else fallback


def figures(results: dict) -> dict[str, plt.Figure]:
    """ms/token vs new tokens (log axes), throughput vs batch, memory vs new tokens; one line per model
    through its grid cells. The memory-budget sweep's rows are not on these axes: at batch 1 such a row
    would stand beside the grid's cell of its length as a second point at the same x."""
    rows, meta = [row for row in results["rows"] if row["sweep"] == "grid"], results["meta"]
    memory_key = "peak_memory_bytes" if any("peak_memory_bytes" in r for r in rows) else "state_bytes"
    batch = min(row["batch"] for row in rows)
    tokens = _most_common(rows, "new_tokens", 256)
    specs = {
        "ms_per_token": ("new_tokens", "ms_per_token", {"batch": batch}, "new tokens",
                         f"ms per generated token (batch {batch})", True),
        "throughput": ("batch", "tokens_per_s", {"new_tokens": tokens}, "batch size",
                       f"tokens/s ({tokens} new tokens)", True),
        "memory": ("new_tokens", memory_key, {"batch": batch}, "new tokens",
                   f"{memory_key.replace('_', ' ')} (batch {batch})", True),
    }
    out = {}
    for name, (x, y, where, xlabel, ylabel, log) in specs.items():
        figure, axis = plt.subplots(figsize=(6.4, 4.4))
        lines = _series(rows, x, y, where)
        for model, (xs, ys) in lines.items():
            axis.plot(xs, ys, marker="o", label=model)
        if log:
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
        axis.set_title(f"{meta['device_name']} · {meta['dtype']} · {meta['threads']} threads", fontsize=9)
        axis.grid(True, which="both", alpha=0.3)
        if lines:  # a grid without two cells along this axis draws no line, and an empty legend only warns
            axis.legend(fontsize=8)
        figure.tight_layout()
        out[name] = figure
    return out


def plot_all(results: dict, directory: Path) -> list[Path]:
    """Write every figure as a PNG into ``directory``."""
    paths = []
    for name, figure in figures(results).items():
        path = write_atomically(Path(directory) / f"{name}.png", functools.partial(figure.savefig, dpi=120))
        plt.close(figure)
        paths.append(path)
    return paths

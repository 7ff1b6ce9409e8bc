"""``hybrid ablate``: gather ``hybrid fit`` runs into a table and a Pareto plot (:mod:`hybrid.report`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig

from hybrid.bench.metadata import run_metadata
from hybrid.report.files import read_results, write_results
from hybrid.report.runs import collect, run_key, sort_rows
from hybrid.report.seeds import group_seeds
from hybrid.report.tables import markdown_table


def ablate(runs: Sequence[str | Path], output_dir: str | Path, *, batch_size: int, new_tokens: int,
           source_length: int, repeats: int, threads: int, include: Sequence[str | Path] = ()) -> list[Path]:
    """Collect the runs under ``runs`` (see :func:`hybrid.report.runs.collect`, whose decoding-speed settings
    the keywords are, timed on ``threads`` torch threads), add the rows of the ``ablations.csv`` files in
    ``include`` (runs collected earlier, whose folders are gone; their task is the one their CSV recorded,
    and a run collected now replaces an included row of the same name and seed), write the tables and the
    plot into ``output_dir`` (see :func:`hybrid.report.files.write_results`), print the configurations' table
    and return the files written."""
    torch.set_num_threads(threads)
    rows = collect(runs, batch=batch_size, new_tokens=new_tokens, source_length=source_length, repeats=repeats)
    collected = {run_key(row["run"], row["seed"]) for row in rows}
    included = [row for path in include for row in read_results(path)
                if run_key(row["run"], row["seed"]) not in collected]
    machine = run_metadata(torch.device("cpu"))
    note = (f"Decoding: greedy, batch {batch_size}, {new_tokens} new tokens, source length {source_length}, "
            f"median of {repeats} repeats, CPU ({machine['device_name']}), {machine['threads']} threads, "
            f"torch {machine['torch']}, {machine['date'][:10]}.")
    if included:
        note += (f" {len(included)} of the runs were collected earlier and read from "
                 f"{', '.join(map(str, include))}, their speed as timed then.")
    rows = sort_rows(rows + included)
    paths = write_results(rows, output_dir, note)
    print(markdown_table(group_seeds(rows)))
    print("wrote " + ", ".join(map(str, paths)))
    return paths


def run_ablate(cfg: DictConfig) -> list[Path]:
    """Collect the runs under ``cfg.runs`` (a folder or a list of them), add the rows of ``cfg.include``
    (earlier ``ablations.csv`` files, one or a list), and write ``ablations.md``,
    ``ablations.csv`` (one row per run), ``ablations_grouped.csv`` (one row per configuration, its seeds
    pooled) and ``pareto.png`` into ``cfg.output_dir`` (the composed ``ablate.yaml``)."""
    runs = [cfg.runs] if isinstance(cfg.runs, str) else list(cfg.runs)
    include = [cfg.include] if isinstance(cfg.include, str) else list(cfg.include or [])
    return ablate(runs, cfg.output_dir, batch_size=cfg.batch_size, new_tokens=cfg.new_tokens,
                  source_length=cfg.source_length, repeats=cfg.repeats, threads=cfg.threads, include=include)

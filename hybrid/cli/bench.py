"""``hybrid bench`` and ``hybrid bench-bulk``: run a benchmark the composed config describes, write its results
into ``output_dir`` and print them (:mod:`hybrid.bench.runner`, :mod:`hybrid.bench.bulk`)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from hybrid.bench import bulk, runner
from hybrid.files import write_atomically


def run_bench(cfg: DictConfig) -> Path:
    """Time decoding of every contender over the grid of ``cfg`` (``bench.yaml`` plus overrides).

    Writes ``results.json``, ``results.csv``, ``summary.md``, the plots and the composed
    ``config.yaml`` into ``cfg.output_dir``, prints the table and the headline ratios, and returns the folder.
    """
    settings = OmegaConf.to_container(cfg, resolve=True)
    results = runner.run_benchmark(settings)
    directory = Path(settings["output_dir"])
    paths = runner.write_results(results, directory)
    paths.append(write_atomically(directory / "config.yaml", OmegaConf.to_yaml(cfg)))
    runner.print_table(results)
    print("wrote " + ", ".join(map(str, paths)))
    return directory


def run_bench_bulk(cfg: DictConfig) -> Path:
    """Time a bulk job decoded five ways, LSTM and attention decoders (``bench_bulk.yaml`` plus overrides);
    writes ``results.json`` and ``results.md`` into ``cfg.output_dir``, prints the tables, returns the folder."""
    settings = OmegaConf.to_container(cfg, resolve=True)
    results = bulk.run_bulk_benchmark(settings)
    bulk.write_results(results, settings["output_dir"])
    print(bulk.markdown_table(results))
    return Path(settings["output_dir"])

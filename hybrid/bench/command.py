"""The ``hybrid bench`` command: run the grid of the composed ``bench`` config, write and print the results."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from hybrid.files import write_atomically


def run_bench(cfg: DictConfig) -> Path:
    """Run the benchmark that ``cfg`` (``configs/bench.yaml`` plus overrides) describes.

    Writes ``results.json``, ``results.csv``, the plots and the composed ``config.yaml``
    into ``cfg.output_dir``, prints the table and the headline ratios, and returns the folder.
    """
    from hybrid.bench.runner import print_table, run_benchmark, write_results

    settings = OmegaConf.to_container(cfg, resolve=True)
    results = run_benchmark(settings)
    directory = Path(settings["output_dir"])
    paths = write_results(results, directory)
    write_atomically(directory / "config.yaml", OmegaConf.to_yaml(cfg))
    print_table(results)
    print("wrote " + ", ".join(str(p) for p in paths))
    return directory

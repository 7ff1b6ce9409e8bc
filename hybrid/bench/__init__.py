"""The decoding benchmarks: ``hybrid bench`` (contenders, runner, profiling, plots), ``hybrid bench-bulk``
(bulk) and ``hybrid demo`` (demo); this package re-exports the runner's entry points."""

from hybrid.bench.runner import headline, print_table, run_benchmark, write_results

__all__ = ["run_benchmark", "write_results", "print_table", "headline"]

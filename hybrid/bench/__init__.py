"""The decoding benchmarks: ``hybrid bench`` (contenders.py, runner.py, profiling.py, plots.py),
``hybrid bench-bulk`` (bulk.py) and ``hybrid demo`` (demo.py), which time calls and record the machine with
one set of helpers (timing.py, metadata.py); the runner's entry points are re-exported."""

from hybrid.bench.runner import headline, print_table, run_benchmark, write_results

__all__ = ["run_benchmark", "write_results", "print_table", "headline"]

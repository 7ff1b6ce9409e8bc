"""The decoding benchmark: contenders, runner, plots."""

from hybrid.bench.runner import headline, print_table, run_benchmark, write_results

__all__ = ["run_benchmark", "write_results", "print_table", "headline"]

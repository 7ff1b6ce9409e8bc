"""`hybrid bench` smoke test on a tiny grid, and the benchmark notebook executed on its results."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import execute_notebook

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = ["ms_per_token", "ms_per_token_min", "ms_per_token_max", "tokens_per_s", "prefill_ms"]


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("bench")
    subprocess.run([sys.executable, "-m", "hybrid.cli", "bench", "bench=tiny", f"output_dir={directory}",
                    "huggingface_bart=false", "memory_budget_gb=0.001"], check=True, cwd=directory)
    return directory


def test_results_file_schema_and_values(tiny_results):
    results = json.loads((tiny_results / "results.json").read_text())
    for key in ("device", "device_name", "dtype", "torch", "threads", "git_commit", "date", "source_length",
                "seed", "model"):
        assert key in results["meta"], key
    models = {row["model"] for row in results["rows"]}
    assert {"attention+kv-cache", "attention-no-cache", "lstm", "lstm-param-matched"} <= models
    assert {row["sweep"] for row in results["rows"]} == {"grid", "memory_budget"}
    for row in results["rows"]:
        for key in NUMBERS:
            assert math.isfinite(row[key]) and row[key] > 0, (row["model"], key, row[key])
        assert row["ms_per_token_min"] <= row["ms_per_token"] <= row["ms_per_token_max"]
        assert row["state_bytes"] > 0 and row["parameters"] > 0 and row["peak_rss_bytes"] > 0
    assert {check["target"] for check in results["headline"]}
    for name in ("results.csv", "ms_per_token.png", "throughput.png", "memory.png", "config.yaml"):
        assert (tiny_results / name).stat().st_size > 0, name


def test_parameter_matched_lstm_matches_attention(tiny_results):
    rows = json.loads((tiny_results / "results.json").read_text())["rows"]
    params = {row["model"]: row["parameters"] for row in rows}
    assert abs(params["lstm-param-matched"] - params["attention+kv-cache"]) / params["attention+kv-cache"] < 0.02
    assert params["lstm"] > params["attention+kv-cache"]


def test_lstm_state_is_constant_and_kv_cache_grows(tiny_results):
    rows = json.loads((tiny_results / "results.json").read_text())["rows"]

    def state(model, tokens):
        return next(r["state_bytes"] for r in rows if (r["model"], r["batch"], r["new_tokens"], r["sweep"])
                    == (model, 1, tokens, "grid"))

    assert state("lstm", 16) == state("lstm", 48)
    assert state("attention+kv-cache", 48) > state("attention+kv-cache", 16)


def test_benchmark_notebook_runs_on_the_results(tiny_results, monkeypatch):
    monkeypatch.setenv("HYBRID_BENCH_RESULTS", str(tiny_results / "results.json"))
    monkeypatch.chdir(ROOT / "notebooks")
    namespace = execute_notebook(ROOT / "notebooks" / "benchmark.ipynb")
    assert set(namespace["plots"]) == {"ms_per_token", "throughput", "memory"}
    assert os.environ["HYBRID_BENCH_RESULTS"].endswith("results.json")

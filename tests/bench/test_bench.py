"""`hybrid bench` smoke test on a tiny grid, and the benchmark notebook executed on its results."""

import io
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import execute_notebook

from hybrid import MIXERS
from hybrid.bench.contenders import Contender, bart_model, hugging_face_bart, mixer_row
from hybrid.bench.floor import StepReads
from hybrid.bench.plots import figures
from hybrid.bench.runner import _summarise, floor_note, headline, measure_cell, print_table

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = ["ms_per_token", "ms_per_token_min", "ms_per_token_max", "tokens_per_s", "prefill_ms", "step_bytes",
           "floor_ms_per_token", "x_floor"]


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("bench")
    # Piped, as in a log file: what the command prints is kept for the test of its noise.
    run = subprocess.run([sys.executable, "-m", "hybrid.cli", "bench", "bench=tiny", f"output_dir={directory}",
                          "huggingface_bart=false", "memory_budget_gb=0.001"], cwd=directory, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    (directory / "console.txt").write_text(run.stdout + run.stderr)
    return directory


def test_results_file_schema_and_values(tiny_results):
    results = json.loads((tiny_results / "results.json").read_text())
    for key in ("device", "device_name", "dtype", "torch", "threads", "git_commit", "date", "source_length",
                "seed", "memory_bandwidth_gb_s", "last_level_cache_bytes", "model"):
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
    for name in ("results.csv", "config.yaml"):
        assert (tiny_results / name).stat().st_size > 0, name


def test_each_plot_draws_one_line_per_model_through_its_grid_cells(tiny_results):
    results = json.loads((tiny_results / "results.json").read_text())
    grid = [row for row in results["rows"] if row["sweep"] == "grid"]  # the memory-budget sweep is not plotted
    drawn = figures(results)

    def lines_of(name):
        (axis,) = drawn[name].axes
        return axis, {line.get_label(): list(zip(line.get_xdata(), line.get_ydata(), strict=True))
                      for line in axis.get_lines()}

    def expected(x, y, **where):
        points = {}
        for row in sorted(grid, key=lambda row: row[x]):
            if all(row[key] == value for key, value in where.items()):
                points.setdefault(row["model"], []).append((row[x], row[y]))
        return {model: line for model, line in points.items() if len(line) > 1}

    axis, lines = lines_of("ms_per_token")
    assert lines == expected("new_tokens", "ms_per_token", batch=1) and len(lines) >= 4  # tiny: 1x16, 1x48
    assert [text.get_text() for text in axis.get_legend().get_texts()] == list(lines)
    assert (axis.get_xlabel(), axis.get_ylabel()) == ("new tokens", "ms per generated token (batch 1)")
    assert (axis.get_xscale(), axis.get_yscale()) == ("log", "log")
    axis, lines = lines_of("memory")
    assert lines == expected("new_tokens", "state_bytes", batch=1)  # the CPU has no peak memory: the state
    assert lines["attention+kv-cache"][0][1] < lines["attention+kv-cache"][1][1]  # the KV cache grows
    assert lines["lstm"][0][1] == lines["lstm"][1][1]
    assert lines_of("throughput")[1] == {}  # every length of the tiny grid has one batch: no line to draw
    for name, figure in drawn.items():  # what plot_all wrote is these figures, at 120 dpi
        header = (tiny_results / f"{name}.png").read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n", name
        width, height = (int.from_bytes(header[at:at + 4], "big") for at in (16, 20))
        assert (width, height) == tuple(round(120 * inches) for inches in figure.get_size_inches()), name


def test_every_registered_mixer_has_its_rows_profile_and_summary_line(tiny_results):
    results = json.loads((tiny_results / "results.json").read_text())
    summary = (tiny_results / "summary.md").read_text()
    cells = {(row["batch"], row["new_tokens"]) for row in results["rows"] if row["sweep"] == "grid"}
    for name in MIXERS:
        rows = [row for row in results["rows"] if row["model"] == mixer_row(name)]
        assert {(row["batch"], row["new_tokens"]) for row in rows if row["sweep"] == "grid"} == cells, name
        assert any(row["sweep"] == "memory_budget" for row in rows), name
        assert all(row["mixer"] == name for row in rows)
        assert set(results["profile"][mixer_row(name)]) == {"position 0", "position 16"}, name
        assert f"| {mixer_row(name)} |" in summary.split("Every mixer's decoder at batch 1")[1], name


def test_ctranslate2_runs_in_every_cell_at_float32_and_int8(tiny_results):
    pytest.importorskip("ctranslate2")
    rows = json.loads((tiny_results / "results.json").read_text())["rows"]
    cells = {(row["batch"], row["new_tokens"]) for row in rows if row["sweep"] == "grid"}
    for name in ("bart-ct2-float32", "bart-ct2-int8"):
        # The runner refuses a row whose calls decode other than N tokens, so each of these decoded N.
        assert {(row["batch"], row["new_tokens"]) for row in rows if row["model"] == name} == cells, name
    params = {row["model"]: row["parameters"] for row in rows}
    assert params["bart-ct2-float32"] == params["bart-ct2-int8"] > 0


def test_the_floor_stands_beside_every_cell(tiny_results):
    results = json.loads((tiny_results / "results.json").read_text())
    bandwidth = results["meta"]["memory_bandwidth_gb_s"] * 1e9
    for row in results["rows"]:
        assert row["floor_ms_per_token"] == pytest.approx(1000 * row["step_bytes"] / bandwidth)
        assert row["x_floor"] == pytest.approx(row["ms_per_token"] / row["floor_ms_per_token"])
    header = (tiny_results / "results.csv").read_text().splitlines()[0].split(",")
    assert {"step_bytes", "floor_ms_per_token", "x_floor"} <= set(header)
    assert "| floor ms/token | x floor |" in (tiny_results / "summary.md").read_text()


def test_a_kv_cache_step_reads_more_at_longer_lengths_and_an_lstm_step_the_same(tiny_results):
    rows = json.loads((tiny_results / "results.json").read_text())["rows"]

    def read(model, tokens):
        return next(r["step_bytes"] for r in rows if (r["model"], r["batch"], r["new_tokens"], r["sweep"])
                    == (model, 1, tokens, "grid"))

    for model in ("attention+kv-cache", "bart-ct2-float32"):
        assert read(model, 48) > read(model, 16), model
    assert read("lstm", 48) == read("lstm", 16)
    assert read("bart-ct2-int8", 16) < read("bart-ct2-float32", 16)


def test_the_transformers_row_returns_only_the_new_tokens():
    pytest.importorskip("transformers")
    shape = {"vocab_size": 32, "d_model": 16, "n_heads": 2, "d_ff": 32, "encoder_layers": 1, "decoder_layers": 2,
             "max_positions": 64}
    row = hugging_face_bart(bart_model(shape), "cpu", torch.float32, max_new_tokens=None)
    assert row.generate(torch.randint(3, 32, (2, 5)), 7).shape == (2, 7)


def test_a_contender_that_decodes_other_than_n_tokens_is_refused():
    short = Contender("short", 1, prefill=lambda src: None, generate=lambda src, n: torch.zeros(len(src), n - 1),
                      state_bytes=lambda *shape: 1, step_reads=StepReads(1, 1))
    repeats = [measure_cell(short, torch.ones(2, 3, dtype=torch.long), 8, torch.device("cpu"))]
    with pytest.raises(RuntimeError, match="short decoded \\[7\\] tokens where the cell asks for 8"):
        _summarise(short, repeats, 2, 8, {"source_length": 3}, torch.device("cpu"), bandwidth=1e9)


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


def test_fast_path_rows_time_their_export_apart_and_int8_reads_fewer_bytes(tiny_results):
    results = json.loads((tiny_results / "results.json").read_text())
    grid = [row for row in results["rows"] if row["sweep"] == "grid"]
    cells = {(row["batch"], row["new_tokens"]) for row in grid}
    for name in ("lstm+fast", "lstm+int8"):
        rows = [row for row in grid if row["model"] == name]
        assert {(row["batch"], row["new_tokens"]) for row in rows} == cells, name
        assert all(row["setup_s"] > 0 for row in rows), name  # the export, never inside ms/token
    assert all(row["setup_s"] is None for row in grid if row["model"] == "lstm")

    def read(model):
        return next(row["step_bytes"] for row in grid if (row["model"], row["batch"], row["new_tokens"]) ==
                    (model, 1, 16))

    assert read("lstm+int8") < read("lstm+fast") == read("lstm")
    assert "Export or compilation" in (tiny_results / "summary.md").read_text()
    targets = {check["target"] for check in results["headline"]}
    assert any("CTranslate2 fp32" in target for target in targets)


def test_headline_ratios_point_the_right_way():
    # One cell where the LSTM fast path takes twice CTranslate2's time and transformers takes three
    # times the KV cache's: a multiple target must read 2.0 (missed), a speed-up target 3.0 (met).
    def row(model, ms):
        return {"model": model, "batch": 1, "new_tokens": 256, "sweep": "grid", "ms_per_token": ms}

    results = {"rows": [row("lstm+fast", 1.0), row("bart-ct2-float32", 0.5),
                        row("attention+kv-cache", 1.0), row("bart-hf-generate", 3.0)]}
    checks = {check["target"]: check for check in headline(results)}
    multiple = checks["lstm fast path ms/token as a multiple of CTranslate2 fp32's, 1 x 256"]
    assert multiple["measured"] == pytest.approx(2.0) and multiple["met"] is False
    speed_up = checks["KV-cached attention vs transformers' BART generate(), batch 1 x 256"]
    assert speed_up["measured"] == pytest.approx(3.0) and speed_up["met"] is True
    assert checks["lstm int8 vs CTranslate2 int8, 64 x 256 (ahead: > 1)"]["met"] is None  # cell not run


def test_headline_holds_every_measured_constant_state_mixer_to_the_same_targets():
    # Two constant-state mixers measured (one only on the fast path), the rest of the registry not:
    # the measured ones get the same targets under their own names, and the others none.
    def row(model, ms, batch=1, new_tokens=256):
        return {"model": model, "batch": batch, "new_tokens": new_tokens, "sweep": "grid", "ms_per_token": ms}

    measured = [name for name in MIXERS if MIXERS[name].constant_state][:2]
    results = {"rows": [row("bart-ct2-float32", 1.0), row(measured[0], 2.0, 1, 4096),
                        row("attention+kv-cache", 3.0, 1, 4096), row(f"{measured[1]}+fast", 0.5)]}
    targets = {check["target"]: check for check in headline(results)}
    for name in (name for name in MIXERS if MIXERS[name].constant_state):
        mine = {target for target in targets if target.startswith(f"{name} ")}
        if name in measured:
            assert len(mine) == 9, (name, mine)
        else:
            assert not mine, name
    assert targets[f"{measured[0]} vs KV-cached attention, batch 1 x 4096"]["measured"] == pytest.approx(1.5)
    fast = targets[f"{measured[1]} fast path ms/token as a multiple of CTranslate2 fp32's, 1 x 256"]
    assert fast["measured"] == pytest.approx(0.5) and fast["met"] is True


def test_a_smoke_run_prints_its_rows_and_no_noise(tiny_results):
    console = (tiny_results / "console.txt").read_text()
    for noise in ("profiler_start", "USDT", "No artists with labels", "Writing model shards", "Loading weights"):
        assert noise not in console, noise
    table = [line for line in console.splitlines() if line.startswith("│")]
    assert table and not any("…" in line for line in table)  # not cut to 80 columns in a pipe
    models = {row["model"] for row in json.loads((tiny_results / "results.json").read_text())["rows"]}
    assert models == {line.split("│")[1].strip() for line in table} - {"model"}
    # A tiny model's step fits in any cache: the floor is no bound there, and no verdict is given.
    assert "multiple of its floor" not in console and "no floor verdict" in console


def floor_results(step_bytes: int) -> dict:
    row = {"model": "lstm+fast", "batch": 1, "new_tokens": 256, "sweep": "grid", "ms_per_token": 1.0,
           "ms_per_token_min": 0.9, "ms_per_token_max": 1.1, "tokens_per_s": 1000.0, "prefill_ms": 1.0,
           "state_bytes": 1024, "parameters": 123_456, "step_bytes": step_bytes, "floor_ms_per_token": 0.25,
           "x_floor": 4.0}
    meta = {"device_name": "a CPU", "dtype": "float32", "threads": 1, "memory_bandwidth_gb_s": 10.0,
            "last_level_cache_bytes": 32 * 2**20}
    return {"meta": meta, "rows": [row, dict(row, model="lstm", step_bytes=step_bytes)]}


def test_the_floor_is_judged_only_for_steps_that_must_read_memory():
    large, small = floor_results(step_bytes=64 * 2**20), floor_results(step_bytes=2**20)
    verdicts = {check["target"]: check for check in headline(large)}
    assert verdicts["every fast row at batch 1, worst multiple of its floor"]["met"] is False  # 4x > 3x
    assert floor_note(large) is None
    assert not any("floor" in check["target"] for check in headline(small))
    assert "fits in the 32 MiB last-level cache" in floor_note(small)


def test_the_table_is_never_cut():
    from rich.console import Console

    results = floor_results(step_bytes=2**20)
    narrow, pipe = io.StringIO(), io.StringIO()
    print_table(results, Console(file=narrow, width=60, force_terminal=True, color_system=None))
    assert "…" not in narrow.getvalue()  # the cells wrap inside the terminal's width
    assert max(map(len, narrow.getvalue().splitlines())) <= 60
    print_table(results, Console(file=pipe, width=60))  # a pipe or a file: no width to fit
    assert "…" not in pipe.getvalue() and "123,456" in pipe.getvalue() and "lstm+fast" in pipe.getvalue()


def test_plots_of_a_grid_with_lines_missing_do_not_warn():
    rows = [dict(floor_results(step_bytes=2**20)["rows"][0], new_tokens=tokens) for tokens in (16, 48)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels found to put in legend"
        drawn = figures({"meta": floor_results(1)["meta"], "rows": rows})
    assert drawn["ms_per_token"].axes[0].get_legend() is not None  # the one plot with a line keeps its legend
    assert drawn["throughput"].axes[0].get_legend() is None


@pytest.mark.parametrize(("overrides", "name", "ctranslate2"), [
    (["generation.num_beams=2"], "beam 2", {"beam_size": 2}),
    (["generation.do_sample=true", "generation.top_k=5", "generation.temperature=0.7"],
     "sampling (top-k 5, temperature 0.7)",
     {"beam_size": 1, "sampling_topk": 5, "sampling_topp": 1.0, "sampling_temperature": 0.7}),
], ids=["beams", "sampling"])
def test_every_contender_decodes_n_tokens_with_the_cells_strategy(tmp_path, overrides, name, ctranslate2):
    pytest.importorskip("ctranslate2")
    from hybrid.bench.contenders import ctranslate2_options, strategy_name, strategy_options

    generation = dict(override.removeprefix("generation.").split("=") for override in overrides)
    generation = {key: json.loads(value) for key, value in generation.items()}
    assert strategy_name(strategy_options(generation)) == name
    assert ctranslate2_options(generation) == ctranslate2
    run = subprocess.run([sys.executable, "-m", "hybrid.cli", "bench", "bench=tiny", f"output_dir={tmp_path}",
                          "models=[lstm,lstm+fast,bart-hf-generate,bart-ct2-float32]", "cells=[[2,12]]",
                          "fast_quantize=[null]", "profile=false", "repeats=1", *overrides],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    # The runner refuses a row whose calls decode other than N tokens, so every row here decoded 12 with it.
    assert {row["model"] for row in results["rows"]} == {"lstm", "lstm+fast", "bart-hf-generate", "bart-ct2-float32"}
    assert strategy_name(results["meta"]["generation"]) == name
    assert f", {name}, commit " in (tmp_path / "summary.md").read_text().splitlines()[0]


def test_a_strategy_option_the_bench_cannot_map_to_ctranslate2_is_refused():
    from hybrid.bench.contenders import strategy_options

    with pytest.raises(ValueError, match=r"generation takes num_beams, do_sample, top_k, top_p, temperature.*"
                                         r"\['no_repeat_ngram_size'\]"):
        strategy_options({"num_beams": 2, "no_repeat_ngram_size": 3})

"""``hybrid bench``: time decoding (greedy, beams or sampling) of every contender over (batch, new tokens) cells.

Method (see ../shared/BENCHMARKING.md): every contender decodes exactly N new tokens
(EOS ignored via ``min_new_tokens``); warm-up runs are excluded; contenders are
interleaved within each repeat (A B A B) so drift hits all of them; each cell reports
the median and the spread; prefill (encoder + cross-attention keys/values) is timed on
its own and subtracted, so ms/token is decoding only. Beside every cell stands its floor:
the bytes a step must read (:mod:`hybrid.bench.floor`) over the memory bandwidth measured
once per run, and the measured ms/token as a multiple of it; the headline judges a row against
its floor only when those bytes exceed the last-level cache, so must come from memory.
"""

from __future__ import annotations

import csv
import io
import json
import resource
import statistics
from pathlib import Path

import torch

from hybrid.bench.contenders import Contender, build_contenders, mixer_row, strategy_name, strategy_options
from hybrid.bench.floor import last_level_cache_bytes
from hybrid.bench.metadata import run_metadata
from hybrid.bench.timing import timed
from hybrid.files import write_atomically
from hybrid.mixers import MIXERS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def measure_bandwidth(device: torch.device, buffer_mib: int, repeats: int = 5) -> float:
    """Bytes per second that ``Tensor.copy_`` moves between two buffers of ``buffer_mib`` MiB, counting
    the bytes read and the bytes written (as STREAM's copy does), median of ``repeats`` timed copies.

    Pick buffers well beyond the last-level cache. On a CPU the copy runs on the threads that the
    benchmark set, so it is the bandwidth those threads reach, not the socket's.
    """
    source = torch.ones(buffer_mib * 2**20 // 4, device=device)  # written, so no page is the shared zero page
    target = torch.empty_like(source)
    target.copy_(source)  # untimed: the first touch of the target's pages faults them in
    seconds = statistics.median(timed(device, lambda: target.copy_(source))[0] for _ in range(repeats))
    return 2 * source.nbytes / seconds


def measure_cell(contender: Contender, src: torch.Tensor, new_tokens: int, device: torch.device) -> dict:
    """One timed repeat: prefill alone, then the whole generate call, whose new tokens are counted."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # Untimed first: the contenders run interleaved, so each call would otherwise pay for waking its
    # engine's thread pool and refilling the caches the others evicted. CTranslate2's intra-op pool
    # sleeps between calls; timing its one-token prefill cold and the whole call warm made the
    # difference (the decoding) come out negative on short cells.
    contender.prefill(src)
    prefill, _ = timed(device, lambda: contender.prefill(src))
    total, tokens = timed(device, lambda: contender.generate(src, new_tokens))
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"prefill_s": prefill, "total_s": total, "peak_bytes": peak, "decoded_tokens": tokens.shape[-1]}


def run_benchmark(settings: dict) -> dict:
    """Run the grid described by ``settings`` (the composed ``bench`` config) and return the results dict."""
    device = torch.device(settings["device"])
    dtype = DTYPES[settings["dtype"]]
    torch.set_num_threads(settings["threads"])
    shape = settings["model"]
    contenders = build_contenders(shape, settings, device, dtype)
    bandwidth = measure_bandwidth(device, settings["bandwidth_buffer_mib"])
    generator = torch.Generator().manual_seed(settings["seed"])
    rows = []
    for batch, new_tokens in settings["cells"]:
        active = [c for c in contenders if (c.max_new_tokens is None or new_tokens <= c.max_new_tokens)
                  and (c.max_batch is None or batch <= c.max_batch) and new_tokens > c.prefill_steps]
        rows += measure_contenders(active, batch, new_tokens, settings, device, generator, bandwidth=bandwidth)
    if settings["memory_budget_gb"]:
        rows += _memory_budget_sweep(contenders, settings, device, generator, bandwidth)
    profiles = _profiles(contenders, settings, device, generator) if settings["profile"] else {}
    return {
        "meta": {
            **run_metadata(device), "dtype": settings["dtype"], "source_length": settings["source_length"],
            "seed": settings["seed"], "repeats": settings["repeats"],
            "memory_bandwidth_gb_s": bandwidth / 1e9, "last_level_cache_bytes": last_level_cache_bytes(device),
            "model": dict(shape), "generation": strategy_options(dict(settings.get("generation") or {})),
        },
        "rows": rows,
        "profile": profiles,
    }


def _profiles(contenders: list[Contender], settings: dict, device: torch.device,
              generator: torch.Generator) -> dict:
    """ms per step in each part (mixer, cross-attention, FFN, head, token choice) of the decoder of
    every registered mixer, early in a decode and at the longest length of the grid (batch 1)."""
    from hybrid.bench.profiling import profile_decoding

    longest = max(tokens for _, tokens in settings["cells"])
    src = torch.randint(3, settings["model"]["vocab_size"], (1, settings["source_length"]),
                        generator=generator).to(device)
    out = {}
    for contender in contenders:
        if contender.mixer is not None:
            steps = min(32, longest)
            out[contender.name] = {f"position {position}": profile_decoding(contender.model, src, position, steps)
                                   for position in (0, longest - steps)}
    return out


def measure_contenders(contenders: list[Contender], batch: int, new_tokens: int, settings: dict,
                       device: torch.device, generator: torch.Generator, sweep: str = "grid",
                       bandwidth: float | None = None) -> list[dict]:
    """Warm up, then time every contender on one (batch, new tokens) cell, interleaved (A B A B), and
    return one row each (:func:`measure_cell`'s repeats summarised: median ms/token, spread, prefill,
    state, parameters). ``settings`` needs ``model.vocab_size``, ``source_length``, ``repeats`` and
    ``warmup_new_tokens``. Given the memory ``bandwidth`` (bytes/s), each row also gets its floor;
    ``hybrid ablate`` (:mod:`hybrid.report.runs`), which only wants the times, leaves it out."""
    shape = settings["model"]
    # Random, seeded, never all zeros (ids 3.. avoid padding/BOS/EOS).
    src = torch.randint(3, shape["vocab_size"], (batch, settings["source_length"]), generator=generator).to(device)
    for contender in contenders:  # warm-up: kernels, allocator, lazily built tensors
        contender.prefill(src)
        contender.generate(src, min(new_tokens, settings["warmup_new_tokens"]))
    repeats = {c.name: [] for c in contenders}
    for _ in range(settings["repeats"]):
        for contender in contenders:  # interleaved: A B A B
            with torch.inference_mode():
                repeats[contender.name].append(measure_cell(contender, src, new_tokens, device))
    rows = []
    for contender in contenders:
        rows.append(dict(_summarise(contender, repeats[contender.name], batch, new_tokens, settings, device,
                                    bandwidth=bandwidth), sweep=sweep))
        print(_format_row(rows[-1]), flush=True)
    return rows


def _memory_budget_sweep(contenders: list[Contender], settings: dict, device: torch.device,
                         generator: torch.Generator, bandwidth: float) -> list[dict]:
    """At the longest length, the decoder of every registered mixer at the largest batch whose
    weights plus decoding state fit ``memory_budget_gb``: where the KV cache's growth shows."""
    budget = settings["memory_budget_gb"] * 2**30
    new_tokens = max(tokens for _, tokens in settings["cells"])
    rows = []
    for contender in contenders:
        if contender.mixer is None:
            continue
        weights = sum(p.numel() * p.element_size() for p in contender.model.parameters())
        per_sequence = contender.state_bytes(1, settings["source_length"], new_tokens)  # the state is linear in batch
        batch = 1
        while batch < 2**16 and weights + 2 * batch * per_sequence <= budget:
            batch *= 2
        rows += measure_contenders([contender], batch, new_tokens, settings, device, generator, sweep="memory_budget",
                         bandwidth=bandwidth)
    return rows


def _summarise(contender: Contender, repeats: list[dict], batch: int, new_tokens: int, settings: dict,
               device: torch.device, bandwidth: float | None = None) -> dict:
    decoded = {r["decoded_tokens"] for r in repeats}
    if decoded != {new_tokens}:  # every row must do the same work
        raise RuntimeError(f"{contender.name} decoded {sorted(decoded)} tokens where the cell asks for {new_tokens}")
    prefill_ms = [1000 * r["prefill_s"] for r in repeats]
    # Decoding = the whole call minus the prefill it contains. Each prefill timing is one short
    # measurement, the noisiest of the cell, and noise (preemption, a busy neighbour) only ever adds
    # time, so the fastest of them is the best estimate; a median of two can carry one hiccup of
    # several milliseconds and, on a short cell, push the decoding time below zero. A prefill that
    # decodes tokens too (prefill_steps) leaves that many fewer in the rest of the call.
    prefill_s = min(r["prefill_s"] for r in repeats)
    decode_ms = [1000 * (r["total_s"] - prefill_s) / (new_tokens - contender.prefill_steps) for r in repeats]
    median_ms = statistics.median(decode_ms)
    row = {
        "model": contender.name, "batch": batch, "new_tokens": new_tokens,
        "ms_per_token": median_ms, "ms_per_token_min": min(decode_ms), "ms_per_token_max": max(decode_ms),
        "tokens_per_s": batch * 1000.0 / median_ms if median_ms > 0 else float("inf"),
        "prefill_ms": statistics.median(prefill_ms),
        "setup_s": contender.setup_seconds,  # export or compilation, once per process; never in ms_per_token
        "state_bytes": contender.state_bytes(batch, settings["source_length"], new_tokens),
        "parameters": contender.parameters,
        "mixer": contender.mixer,
    }
    if bandwidth is not None:
        row["step_bytes"] = contender.step_reads.per_step(batch, settings["source_length"], new_tokens)
        row["floor_ms_per_token"] = 1000 * row["step_bytes"] / bandwidth
        row["x_floor"] = median_ms / row["floor_ms_per_token"]
    if device.type == "cuda":
        row["peak_memory_bytes"] = max(r["peak_bytes"] for r in repeats)
    else:
        # The process's peak resident set so far (Linux reports KiB): an upper bound, not this cell alone.
        row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return row


def _format_row(row: dict) -> str:
    floor = f"  floor {row['floor_ms_per_token']:.4f} ms (x{row['x_floor']:.1f})" if "x_floor" in row else ""
    return (f"{row['model']:<22} batch {row['batch']:>4} x {row['new_tokens']:>5} tokens: "
            f"{row['ms_per_token']:8.3f} ms/token [{row['ms_per_token_min']:.3f}, {row['ms_per_token_max']:.3f}]"
            f"  {row['tokens_per_s']:10.1f} tok/s  prefill {row['prefill_ms']:7.2f} ms"
            f"  state {row['state_bytes'] / 2**20:8.2f} MiB{floor}")


def find_row(results: dict, model: str, batch: int, new_tokens: int) -> dict | None:
    for row in results["rows"]:
        if (row["model"], row["batch"], row["new_tokens"], row["sweep"]) == (model, batch, new_tokens, "grid"):
            return row
    return None


def headline(results: dict) -> list[dict]:
    """The project's targets as side-by-side ratios from one run (missing cells are reported as such).

    Each target is a ratio of two rows' ms/token in one cell (how many times faster the second is,
    or how many times slower, as the target is phrased), or one row's multiple of its floor.
    """

    def faster(slow: tuple, fast: tuple) -> float | None:
        a, b = find_row(results, *slow), find_row(results, *fast)
        return a["ms_per_token"] / b["ms_per_token"] if a and b and b["ms_per_token"] > 0 else None

    def multiple(row: tuple, of: tuple) -> float | None:  # row's ms/token over of's: above 1 is slower
        return faster(row, of)

    baseline = mixer_row("attention")
    checks = [  # (target, "at least" or "at most", the bound, the measured value)
        ("KV-cached attention vs transformers' BART generate(), batch 1 x 256", ">=", 2.0,
         faster(("bart-hf-generate", 1, 256), (baseline, 1, 256))),
        ("KV cache vs uncached loop, batch 1 x 256", ">=", 4.0,
         faster(("attention-no-cache", 1, 256), (baseline, 1, 256))),
        ("attention fast path vs transformers' BART generate(), 1 x 256", ">=", 2.5,
         faster(("bart-hf-generate", 1, 256), (f"{baseline}+fast", 1, 256))),
    ]
    # The constant-state targets hold for every such mixer in the registry that this run measured.
    measured = {row["model"] for row in results["rows"]}
    for name in MIXERS:
        eager = mixer_row(name)
        fast, int8 = f"{eager}+fast", f"{eager}+int8"
        if not MIXERS[name].constant_state or not {eager, fast, int8} & measured:
            continue
        checks += [
            (f"{name} vs KV-cached attention, batch 1 x 4096", ">=", 1.5,
             faster((baseline, 1, 4096), (eager, 1, 4096))),
            (f"{name} vs KV-cached attention, batch 64 x 2048", ">=", 4.0,
             faster((baseline, 64, 2048), (eager, 64, 2048))),
            (f"{name} fast path ms/token as a multiple of CTranslate2 fp32's, 1 x 256", "<=", 1.25,
             multiple((fast, 1, 256), of=("bart-ct2-float32", 1, 256))),
            (f"{name} fast path tokens/s vs CTranslate2 fp32, 1 x 4096", ">=", 2.0,
             faster(("bart-ct2-float32", 1, 4096), (fast, 1, 4096))),
            (f"{name} fast path vs CTranslate2 fp32, 64 x 1024", ">=", 10.0,
             faster(("bart-ct2-float32", 64, 1024), (fast, 64, 1024))),
            (f"{name} fast path vs CTranslate2 fp32, 64 x 2048", ">=", 10.0,
             faster(("bart-ct2-float32", 64, 2048), (fast, 64, 2048))),
            (f"{name} int8 ms/token as a multiple of CTranslate2 int8's, 1 x 256", "<=", 1.25,
             multiple((int8, 1, 256), of=("bart-ct2-int8", 1, 256))),
            (f"{name} int8 vs CTranslate2 int8, 64 x 256 (ahead: > 1)", ">", 1.0,
             faster(("bart-ct2-int8", 64, 256), (int8, 64, 256))),
            (f"{name} ms/token at 4096 vs at 64 new tokens, batch 1", "<=", 1.1,
             multiple((eager, 1, 4096), of=(eager, 1, 64))),
        ]
    fast_rows = _fast_rows_with_a_floor(results)
    floors = [row["x_floor"] for row in fast_rows if not _fits_in_cache(results, row)]
    if floors or not fast_rows:  # rows that all fit in the cache get no verdict (floor_note says so)
        checks.append(("every fast row at batch 1, worst multiple of its floor", "<=", 3.0,
                       max(floors) if floors else None))
    budget = {row["model"]: row for row in results["rows"] if row["sweep"] == "memory_budget"}
    for name in MIXERS:
        if MIXERS[name].constant_state and name in budget and baseline in budget:
            checks.append((f"{name} vs attention tokens/s at an equal memory budget (batch {budget[name]['batch']} "
                           f"vs {budget[baseline]['batch']}, a GPU target)", ">=", 10.0,
                           budget[name]["tokens_per_s"] / budget[baseline]["tokens_per_s"]))
    compare = {">=": lambda value, bound: value >= bound, "<=": lambda value, bound: value <= bound,
               ">": lambda value, bound: value > bound}
    return [{"target": name, "needed": f"{op} {bound}x", "measured": value,
             "met": None if value is None else compare[op](value, bound)} for name, op, bound, value in checks]


def _fast_rows_with_a_floor(results: dict) -> list[dict]:
    return [row for row in results["rows"] if row["batch"] == 1 and "x_floor" in row
            and row.get("sweep") != "memory_budget" and row["model"].endswith(("+fast", "+int8"))]


def _fits_in_cache(results: dict, row: dict) -> bool:
    """Whether a row's step reads (weights and state) fit in the run's last-level cache: then they need not
    come from memory, and a floor of bytes over memory bandwidth bounds nothing. Results written before
    the cache was recorded count every row as read from memory, as they were judged."""
    return row["step_bytes"] <= results.get("meta", {}).get("last_level_cache_bytes", 0)


def floor_note(results: dict) -> str | None:
    """Why the headline has no floor verdict, when every fast row's step fits in the last-level cache."""
    rows = _fast_rows_with_a_floor(results)
    if not rows or not all(_fits_in_cache(results, row) for row in rows):
        return None
    largest = max(row["step_bytes"] for row in rows)
    return (f"no floor verdict: every fast row's step reads at most {largest / 2**20:.2f} MiB, which fits in the "
            f"{results['meta']['last_level_cache_bytes'] / 2**20:.0f} MiB last-level cache, so memory bandwidth "
            "bounds nothing")


def measured_and_missing(results: dict) -> tuple[list[dict], list[str]]:
    """The headline's targets this run measured, and the names of those whose cells it did not run
    (reported in one line: each constant-state mixer has its own, so most runs miss many)."""
    checks = headline(results)
    return ([check for check in checks if check["measured"] is not None],
            [check["target"] for check in checks if check["measured"] is None])


def mixer_comparison(results: dict) -> list[str]:
    """A Markdown table of the eager decoder of every mixer the run measured (rows that carry a
    ``mixer``), at batch 1: parameters, state at the longest length, ms/token at each length, and
    each one's speed relative to the attention decoder's at the longest length."""
    rows = [row for row in results["rows"] if row.get("mixer") and row["batch"] == 1 and row["sweep"] == "grid"]
    if not rows:
        return []
    lengths = sorted({row["new_tokens"] for row in rows})
    longest = lengths[-1]
    by_model = {}
    for row in rows:
        by_model.setdefault(row["model"], {})[row["new_tokens"]] = row
    reference = by_model.get(mixer_row("attention"), {}).get(longest)
    lines = ["", f"Every mixer's decoder at batch 1 (eager path); 'vs attention': ms/token of the KV-cached "
             f"attention decoder over this one's at {longest} new tokens.", "",
             "| model | parameters | state KiB at " + str(longest) + " | "
             + " | ".join(f"ms/token at {n}" for n in lengths) + " | vs attention |",
             "|---" * (4 + len(lengths)) + "|"]
    for model, cells in by_model.items():
        last = cells.get(longest)
        ratio = (f"{reference['ms_per_token'] / last['ms_per_token']:.2f}x"
                 if reference and last and last["ms_per_token"] > 0 else "-")
        any_row = next(iter(cells.values()))
        lines.append(f"| {model} | {any_row['parameters']:,} | "
                     + (f"{last['state_bytes'] / 1024:.1f}" if last else "-") + " | "
                     + " | ".join(f"{cells[n]['ms_per_token']:.3f}" if n in cells else "-" for n in lengths)
                     + f" | {ratio} |")
    return lines


def markdown_summary(results: dict) -> str:
    """The headline ratios and the batch-1 length sweep as Markdown, for READMEs and notes."""
    meta = results["meta"]
    lines = [f"{meta['device_name']}, {meta['dtype']}, {meta['threads']} threads, torch {meta['torch']}, "
             f"{strategy_name(meta.get('generation', {}))}, "
             f"commit {meta['git_commit'][:10]}, {meta['date']}, "
             f"memory bandwidth {meta['memory_bandwidth_gb_s']:.1f} GB/s", "",
             "| target | needed | measured | met |", "|---|---|---|---|"]
    checks, missing = measured_and_missing(results)
    for check in checks:
        lines.append(f"| {check['target']} | {check['needed']} | {check['measured']:.2f}x | "
                     f"{'yes' if check['met'] else '**no**'} |")
    if missing:
        lines += ["", f"{len(missing)} more targets were not measured: their cells are not in this run's grid "
                  "(results.json lists them under headline)."]
    if floor_note(results):
        lines += ["", floor_note(results) + "."]
    lines += ["", "floor: the bytes a step reads (decoder weights + state) over the measured bandwidth; "
              "x floor: ms/token as a multiple of it.", "",
              "| model | batch | new tokens | ms/token (median [min, max]) | tokens/s | prefill ms | state MiB "
              "| MB read/step | floor ms/token | x floor |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        lines.append(f"| {row['model']} | {row['batch']} | {row['new_tokens']} | {row['ms_per_token']:.3f} "
                     f"[{row['ms_per_token_min']:.3f}, {row['ms_per_token_max']:.3f}] | {row['tokens_per_s']:.0f} | "
                     f"{row['prefill_ms']:.2f} | {row['state_bytes'] / 2**20:.2f} | {row['step_bytes'] / 1e6:.3f} | "
                     f"{row['floor_ms_per_token']:.4f} | {row['x_floor']:.1f} |")
    lines += mixer_comparison(results)
    setups = {row["model"]: row["setup_s"] for row in results["rows"] if row.get("setup_s") is not None}
    if setups:
        lines += ["", "Export or compilation, paid once per process before any timed call (seconds): "
                  + ", ".join(f"{model} {seconds:.1f}" for model, seconds in setups.items()) + "."]
    return "\n".join(lines) + "\n"


def write_results(results: dict, directory: Path) -> list[Path]:
    """results.json (everything), results.csv (the rows), summary.md and the plots."""
    from hybrid.bench.plots import plot_all

    directory.mkdir(parents=True, exist_ok=True)
    results = dict(results, headline=headline(results))
    write_atomically(directory / "results.json", json.dumps(results, indent=2) + "\n")
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=sorted({key for row in results["rows"] for key in row}))
    writer.writeheader()
    writer.writerows(results["rows"])
    write_atomically(directory / "results.csv", table.getvalue())
    write_atomically(directory / "summary.md", markdown_summary(results))
    return [directory / "results.json", directory / "results.csv", directory / "summary.md",
            *plot_all(results, directory)]


def print_table(results: dict, console=None) -> None:
    """A Rich table of every cell and the headline ratios, on ``console`` (standard output by default).

    Nothing is cut: in a terminal too narrow for the table its cells wrap, and a file or a pipe, which
    has no width to fit, gets the table at its natural width.
    """
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    meta = results["meta"]
    table = Table(title=f"{strategy_name(meta.get('generation', {}))} on {meta['device_name']} "
                        f"({meta['dtype']}, {meta['threads']} threads, "
                        f"{meta['memory_bandwidth_gb_s']:.1f} GB/s)")
    for column in ("model", "batch", "new tokens", "ms/token", "min", "max", "tokens/s", "prefill ms",
                   "state MiB", "params", "floor ms", "x floor"):
        table.add_column(column, justify="left" if column == "model" else "right", overflow="fold")
    for row in results["rows"]:
        table.add_row(row["model"], str(row["batch"]), str(row["new_tokens"]), f"{row['ms_per_token']:.3f}",
                      f"{row['ms_per_token_min']:.3f}", f"{row['ms_per_token_max']:.3f}",
                      f"{row['tokens_per_s']:.1f}", f"{row['prefill_ms']:.2f}",
                      f"{row['state_bytes'] / 2**20:.2f}", f"{row['parameters']:,}",
                      f"{row['floor_ms_per_token']:.4f}", f"{row['x_floor']:.1f}")
    console = console or Console()
    if not console.is_terminal:  # Rich would assume 80 columns and shorten every cell to fit them
        unbounded = console.options.update_width(2**20)
        console.width = max(console.width, Measurement.get(console, unbounded, table).maximum)
    console.print(table)
    checks, missing = measured_and_missing(results)
    for check in checks:
        console.print(f"{check['target']}: {check['measured']:.2f}x (target {check['needed']}) "
                      f"{'met' if check['met'] else 'MISSED'}")
    if missing:
        console.print(f"{len(missing)} targets not measured (their cells are not in this run's grid)")
    if floor_note(results):
        console.print(floor_note(results))
    for model, positions in results.get("profile", {}).items():
        for position, parts in positions.items():
            shares = ", ".join(f"{part} {ms:.3f}" for part, ms in parts.items())
            console.print(f"profile {model} at {position} (ms/step): {shares}")

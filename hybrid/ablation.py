"""``hybrid ablate``: gather training runs into one table and a Pareto plot of quality against decoding speed.

Each run is a ``hybrid fit`` output folder (``.hydra/config.yaml``, ``checkpoints/last.ckpt``,
``csv/metrics.csv``). For every run the table holds the test metrics (``test_after_fit=true``),
the parameter count, the training time and training tokens/s (written by :class:`TrainingClock`),
and the decoding speed: greedy ms per generated token at one fixed batch and length, timed with
the benchmark's own loop (:mod:`hybrid.bench.runner`: warm-up, contenders interleaved, prefill
subtracted, median of the repeats). The ablation experiments are ``configs/experiment/ablate_*.yaml``.

Seeds are an axis of their own: runs of one configuration that differ only in their seed (``hybrid fit
experiment=... seed=1 hydra.run.dir=...``) are pooled by :func:`group_seeds` into one row of means, sample
standard deviations and the number of seeds, and every comparison between configurations says whether its
difference stands out of the spread between seeds (:func:`significant`).
"""

from __future__ import annotations

import csv
import datetime
import functools
import io
import json
import logging
import platform
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning import Callback, LightningModule, Trainer
from omegaconf import OmegaConf

from hybrid.files import write_atomically
from hybrid.model import Seq2Seq
from hybrid.training.checkpoint import read_checkpoint

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

CLOCK_FILE = "training_clock.json"
# The columns of the table, in order; the test metrics follow them. A run's row has its ``seed``; a
# configuration's row (see group_seeds) has ``seeds``, how many runs it pools, instead.
COLUMNS = ("task", "run", "decoder", "layers", "mixer_options", "init", "steps", "total_steps", "seed", "seeds",
           "parameters", "mixer_parameters", "state_bytes", "train_time_s", "train_tokens_per_s", "ms_per_token")
# What a run measures besides its test metrics: these vary between the seeds of one configuration, every
# other column describes the configuration.
MEASURED = ("train_time_s", "train_tokens_per_s", "ms_per_token")
# Quality on the Pareto plot: the task's error rate (lower is better), the first one a run has.
ERROR_METRICS = ("test/per", "test/cer", "test/wer")
VERDICTS = {True: "met", False: "MISSED", None: "not measurable"}  # None: the baseline scored 0
# What significant() says of a difference between two configurations; None: a side has no spread (one seed).
SIGNIFICANCE = {True: "significant", False: "not significant", None: "n=1, significance unknown"}


class TrainingClock(Callback):
    """Time the training loop and count its tokens; writes ``training_clock.json`` into the run folder.

    ``train_time_s`` is the wall time from the first to the last training step, validation included;
    ``train_tokens_per_s`` is target tokens (what the loss is taken over, padding excluded) per second
    spent in training batches (forward, backward and optimiser step), over every process.
    """

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.begin = time.perf_counter()
        self.batch_seconds = 0.0
        self.tokens = torch.zeros((), dtype=torch.long, device=pl_module.device)  # summed on the device: no sync

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.batch_begin = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.tokens += batch["tgt_out"].ne(pl_module.model.config.pad_id).sum()
        self.batch_seconds += time.perf_counter() - self.batch_begin

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        tokens = int(self.tokens) * trainer.world_size
        clock = {"train_time_s": time.perf_counter() - self.begin, "train_batch_time_s": self.batch_seconds,
                 "train_tokens": tokens, "train_tokens_per_s": tokens / max(self.batch_seconds, 1e-9),
                 "global_step": trainer.global_step}
        path = Path(trainer.default_root_dir) / CLOCK_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(clock, indent=2) + "\n")


# ----- collecting runs ---------------------------------------------------------------------


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Every ``hybrid fit`` run folder at or under ``paths`` (one with ``.hydra/config.yaml`` and
    ``checkpoints/last.ckpt``); of several runs with the same name and seed, only the newest (a rerun
    replaces its predecessor, another seed joins it)."""
    newest: dict[str, Path] = {}
    for path in map(Path, paths):
        for checkpoint in sorted(path.rglob("checkpoints/last.ckpt")):
            run = checkpoint.parent.parent
            if not (run / ".hydra" / "config.yaml").is_file():
                continue
            cfg = _composed(run)
            key = _run_key(_run_name(run, cfg), cfg.get("seed"))
            if key not in newest or checkpoint.stat().st_mtime > _last(newest[key]).stat().st_mtime:
                newest[key] = run
    return [newest[key] for key in sorted(newest)]


def _run_key(name: str, seed: Any) -> str:
    """What tells one run from another: its name and its seed."""
    return f"{name} seed {seed}"


def _last(run: Path) -> Path:
    return run / "checkpoints" / "last.ckpt"


def _composed(run: Path) -> dict[str, Any]:
    # Unresolved: the default name interpolates Hydra's runtime choices, which only a live run can resolve.
    return OmegaConf.to_container(OmegaConf.load(run / ".hydra" / "config.yaml"), resolve=False)


def _run_name(run: Path, cfg: dict[str, Any]) -> str:
    name = str(cfg.get("name", ""))
    return name if name and "${" not in name else run.name


def pattern_label(mixers: Sequence[str]) -> str:
    """``["lstm"] * 3`` -> ``"lstm x3"``; a mixed stack lists its layers bottom-up."""
    return f"{mixers[0]} x{len(mixers)}" if len(set(mixers)) == 1 else ",".join(mixers)


def changed_options(config) -> str | None:
    """The options of the run's mixers that differ from their defaults, e.g. ``"lstm.hidden_size=35"``."""
    changed = []
    for name in dict.fromkeys(config.decoder_mixers):
        options = config.options_for(name)
        defaults = type(options)()
        changed += [f"{name}.{key}={value}" for key, value in options.to_dict().items()
                    if value != getattr(defaults, key)]
    return " ".join(changed) or None


def read_test_metrics(metrics_csv: Path) -> dict[str, float]:
    """Every ``test/...`` value a run's ``csv/metrics.csv`` holds (the last one of each)."""
    metrics: dict[str, float] = {}
    if metrics_csv.is_file():
        with open(metrics_csv, newline="") as handle:
            for row in csv.DictReader(handle):
                metrics.update({key: float(value) for key, value in row.items()
                                if key.startswith("test/") and value not in ("", None)})
    return metrics


def write_validation_curves(runs: Path, metric: str, output: Path) -> None:
    """``output``: every run's ``metric`` (a ``val/...`` column) at each validation, as a CSV of run (its
    folder under ``runs``), step (counted from 1) and value, to show how fast each configuration learns."""
    runs = Path(runs)
    lines = [f"run,step,{metric.replace('/', '_')}"]
    for metrics_csv in sorted(runs.rglob("csv/metrics.csv")):
        run = metrics_csv.parent.parent.relative_to(runs).as_posix()
        with open(metrics_csv, newline="") as handle:
            lines += [f"{run},{int(row['step']) + 1},{float(row[metric]):.4f}"
                      for row in csv.DictReader(handle) if row.get(metric)]
    write_atomically(output, "\n".join(lines) + "\n")


def describe_run(run: Path) -> tuple[dict[str, Any], Seq2Seq]:
    """One table row of a run (without its decoding speed) and its model, built from ``last.ckpt``."""
    cfg = _composed(run)
    trained = read_checkpoint(_last(run))
    config = trained.config
    data = cfg.get("data", {})
    task = "g2p" if str(data.get("_target_", "")).endswith("G2PDataModule") else str(data.get("task", "text"))
    converted_from = config.extra.get("converted_from")
    row: dict[str, Any] = {
        "task": task, "run": _run_name(run, cfg), "decoder": pattern_label(config.decoder_mixers),
        "layers": f"{config.encoder_layers}-{config.decoder_layers}",
        "mixer_options": changed_options(config),
        "init": f"converted from {pattern_label(converted_from)}" if converted_from else "scratch",
        "steps": trained.global_step, "total_steps": trained.global_step + config.extra.get("converted_at_step", 0),
        "seed": cfg.get("seed"),
    }
    model = trained.build("cpu")
    row["parameters"] = model.num_parameters()
    # Per decoder layer, the mixer's own (the rest of a layer is the same for every mixer).
    row["mixer_parameters"] = round(sum(p.numel() for layer in model.decoder_layers for p in layer.mixer.parameters())
                                    / len(model.decoder_layers))
    clock = run / CLOCK_FILE
    if clock.is_file():
        times = json.loads(clock.read_text())
        row.update(train_time_s=times["train_time_s"], train_tokens_per_s=times["train_tokens_per_s"])
    row.update(read_test_metrics(run / "csv" / "metrics.csv"))
    return row, model


def decoding_speed(models: dict[str, Seq2Seq], batch: int, new_tokens: int, source_length: int, repeats: int,
                   seed: int = 0) -> dict[str, float]:
    """Greedy ms per generated token of each model at ``batch`` x ``new_tokens``, timed by the benchmark's
    loop: exactly ``new_tokens`` per row (EOS ignored), warm-up excluded, the models of one vocabulary
    interleaved within each repeat, prefill subtracted, the median of ``repeats``."""
    from hybrid.bench.contenders import ours
    from hybrid.bench.runner import measure_contenders

    speeds: dict[str, float] = {}
    for vocab_size in sorted({model.config.vocab_size for model in models.values()}):
        contenders = [ours(name, model) for name, model in models.items() if model.config.vocab_size == vocab_size]
        settings = {"model": {"vocab_size": vocab_size}, "source_length": source_length, "repeats": repeats,
                    "warmup_new_tokens": min(new_tokens, 32)}
        rows = measure_contenders(contenders, batch, new_tokens, settings, torch.device("cpu"),
                        torch.Generator().manual_seed(seed))
        speeds.update({row["model"]: row["ms_per_token"] for row in rows})
    return speeds


def collect(paths: Iterable[str | Path], batch: int = 8, new_tokens: int = 128, source_length: int = 16,
            repeats: int = 5) -> list[dict[str, Any]]:
    """One row per run found under ``paths`` (see :func:`find_runs`; each seed is a run of its own): its
    settings, test metrics, parameter count, mixer state bytes per sequence at ``new_tokens``, training time
    and tokens/s, and decoding ms/token at ``batch`` x ``new_tokens``. :func:`group_seeds` pools the seeds."""
    runs = find_runs(paths)
    if not runs:
        raise FileNotFoundError(f"no run folders (.hydra/config.yaml + checkpoints/last.ckpt) under {list(paths)}")
    rows, models = [], {}
    for run in runs:
        row, model = describe_run(run)
        # The decoder's self-mixing state for one sequence at the timed length: the LSTM's (h, c) or
        # the KV cache (cross-attention memory left out: every decoder has the same).
        src = torch.full((1, source_length), 3)
        row["state_bytes"] = model.start(src, max_steps=new_tokens).mixer_nbytes
        rows.append(row)
        models[_run_key(row["run"], row["seed"])] = model.eval()
    speeds = decoding_speed(models, batch, new_tokens, source_length, repeats)
    for row in rows:
        row.update(ms_per_token=speeds[_run_key(row["run"], row["seed"])], decode_batch=batch,
                   decode_new_tokens=new_tokens)
    return sorted(rows, key=lambda row: (row["task"], row["run"], row["seed"] or 0))


# ----- pooling seeds -----------------------------------------------------------------------


def is_measured(name: str) -> bool:
    """Whether column ``name`` is a measurement (a test metric or one of :data:`MEASURED`), which varies
    between the seeds of one configuration, rather than a description of the configuration."""
    return name in MEASURED or name.startswith("test/")


def std_column(name: str) -> str:
    """The column of a configuration's row that holds the sample standard deviation of measurement ``name``."""
    return f"{name}_std"


def group_seeds(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration, pooling the runs that differ only in their seed, in the order first seen.

    A configuration is everything a run's row holds but its ``seed`` and its measurements (see
    :func:`is_measured`): task, run name, decoder, layers, mixer options, init, steps and the rest. Its row
    keeps those columns and holds, for each measurement, the mean over the seeds that have it and, under
    :func:`std_column`, the sample standard deviation (n - 1; None for a single value, which has no spread),
    and ``seeds``, the number of runs pooled. Rows already grouped (all with ``seeds``, as
    ``ablations_grouped.csv`` reads back) come back as they are.
    """
    if rows and all("seeds" in row for row in rows):
        return [dict(row) for row in rows]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        # Empty and absent cells alike: a CSV read back has every column, a collected row only its own.
        configuration = tuple(sorted((name, value) for name, value in row.items()
                                     if name != "seed" and not is_measured(name) and value not in (None, "")))
        groups.setdefault(configuration, []).append(row)
    grouped = []
    for runs in groups.values():
        group = {name: value for name, value in runs[0].items() if name != "seed" and not is_measured(name)}
        group["seeds"] = len(runs)
        for name in dict.fromkeys(name for run in runs for name in run if is_measured(name)):
            values = [float(run[name]) for run in runs if run.get(name) not in (None, "")]
            if values:
                group[name] = statistics.fmean(values)
                group[std_column(name)] = statistics.stdev(values) if len(values) > 1 else None
        grouped.append(group)
    return grouped


def significant(a: dict[str, Any], b: dict[str, Any], metric: str) -> bool | None:
    """Whether configurations ``a`` and ``b`` (rows of :func:`group_seeds`) differ in ``metric`` by more
    than the spread between their seeds.

    The rule: the difference of the means counts only when it exceeds the two sample standard deviations
    added, ``|mean_a - mean_b| > std_a + std_b``, i.e. when the mean ± 1 std intervals do not overlap; a
    difference inside that spread is not significant. It screens out seed noise read as an effect; it is
    not a statistical test (with a few seeds the standard deviation is itself rough). None where either
    side has fewer than two seeds measuring ``metric``: there is no spread to compare with.
    """
    spread_a, spread_b = a.get(std_column(metric)), b.get(std_column(metric))
    if spread_a is None or spread_b is None:
        return None
    return abs(float(a[metric]) - float(b[metric])) > spread_a + spread_b


# ----- the table and the plot --------------------------------------------------------------


def metric_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The ``test/...`` columns any row has (their standard deviations aside), error rates first."""
    names = {key for row in rows for key in row if key.startswith("test/")}
    names -= {std_column(name) for name in names}
    return [name for name in ERROR_METRICS if name in names] + sorted(names - set(ERROR_METRICS))


def columns_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The table's columns that any row fills: :data:`COLUMNS` in order, then the test metrics."""
    present = {key for row in rows for key in row}
    return [name for name in COLUMNS if name in present] + metric_columns(rows)


def _number(name: str, value: Any) -> str:
    if value is None or value == "":
        return "-"
    if name in ("parameters", "mixer_parameters", "train_tokens_per_s", "state_bytes"):
        return f"{float(value):,.0f}"
    if name == "train_time_s":
        return f"{float(value):.1f}"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _cell(name: str, row: dict[str, Any]) -> str:
    """The row's ``name`` as text: the value, and ``± std`` where the row pools several seeds."""
    text, spread = _number(name, row.get(name)), row.get(std_column(name))
    return text if spread is None else f"{text} ± {_number(name, spread)}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table, one line per row: a run, or a configuration of :func:`group_seeds`,
    whose measurements read ``mean ± std`` (the mean alone for one seed)."""
    columns = columns_of(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(name, row) for name in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def error_of(row: dict[str, Any]) -> tuple[str, float] | None:
    """The row's error rate (a configuration's: the mean) for the Pareto plot: the first of
    :data:`ERROR_METRICS` it has."""
    for name in ERROR_METRICS:
        if row.get(name) not in (None, ""):
            return name, float(row[name])
    return None


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (lower is better in both)."""
    return [i for i, (x, y) in enumerate(points)
            if not any(a <= x and b <= y and (a, b) != (x, y) for a, b in points)]


def pareto_figure(rows: Sequence[dict[str, Any]]) -> Figure:
    """One panel per task: error rate against decoding ms/token, one point per configuration (the runs'
    seeds pooled by :func:`group_seeds`: the means, with ± std bars), each labelled, the front joined."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers or in CI
    import matplotlib.pyplot as plt

    groups = group_seeds(rows)
    tasks = sorted({row["task"] for row in groups})
    figure, axes = plt.subplots(1, len(tasks), figsize=(6.4 * len(tasks), 4.8), squeeze=False)
    for axis, task in zip(axes[0], tasks, strict=True):
        scored = [(row, error_of(row)) for row in groups if row["task"] == task]
        scored = [(row, error) for row, error in scored if error and row.get("ms_per_token") not in (None, "")]
        points = [(float(row["ms_per_token"]), error[1]) for row, error in scored]
        if points:
            axis.errorbar([x for x, _ in points], [y for _, y in points],
                          xerr=[row.get(std_column("ms_per_token")) or 0.0 for row, _ in scored],
                          yerr=[row.get(std_column(error[0])) or 0.0 for row, error in scored],
                          fmt="o", color="tab:blue", elinewidth=1, capsize=2)
        for (row, _), (x, y) in zip(scored, points, strict=True):
            label = str(row["run"]).removeprefix(f"ablate_{task}_")
            label += f" (n={row['seeds']})" if row["seeds"] > 1 else ""
            axis.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        front = sorted(points[i] for i in pareto_front(points))
        if front:
            axis.plot([x for x, _ in front], [y for _, y in front], color="tab:red", alpha=0.6, label="Pareto front")
            axis.legend(fontsize=8)
        metrics = sorted({error[0] for _, error in scored})
        shape = {(row.get("decode_batch"), row.get("decode_new_tokens")) for row, _ in scored}
        batch, tokens = next(iter(shape)) if len(shape) == 1 else ("?", "?")
        axis.set_xlabel(f"greedy decoding, ms per token (batch {batch}, {tokens} new tokens)")
        axis.set_ylabel(f"{', '.join(metrics)} (lower is better)")
        several = any(row["seeds"] > 1 for row, _ in scored)
        axis.set_title(f"{task} (mean ± std over seeds)" if several else task)
        axis.grid(True, alpha=0.3)
    figure.tight_layout()
    return figure


def _compare_errors(task: str, target: str, mine: dict[str, Any], theirs: dict[str, Any], needed: str,
                    within: float | None) -> dict[str, Any] | None:
    """A target on two configurations' error rates: ``mine`` at most ``within`` (relative) above
    ``theirs``; ``within=None`` asks only that ``mine`` be no worse, which a difference inside the spread
    between seeds also satisfies."""
    if not (error_of(mine) and error_of(theirs)):
        return None
    (metric, ours), (_, reference) = error_of(mine), error_of(theirs)
    excess = ours / reference - 1.0 if reference > 0 else float("inf") if ours > 0 else 0.0
    verdict = significant(mine, theirs, metric)
    met = excess <= within if within is not None else excess <= 0.0 or verdict is False
    return {"task": task, "target": target.format(metric=metric), "needed": needed,
            "measured": f"{_cell(metric, mine)} vs {_cell(metric, theirs)} ({excess:+.1%}, {SIGNIFICANCE[verdict]})",
            "met": met, "significant": verdict}


def targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The grid's targets, read off its configurations (by their experiment names, the runs' seeds pooled
    by :func:`group_seeds`) for every task that has them.

    Issue 6: the all-LSTM decoder's error rate within 10% (relative) of the all-attention decoder's at
    the same budget, and convert-then-fine-tune reaching 95% of the transformer's exact match (sequence
    accuracy) with at most 20% of its training steps. Issue 15, for the grid at a converged budget: the
    parameter-matched all-LSTM decoder within 5% of all-attention, and the equal-width all-LSTM decoder
    no worse than the parameter-matched one (more capacity should not lose). Each target is judged on the
    means; ``significant`` says whether the two configurations' difference stands out of the spread
    between seeds (:func:`significant`), and ``measured`` says it in words.

    Arms trained alike but for the grid's defaults share a suffix (``ablate_g2p_lstm_lr_1.5e-3`` against
    ``ablate_g2p_attention_lr_1.5e-3``), and each suffix is judged on its own, its name in brackets.
    """
    by_run = {row["run"]: row for row in group_seeds(rows)}
    arms = ("lstm", "attention", "param_matched", "convert")
    out = []
    for task in sorted({row["task"] for row in by_run.values()}):
        suffixes = sorted({run[len(f"ablate_{task}_{arm}"):] for run in by_run for arm in arms
                           if run.startswith(f"ablate_{task}_{arm}")}, key=lambda suffix: (suffix != "", suffix))
        for suffix in suffixes:
            lstm, attention, matched, converted = (by_run.get(f"ablate_{task}_{arm}{suffix}") for arm in arms)
            variant = f" [{suffix.lstrip('_')}]" if suffix else ""
            out.extend({**check, "target": check["target"] + variant}
                       for check in _grid_checks(task, lstm, attention, matched, converted))
    return out


def _grid_checks(task: str, lstm: dict | None, attention: dict | None, matched: dict | None,
                 converted: dict | None) -> list[dict[str, Any]]:
    """:func:`targets`'s checks among one suffix's arms (any of them may be missing)."""
    out = []
    comparisons = [(lstm, attention, "all-LSTM {metric} within 10% of all-attention's", "<= +10%", 0.10),
                   (matched, attention, "parameter-matched all-LSTM {metric} within 5% of all-attention's",
                    "<= +5%", 0.05),
                   (lstm, matched, "equal-width all-LSTM {metric} no worse than the parameter-matched one",
                    "<= +0%, or inside the seeds' spread", None)]
    for mine, theirs, target, needed, within in comparisons:
        if mine and theirs and (check := _compare_errors(task, target, mine, theirs, needed, within)):
            out.append(check)
    if converted and attention and attention.get("test/exact_match") is not None:
        theirs, share = attention["test/exact_match"], converted["steps"] / attention["steps"]
        reached = converted["test/exact_match"] / theirs if theirs > 0 else None  # nothing to reach
        verdict = significant(converted, attention, "test/exact_match")
        out.append({"task": task, "target": "convert-then-fine-tune exact match vs the transformer's",
                    "needed": ">= 95% with <= 20% of its steps",
                    "measured": f"{_cell('test/exact_match', converted)} vs {_cell('test/exact_match', attention)} "
                                f"({'n/a' if reached is None else f'{reached:.1%}'}, {SIGNIFICANCE[verdict]}) "
                                f"with {share:.0%} of its steps",
                    "met": None if reached is None else reached >= 0.95 and share <= 0.20,
                    "significant": verdict})
    return out


def conversions(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: each converted-then-fine-tuned configuration beside the same decoder trained from scratch
    for the same total steps, and beside the model it was converted from (found by decoder and steps), the
    runs' seeds pooled by :func:`group_seeds`; the last two columns give the converted error rate's
    difference from each and whether it stands out of the spread between seeds (:func:`significant`)."""

    def quality(row: dict[str, Any] | None) -> str:
        if row is None:
            return "-"
        error = error_of(row)
        parts = [f"{error[0]} {_cell(error[0], row)}"] if error else []
        if row.get("test/exact_match") is not None:
            parts.append(f"exact match {_cell('test/exact_match', row)}")
        return ", ".join(parts) or "-"

    def difference(row: dict[str, Any], other: dict[str, Any] | None) -> str:
        error = error_of(row)
        if other is None or error is None or other.get(error[0]) in (None, ""):
            return "-"
        return f"{error[1] - float(other[error[0]]):+.3f}, {SIGNIFICANCE[significant(row, other, error[0])]}"

    groups = group_seeds(rows)
    lines = []
    for row in groups:
        if not str(row.get("init", "")).startswith("converted from "):
            continue
        same = [other for other in groups if other["task"] == row["task"] and other["init"] == "scratch"]
        scratch = next((o for o in same if o["decoder"] == row["decoder"] and o["steps"] == row["total_steps"]), None)
        source = next((o for o in same if o["decoder"] == row["init"].removeprefix("converted from ")
                       and o["steps"] == row["total_steps"] - row["steps"]), None)
        lines.append(f"| {row['task']} | {row['decoder']} | {row['steps']} of {row['total_steps']} | {quality(row)} | "
                     f"{quality(scratch)} | {quality(source)} | {difference(row, scratch)} | "
                     f"{difference(row, source)} |")
    if not lines:
        return ""
    return ("\nConversion: fine-tuned after `hybrid convert` (steps: fine-tune of total) against the same decoder "
            "from scratch at equal total steps, and the model it was converted from; the error rate's difference "
            "(converted minus the other) and whether it exceeds the spread between seeds:\n\n"
            "| task | decoder | steps | converted + fine-tuned | scratch, equal total | converted from "
            "| vs scratch | vs converted from |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


def _csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as CSV: the table's columns, each measurement followed by its standard deviation where the
    rows have one, then every other field."""
    present = {key for row in rows for key in row}
    fields = [field for name in columns_of(rows) for field in (name, std_column(name)) if field in present]
    fields += sorted(present - set(fields))
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return table.getvalue()


def write_results(rows: Sequence[dict[str, Any]], directory: str | Path, note: str = "") -> list[Path]:
    """Write the runs' ``rows`` (as :func:`collect` gives them) into ``directory``.

    ``ablations.csv`` holds one row per run, every field, each seed its own row; ``ablations_grouped.csv``
    one row per configuration (:func:`group_seeds`: the means, their ``<name>_std`` and ``seeds``);
    ``ablations.md`` the ``note``, the configurations' table, the conversion table and the targets, then,
    where some configuration has several seeds, the runs' table; and ``pareto.png`` the configurations.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    grouped = group_seeds(rows)
    write_atomically(directory / "ablations.csv", _csv_text(rows))
    write_atomically(directory / "ablations_grouped.csv", _csv_text(grouped))
    # targets, conversions and the plot pool the seeds themselves; grouped rows pass through group_seeds.
    checks = "".join(f"- {check['task']}: {check['target']} ({check['needed']}): {check['measured']}, "
                     f"{VERDICTS[check['met']]}\n" for check in targets(grouped))
    pooled = ("One row per configuration: each measurement is the mean ± sample standard deviation over its "
              "`seeds` runs (the mean alone for one seed).\n\n")
    every_run = ("\nEvery run, one row per seed:\n\n" + markdown_table(rows)
                 if any(group["seeds"] > 1 for group in grouped) else "")
    write_atomically(directory / "ablations.md", (note + "\n\n" if note else "") + pooled + markdown_table(grouped)
                     + conversions(grouped) + ("\nTargets:\n\n" + checks if checks else "") + every_run)
    figure = pareto_figure(grouped)
    write_atomically(directory / "pareto.png", functools.partial(figure.savefig, dpi=120))
    return [directory / name for name in ("ablations.csv", "ablations_grouped.csv", "ablations.md", "pareto.png")]


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The rows of an ``ablations.csv`` (one per run) or an ``ablations_grouped.csv`` (one per configuration),
    numbers as numbers and empty cells as None."""

    def value(text: str) -> Any:
        if text == "":
            return None
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    with open(path, newline="") as handle:
        return [{key: value(text) for key, text in row.items()} for row in csv.DictReader(handle)]


def ablate(runs: Sequence[str | Path], output_dir: str | Path, *, batch_size: int, new_tokens: int,
           source_length: int, repeats: int, threads: int, include: Sequence[str | Path] = ()) -> list[Path]:
    """Collect the runs under ``runs`` (see :func:`collect`, whose decoding-speed settings the keywords are,
    timed on ``threads`` torch threads), add the rows of the ``ablations.csv`` files in ``include`` (runs
    collected earlier, whose folders are gone; a run collected now replaces an included row of the same
    name and seed), write the tables and the plot into ``output_dir`` (see :func:`write_results`), print
    the configurations' table."""
    torch.set_num_threads(threads)
    rows = collect(runs, batch=batch_size, new_tokens=new_tokens, source_length=source_length, repeats=repeats)
    collected = {_run_key(row["run"], row["seed"]) for row in rows}
    included = [row for path in include for row in read_results(path)
                if _run_key(row["run"], row["seed"]) not in collected]
    note = (f"Decoding: greedy, batch {batch_size}, {new_tokens} new tokens, source length "
            f"{source_length}, median of {repeats} repeats, CPU ({platform.processor() or platform.machine()}"
            f"), {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}.")
    if included:
        note += (f" {len(included)} of the runs were collected earlier and read from "
                 f"{', '.join(map(str, include))}, their speed as timed then.")
    rows = sorted(rows + included, key=lambda row: (row["task"], row["run"], row["seed"] or 0))
    paths = write_results(rows, output_dir, note)
    print(markdown_table(group_seeds(rows)))
    print("wrote " + ", ".join(map(str, paths)))
    return paths

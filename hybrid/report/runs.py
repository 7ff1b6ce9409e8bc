"""Find ``hybrid fit`` run folders and make each one a table row: its settings, test metrics, size and speeds.

A run folder holds ``.hydra/config.yaml``, ``checkpoints/last.ckpt`` and ``csv/metrics.csv``, and, where the
fit ran :class:`~hybrid.training.callbacks.TrainingClock`, its training time and tokens/s. Decoding speed is
timed here, with the benchmark's own loop (:func:`hybrid.bench.runner.measure_contenders`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import hydra.utils
import torch
from omegaconf import DictConfig, OmegaConf

from hybrid.config import ModelConfig
from hybrid.files import write_atomically
from hybrid.model import Seq2Seq
from hybrid.training.callbacks import CLOCK_FILE
from hybrid.training.checkpoint import read_checkpoint


def run_key(name: str, seed: Any) -> str:
    """What tells one run from another: its name and its seed (another seed of a name is another run)."""
    return f"{name} seed {seed}"


def _last(run: Path) -> Path:
    return run / "checkpoints" / "last.ckpt"


def _composed(run: Path) -> DictConfig:
    return OmegaConf.load(run / ".hydra" / "config.yaml")


def _run_name(run: Path, config: DictConfig) -> str:
    # The default name interpolates Hydra's runtime choices, which only a live run can resolve: the folder's
    # name stands in for it.
    if "name" not in config or OmegaConf.is_interpolation(config, "name") or not config.name:
        return run.name
    return str(config.name)


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
            config = _composed(run)
            key = run_key(_run_name(run, config), config.get("seed"))
            if key not in newest or checkpoint.stat().st_mtime > _last(newest[key]).stat().st_mtime:
                newest[key] = run
    return [newest[key] for key in sorted(newest)]


def pattern_label(mixers: Sequence[str]) -> str:
    """``["lstm"] * 3`` -> ``"lstm x3"``; a mixed stack lists its layers bottom-up."""
    return f"{mixers[0]} x{len(mixers)}" if len(set(mixers)) == 1 else ",".join(mixers)


def changed_options(config: ModelConfig) -> str | None:
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


def write_validation_curves(runs: str | Path, metric: str, output: str | Path) -> None:
    """``output``: every run's ``metric`` (a ``val/...`` column) at each validation, as a CSV of run (its
    folder under ``runs``), step (counted from 1) and value, to show how fast each configuration learns."""
    runs = Path(runs)
    lines = [f"run,step,{metric.replace('/', '_')}"]
    for metrics_csv in sorted(runs.rglob("csv/metrics.csv")):
        run = metrics_csv.parent.parent.relative_to(runs).as_posix()
        with open(metrics_csv, newline="") as handle:
            lines += [f"{run},{int(row['step']) + 1},{float(row[metric]):.4f}"
                      for row in csv.DictReader(handle) if row.get(metric)]
    write_atomically(Path(output), "\n".join(lines) + "\n")


def describe_run(run: Path) -> tuple[dict[str, Any], Seq2Seq]:
    """One table row of a run (without its decoding speed) and its model, built from ``last.ckpt``. The task
    is the one the run's data module declares (``task_name``), built from the run's own data config."""
    run_config = _composed(run)
    trained = read_checkpoint(_last(run))
    config = trained.config
    converted_from = config.extra.get("converted_from")
    row: dict[str, Any] = {
        "task": hydra.utils.instantiate(run_config.data).task_name, "run": _run_name(run, run_config),
        "decoder": pattern_label(config.decoder_mixers), "layers": f"{config.encoder_layers}-{config.decoder_layers}",
        "mixer_options": changed_options(config),
        "init": f"converted from {pattern_label(converted_from)}" if converted_from else "scratch",
        "steps": trained.global_step, "total_steps": trained.global_step + config.extra.get("converted_at_step", 0),
        "seed": run_config.get("seed"),
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
    and tokens/s, and decoding ms/token at ``batch`` x ``new_tokens``, sorted by task, name and seed.
    :func:`hybrid.report.seeds.group_seeds` pools the seeds."""
    paths = list(paths)
    runs = find_runs(paths)
    if not runs:
        raise FileNotFoundError(f"no run folders (.hydra/config.yaml + checkpoints/last.ckpt) under {paths}")
    rows, models = [], {}
    for run in runs:
        row, model = describe_run(run)
        # The decoder's self-mixing state for one sequence at the timed length: the LSTM's (h, c) or
        # the KV cache (cross-attention memory left out: every decoder has the same).
        src = torch.full((1, source_length), 3)
        state = model.start(src, max_steps=new_tokens)
        state.reserve(new_tokens)  # as large as it grows by the timed length
        row["state_bytes"] = state.mixer_nbytes
        rows.append(row)
        models[run_key(row["run"], row["seed"])] = model.eval()
    speeds = decoding_speed(models, batch, new_tokens, source_length, repeats)
    for row in rows:
        row.update(ms_per_token=speeds[run_key(row["run"], row["seed"])], decode_batch=batch,
                   decode_new_tokens=new_tokens)
    return sort_rows(rows)


def sort_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows in the table's order: by task, then run name, then seed."""
    return sorted(rows, key=lambda row: (row["task"], row["run"], row["seed"] or 0))

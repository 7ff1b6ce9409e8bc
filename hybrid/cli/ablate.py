"""``hybrid ablate``: gather ``hybrid fit`` runs into a table and a Pareto plot (:mod:`hybrid.ablation`)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from hybrid.ablation import ablate


def run_ablate(cfg: DictConfig) -> list[Path]:
    """Collect the runs under ``cfg.runs`` (a folder or a list of them), add the rows of ``cfg.include``
    (earlier ``ablations.csv`` files, one or a list), and write ``ablations.md``,
    ``ablations.csv`` (one row per run), ``ablations_grouped.csv`` (one row per configuration, its seeds
    pooled) and ``pareto.png`` into ``cfg.output_dir`` (the composed ``ablate.yaml``)."""
    runs = [cfg.runs] if isinstance(cfg.runs, str) else list(cfg.runs)
    include = [cfg.include] if isinstance(cfg.include, str) else list(cfg.include or [])
    return ablate(runs, cfg.output_dir, batch_size=cfg.batch_size, new_tokens=cfg.new_tokens,
                  source_length=cfg.source_length, repeats=cfg.repeats, threads=cfg.threads, include=include)

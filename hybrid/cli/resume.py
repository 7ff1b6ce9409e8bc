"""``hybrid fit ckpt_path=...`` continues in the run folder its checkpoint belongs to.

A checkpoint in a run folder's ``checkpoints/`` (``outputs/<name>/<time>/checkpoints/last.ckpt``, with the
run's ``.hydra/config.yaml`` beside it) resumes that run: its checkpoints, its metrics
(:class:`hybrid.training.loggers.ContinuingCSVLogger`) and its log (``fit.log``, appended to) stay in one
folder, and Lightning does not warn that the checkpoints' folder changed. Hydra makes the run folder before
the verb runs, so this is decided from the command line, as Hydra overrides: ``hydra.run.dir`` is the run's
folder, and this attempt's composed config and overrides (Hydra's record of a run) go to
``.hydra/resume_<time>/`` in it, leaving the run's own ``.hydra/`` as it was. A checkpoint anywhere else
starts a new run folder, as a fresh fit does.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from hybrid.cli.overrides import CONFIG_MODULE, read_command_line
from hybrid.training.builders import newest_last_checkpoint

RESUME_RECORD = ".hydra/resume_${now:%Y-%m-%d_%H-%M-%S}"  # this attempt's Hydra record, inside the run's


def resume_overrides(config_name: str, arguments: Sequence[str]) -> list[str]:
    """The Hydra overrides that make ``hybrid fit ARGUMENTS`` continue in the run folder of its ``ckpt_path``
    (``"last"``: the newest ``last.ckpt`` of the run name, as :func:`hybrid.training.builders.resolve_ckpt_path`
    finds it). None (an empty list) when the command line resumes nothing, runs nothing (``--cfg``,
    ``--help``), sweeps (``-m``: each job has a folder of its own), chooses ``hydra.run.dir`` or
    ``hydra.output_subdir`` itself, or names a checkpoint outside a run folder. A command line Hydra will
    refuse is left for Hydra to refuse in its own words. With the overrides, Lightning's warning that the
    checkpoint folder is not empty is silenced in this process: a resumed run's folder is meant to be full.
    """
    command_line = read_command_line(arguments)
    if command_line is None:
        return []
    flags, overrides = command_line
    if flags.multirun or flags.cfg or flags.help or flags.hydra_help or flags.info:
        return []
    keys = {override.key_or_group: override for override in overrides}
    if "hydra.run.dir" in keys or "hydra.output_subdir" in keys:
        return []
    ckpt_path = keys.get("ckpt_path")
    if ckpt_path is None or ckpt_path.is_sweep_override() or not isinstance(ckpt_path.value(), str):
        return []
    checkpoint = _newest_of_run_name(config_name, flags.overrides) if ckpt_path.value() == "last" \
        else Path(ckpt_path.value())
    run = None if checkpoint is None else run_folder_of(checkpoint)
    if run is None:
        return []
    # Where Lightning's checkpoint callbacks saved (an absolute path, as Hydra makes run.dir): the same string,
    # so they reload their state without "dirpath has changed"; and a run's checkpoint folder has files in it.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    return [f"hydra.run.dir={_quoted(os.path.abspath(run))}", f"hydra.output_subdir={RESUME_RECORD}"]


def run_folder_of(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint file belongs to (``<run>/checkpoints/<file>``, with ``<run>/.hydra/config.yaml``),
    or None."""
    run = checkpoint.parent.parent
    if checkpoint.is_file() and checkpoint.parent.name == "checkpoints" and (run / ".hydra" / "config.yaml").is_file():
        return run
    return None


def _newest_of_run_name(config_name: str, overrides: list[str]) -> Path | None:
    """The newest ``last.ckpt`` under the composed config's ``paths.run_dir`` (which holds the run name)."""
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        hydra_config.set_config(cfg)  # the run name reads the groups chosen through ${hydra:runtime.choices...}
        return newest_last_checkpoint(cfg.paths.run_dir)
    except (HydraException, OmegaConfBaseException):
        return None  # Hydra says what is wrong when it composes the same command line
    finally:
        hydra_config.cfg = previous


def _quoted(value: str) -> str:
    """``value`` as a quoted Hydra override value, so that spaces, commas or ``=`` in a path stay in it. Hydra
    reads a backslash as an escape only before a quote: those (and any at the end) are doubled."""
    escaped = re.sub(r"(\\*)'", lambda match: match.group(1) * 2 + "\\'", value)
    return "'" + re.sub(r"(\\+)$", lambda match: match.group(1) * 2, escaped) + "'"

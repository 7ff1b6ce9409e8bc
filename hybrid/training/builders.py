"""From a composed training config to the objects it describes: the model config, the module, the Trainer,
and the checkpoint that ``ckpt_path`` names.

The config is the one ``hybrid fit``, ``validate`` and ``test`` compose from ``configs/config.yaml``
(its ``model``, ``module``, ``trainer``, ``callbacks``, ``logger`` and ``paths`` nodes); tests and
notebooks compose it with Hydra's ``compose`` and call these too. Lightning is imported only when
a module or a Trainer is built, so reading a config needs neither it nor its start-up time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from hybrid.config import ModelConfig
from hybrid.tokenizer import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:
    from lightning import Trainer

    from hybrid.training import LitSeq2Seq, Seq2SeqDataModule


def model_config_from(model: DictConfig | dict[str, Any], vocab_size: int) -> ModelConfig:
    """The ``ModelConfig`` of the ``model`` config node, with the data's vocabulary and the fixed special ids."""
    fields = OmegaConf.to_container(model, resolve=True) if isinstance(model, DictConfig) else dict(model)
    return ModelConfig.from_dict({**fields, "vocab_size": vocab_size, "pad_id": PAD_ID, "bos_id": BOS_ID,
                                  "eos_id": EOS_ID}, partial=True)


def build_module(cfg: DictConfig, model_config: ModelConfig, datamodule: Seq2SeqDataModule) -> LitSeq2Seq:
    """``LitSeq2Seq`` with the ``module`` config node; ``module.metrics: null`` means the data module's own
    (``datamodule.metrics()``)."""
    from hybrid.training.module import LitSeq2Seq

    options = OmegaConf.to_container(cfg.module, resolve=True)
    if options.get("metrics") is None:
        options["metrics"] = list(datamodule.metrics())
    return LitSeq2Seq(model_config.to_dict(), tokenizer=datamodule.tokenizer, seed=cfg.seed, **options)


def build_trainer(cfg: DictConfig) -> Trainer:
    """The Trainer of the ``trainer`` node, with every callback of ``callbacks`` and logger of ``logger``
    (one set to null, e.g. ``callbacks.early_stopping=null``, is left out)."""
    callbacks = [instantiate(node) for node in (cfg.get("callbacks") or {}).values() if node is not None]
    loggers = [instantiate(node) for node in (cfg.get("logger") or {}).values() if node is not None]
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, _convert_="all")


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    """``cfg.ckpt_path``, with ``"last"`` resolved to this run folder's ``checkpoints/last.ckpt`` (where a
    resumed fit continues its run) or, failing that, to the newest of the runs of this name
    (:func:`newest_last_checkpoint` under ``paths.run_dir``)."""
    if cfg.ckpt_path != "last":
        return cfg.ckpt_path
    own = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    if own.is_file():
        return str(own)
    newest = newest_last_checkpoint(cfg.paths.run_dir)
    if newest is None:
        raise FileNotFoundError(f"ckpt_path=last: no checkpoints/last.ckpt in {cfg.paths.output_dir} or in the runs "
                                f"under {cfg.paths.run_dir}; give the checkpoint's path instead")
    return str(newest)


def newest_last_checkpoint(run_dir: str | Path) -> Path | None:
    """The ``<run>/checkpoints/last.ckpt`` under ``run_dir`` written most recently (file time, to the
    nanosecond; on a tie, the run folder named last, i.e. started last), or None if there is none.

    Newest by when it was written, not by step or by the run's start: a run started later, or trained
    further, may have been left alone since, while the run a user just stopped is the one to resume
    (a resumed fit writes into the run it continues, so its folder keeps its old start time).
    """
    candidates = Path(run_dir).glob("*/checkpoints/last.ckpt")
    return max(candidates, key=lambda path: (path.stat().st_mtime_ns, path.parent.parent.name), default=None)

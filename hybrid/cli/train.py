"""``hybrid fit``, ``hybrid validate`` and ``hybrid test``: Lightning's verbs on the composed ``config.yaml``.

Each builds the data module, the model and the Trainer from the config (:mod:`hybrid.training.builders`)
and hands them to Lightning, which is imported when one of these verbs runs (:func:`_import_lightning`).
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import TYPE_CHECKING

from hydra.utils import instantiate
from omegaconf import DictConfig

from hybrid.training.builders import build_module, build_trainer, model_config_from, resolve_ckpt_path
from hybrid.training.checkpoint import read_checkpoint
from hybrid.training.examples import print_examples

if TYPE_CHECKING:
    from lightning import Trainer

    from hybrid.config import ModelConfig
    from hybrid.training import Seq2SeqDataModule

logger = logging.getLogger(__name__)


def run_fit(cfg: DictConfig) -> Trainer:
    """Train as ``cfg`` (the composed ``config.yaml``) says; returns the Trainer, which holds the module.

    ``ckpt_path`` resumes a run (``"last"``: this run name's newest ``last.ckpt``); ``init_from``
    starts from a checkpoint's weights with a fresh optimiser. Either way the checkpoint's model
    config and vocabulary are used, so the weights fit. Then, if asked, tests the best checkpoint
    (``test_after_fit``) and prints example predictions (``print_examples``).
    """
    lightning = _import_lightning()
    if cfg.ckpt_path and cfg.init_from:
        raise ValueError("give ckpt_path (resume a run) or init_from (start from its weights), not both")
    lightning.seed_everything(cfg.seed, workers=True)
    datamodule: Seq2SeqDataModule = instantiate(cfg.data, _convert_="all")
    resume_from = resolve_ckpt_path(cfg)
    start = resume_from or cfg.init_from
    if start:
        trained = read_checkpoint(start)
        logger.info("the model config and vocabulary come from %s; model.* settings are not used", start)
        datamodule.tokenizer = trained.tokenizer
        model_config = trained.config
    else:
        model_config = model_config_from(cfg.model, datamodule.vocab_size)
    _fit_to_model(datamodule, model_config)
    module = build_module(cfg, model_config, datamodule)
    if cfg.init_from:
        module.model.load_state_dict(trained.state_dict)
    trainer = build_trainer(cfg)
    if resume_from:
        logger.info("resuming %s from step %d", resume_from, trained.global_step)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    if cfg.test_after_fit:
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        trainer.test(module, datamodule=datamodule, ckpt_path=best or None)
    if cfg.print_examples and trainer.is_global_zero:
        print_examples(module.model, datamodule, cfg.print_examples)
    return trainer


def run_validate(cfg: DictConfig) -> list[dict[str, float]]:
    """Score the checkpoint ``cfg.ckpt_path`` on the validation split of ``cfg.data``."""
    return _evaluate(cfg, "validate")


def run_test(cfg: DictConfig) -> list[dict[str, float]]:
    """Score the checkpoint ``cfg.ckpt_path`` on the test split of ``cfg.data``."""
    return _evaluate(cfg, "test")


def _evaluate(cfg: DictConfig, verb: str) -> list[dict[str, float]]:
    lightning = _import_lightning()
    path = resolve_ckpt_path(cfg)
    if not path:
        raise ValueError(f"hybrid {verb} needs ckpt_path=<checkpoint> (or ckpt_path=last), with the data "
                         "(or experiment) the model was trained on")
    lightning.seed_everything(cfg.seed, workers=True)
    trained = read_checkpoint(path)
    datamodule: Seq2SeqDataModule = instantiate(cfg.data, _convert_="all")
    datamodule.tokenizer = trained.tokenizer  # the ids the model was trained with
    _fit_to_model(datamodule, trained.config)
    module = build_module(cfg, trained.config, datamodule)
    module.model.load_state_dict(trained.state_dict)
    if cfg.optimize:
        from hybrid.fast import cache_dir_for

        module.model.optimize_for_inference(cfg.quantize, cache_dir=cache_dir_for(path))
    elif cfg.quantize:
        raise ValueError("quantize needs optimize=true: quantized weights are part of the fast path")
    trainer = build_trainer(cfg)
    results = getattr(trainer, verb)(module, datamodule=datamodule)
    if cfg.print_examples and trainer.is_global_zero:
        print_examples(module.model, datamodule, cfg.print_examples)
    return results


def _fit_to_model(datamodule: Seq2SeqDataModule, config: ModelConfig) -> None:
    # The decoder reads bos + target, so a target may be one token shorter than max_positions.
    datamodule.limit_lengths(config.max_positions, config.max_positions - 1)


def _import_lightning() -> ModuleType:
    import lightning

    # `import lightning` gives its logger a console handler of its own, yet its records also reach
    # the root logger that Hydra set up: without this, each line would print twice.
    if logging.getLogger().hasHandlers():
        for handler in list(logging.getLogger("lightning").handlers):
            logging.getLogger("lightning").removeHandler(handler)
    return lightning

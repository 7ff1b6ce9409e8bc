"""``hybrid fit``, ``hybrid validate`` and ``hybrid test``: Lightning's verbs on the composed ``config.yaml``.

Each builds the data module, the model and the Trainer from the config (:mod:`hybrid.training.builders`)
and hands them to Lightning, which is imported when one of these verbs runs (:func:`_import_lightning`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING

from hydra.utils import instantiate
from omegaconf import DictConfig

from hybrid.cli.generate import set_threads
from hybrid.training.builders import build_module, build_trainer, model_config_from, resolve_ckpt_path
from hybrid.training.checkpoint import read_checkpoint, read_trained_model
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
    (``test_after_fit``) and prints example predictions (``print_examples``). The console names the run
    folder at the start and the checkpoints at the end; a SIGTERM ends the process with status 143.
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
        module.model.generation_config = trained.generation_config  # e.g. a converted imported model's
    trainer = build_trainer(cfg)
    if trainer.is_global_zero:
        logger.info("run folder: %s", cfg.paths.output_dir)
    if resume_from:
        logger.info("resuming %s from step %d", resume_from, trained.global_step)
    with _exit_on_sigterm("fit"):
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    if trainer.is_global_zero:
        _report_checkpoints(trainer)
    if cfg.test_after_fit:
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if trainer.is_global_zero:
            logger.info("testing %s", best or "the weights the fit ended with (no best checkpoint)")
        with _exit_on_sigterm("fit"):
            trainer.test(module, datamodule=datamodule, ckpt_path=best or None)
        if trainer.is_global_zero:
            _report_results(trainer)
    if cfg.print_examples and trainer.is_global_zero:
        print_examples(module.model, datamodule, cfg.print_examples)
    return trainer


def run_validate(cfg: DictConfig) -> list[dict[str, float]]:
    """Score the checkpoint or model folder ``cfg.ckpt_path`` on the validation split of ``cfg.data``."""
    return _evaluate(cfg, "validate")


def run_test(cfg: DictConfig) -> list[dict[str, float]]:
    """Score the checkpoint or model folder ``cfg.ckpt_path`` on the test split of ``cfg.data``."""
    return _evaluate(cfg, "test")


def _evaluate(cfg: DictConfig, verb: str) -> list[dict[str, float]]:
    """Score a training checkpoint, or a model folder (``hybrid export``'s, or an imported model's with its
    transformers tokenizer and generation defaults), on the data module's split, encoded with the model's
    own tokenizer and special ids."""
    lightning = _import_lightning()
    path = resolve_ckpt_path(cfg)
    if not path:
        raise ValueError(f"hybrid {verb} needs ckpt_path=<checkpoint or model folder> (or ckpt_path=last), with "
                         "the data (or experiment) the model was trained on")
    lightning.seed_everything(cfg.seed, workers=True)
    trained = read_trained_model(path)
    datamodule: Seq2SeqDataModule = instantiate(cfg.data, _convert_="all")
    datamodule.tokenizer = trained.tokenizer  # the ids the model was trained with
    _fit_to_model(datamodule, trained.config)
    module = build_module(cfg, trained.config, datamodule)
    module.model.load_state_dict(trained.state_dict)
    module.model.generation_config = trained.generation_config  # an imported model decodes as its generate()
    set_threads(cfg.threads)
    if cfg.optimize:
        from hybrid.accel.onnx import cache_dir_for

        module.model.optimize_for_inference(cfg.quantize, cache_dir=cache_dir_for(path), threads=cfg.threads)
    elif cfg.quantize:
        raise ValueError("quantize needs optimize=true: quantized weights are part of the fast path")
    trainer = build_trainer(cfg)
    split = "test" if verb == "test" else "validation"
    if trainer.is_global_zero:
        logger.info("scoring %s on the %s split; run folder: %s", path, split, cfg.paths.output_dir)
    with _exit_on_sigterm(verb):
        results = getattr(trainer, verb)(module, datamodule=datamodule)
    if trainer.is_global_zero:
        _report_results(trainer)
    if cfg.print_examples and trainer.is_global_zero:
        print_examples(module.model, datamodule, cfg.print_examples)
    return results


@contextmanager
def _exit_on_sigterm(verb: str) -> Iterator[None]:
    """Turn Lightning's stop on SIGTERM, a SystemExit with status 0, into exit status 143 and a line that says
    so: a preempted job must not be reported a success."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from hybrid.training.callbacks import SIGTERM_EXIT_STATUS

    try:
        yield
    except SIGTERMException:
        logger.warning("hybrid %s: stopped by SIGTERM, exit status %d", verb, SIGTERM_EXIT_STATUS)
        raise SystemExit(SIGTERM_EXIT_STATUS) from None


def _report_checkpoints(trainer: Trainer) -> None:
    """Name last.ckpt and the best checkpoint (with its score), the files a user resumes, tests or exports."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    saved = [callback for callback in trainer.checkpoint_callbacks
             if isinstance(callback, ModelCheckpoint) and callback.best_model_path]
    # A checkpoint without a metric keeps only its newest file, last.ckpt.
    last = {callback.best_model_path for callback in saved if callback.monitor is None}
    for path in sorted(last):
        logger.info("last checkpoint: %s (step %s)", path, f"{trainer.global_step:,}")
    for callback in saved:
        if callback.monitor is not None:
            # Lightning forgets the best score when a run folder was moved or copied, then resumed.
            score = "score unknown" if callback.best_model_score is None else f"{float(callback.best_model_score):.4f}"
            logger.info("best checkpoint by %s (%s): %s", callback.monitor, score, callback.best_model_path)
    if not saved:
        logger.info("no checkpoint written")


def _report_results(trainer: Trainer) -> None:
    folders = [logger_.log_dir for logger_ in trainer.loggers if getattr(logger_, "log_dir", None)]
    if folders:
        logger.info("metrics written to %s", ", ".join(folders))


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

"""``hybrid fit``'s own Lightning callbacks: what makes a long fit safe to leave running, and its training clock.

Validation that keeps pace with a long epoch, a checkpoint when the job is preempted, and a console (or log
file) that says what the fit is doing are listed in ``configs/callbacks/default.yaml``; set one to null to
leave it out. Their lines go through the ``hybrid`` loggers, which the quiet console shows and the run's log
file keeps. :class:`TrainingClock`, which the ablation experiments add, writes the training time and tokens/s
that ``hybrid ablate`` tabulates.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, Timer
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from hybrid.files import write_atomically
from hybrid.validators import check_float, check_int

logger = logging.getLogger(__name__)

SIGTERM_EXIT_STATUS = 143  # 128 + SIGTERM, what a shell reports for a process the signal ended
CLOCK_FILE = "training_clock.json"  # TrainingClock's, in the run folder


class ValidationCadence(Callback):
    """Validate at least every ``every_n_steps`` optimiser steps, however long an epoch is.

    An epoch of at most ``every_n_steps`` steps validates at its end, as Lightning does by default. A longer
    epoch would leave hours between validations on a big dataset (and with them ``last.ckpt``, the best
    checkpoint and early stopping), so the fit validates at every ``every_n_steps``-th step instead,
    counted across epochs (Lightning's integer ``val_check_interval`` with ``check_val_every_n_epoch=None``),
    and at its last step, so that the final weights are scored and saved too. A Trainer set to validate
    another way (``trainer.val_check_interval`` or ``trainer.check_val_every_n_epoch`` overridden) is left
    as it is. Lightning refuses an integer ``val_check_interval`` longer than an epoch, which is why the
    rule is applied here, once the epoch's length is known.

    Under ``trainer.max_time`` the fit's last validation is inside the budget: Lightning validates the step
    the budget ran out at, after the budget (a minute or more on a big validation split), so the fit stops
    training early enough for that validation to fit. Its length is the last validation's, measured; before
    the first one, the sanity check's seconds per batch for the batches that greedy-decode
    (``module.decode_batches``, an over-estimate: an untrained model decodes to the length limit) and a third
    of a training step for the batches that only score the loss (a forward pass, without the backward's two).
    """

    def __init__(self, every_n_steps: int = 1000) -> None:
        check_int("every_n_steps", every_n_steps, at_least=1)
        self.every_n_steps = every_n_steps
        self.last_step: float | None = None  # the fit's planned last step, while the rule applies
        self.validation_began = self.step_began = 0.0
        self.step_seconds = 0.0  # the last training step's
        self.sanity_seconds_per_batch: float | None = None
        self.last_validation_seconds: float | None = None
        self.stopped_for_max_time = False

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.last_step = None
        self.stopped_for_max_time = False
        validates_per_epoch = trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1
        batches = self.every_n_steps * trainer.accumulate_grad_batches
        if not validates_per_epoch or trainer.num_training_batches <= batches:
            return
        trainer.check_val_every_n_epoch = None
        trainer.val_check_interval = trainer.val_check_batch = batches
        self.last_step = trainer.estimated_stepping_batches
        if trainer.is_global_zero:
            logger.info("an epoch is %d steps: validating every %d steps and at the last",
                        trainer.num_training_batches // trainer.accumulate_grad_batches, self.every_n_steps)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.step_began = time.monotonic()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.step_seconds = time.monotonic() - self.step_began
        if self.last_step is not None and trainer.global_step >= self.last_step:
            trainer.should_stop = True  # the fit ends here anyway; a stop request also validates this step
        timer = _timer(trainer)
        remaining = None if timer is None else timer.time_remaining()
        if remaining is None or remaining <= 0 or trainer.should_stop:
            return  # no budget, or Lightning stops here already
        validation = self._last_validation_estimate(trainer, pl_module)
        if validation is not None and remaining < validation + self.step_seconds:
            # Another step would leave too little of the budget to validate it: stop, and validate this one.
            trainer.should_stop = self.stopped_for_max_time = True
            if trainer.is_global_zero:
                logger.info("%s: stopping at step %s with %s left, for its last validation (about %s)",
                            _max_time(trainer), f"{trainer.global_step:,}", timedelta(seconds=round(remaining)),
                            timedelta(seconds=round(validation)))

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.validation_began = time.monotonic()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        seconds = time.monotonic() - self.validation_began
        if trainer.sanity_checking:
            self.sanity_seconds_per_batch = seconds / max(sum(trainer.num_sanity_val_batches), 1)
        elif trainer.state.fn == TrainerFn.FITTING:
            self.last_validation_seconds = seconds

    def _last_validation_estimate(self, trainer: Trainer, pl_module: LightningModule) -> float | None:
        """Seconds the validation of the step the fit stops at will take, or None where nothing says."""
        if self.last_validation_seconds is not None:
            return self.last_validation_seconds
        if self.sanity_seconds_per_batch is None or not trainer.num_val_batches:
            return None
        batches = sum(trainer.num_val_batches)
        decoded = batches if pl_module.hparams.get("decode_batches") is None else \
            min(pl_module.hparams["decode_batches"], batches)
        return decoded * self.sanity_seconds_per_batch + (batches - decoded) * self.step_seconds / 3


class CheckpointOnSigterm(Callback):
    """On SIGTERM, what a scheduler sends to preempt a job, save ``path`` (``last.ckpt``) and say how to resume.

    Lightning notices the signal at the end of the step it arrived in and stops the fit with a
    ``SIGTERMException``; this saves the weights, optimiser and loop state of that step, even before the first
    validation, so ``hybrid fit ckpt_path=last`` resumes there. ``hybrid fit`` then exits with status
    :data:`SIGTERM_EXIT_STATUS`, so the job is not reported a success.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        if trainer.sanity_checking or trainer.fast_dev_run or trainer.global_step == 0:
            return  # nothing trained yet: no checkpoint to write
        trainer.save_checkpoint(self.path)
        if trainer.is_global_zero:
            logger.warning("SIGTERM: saved %s at step %d; resume with `hybrid fit ... ckpt_path=last` (the same "
                           "run name) or ckpt_path=%s", self.path, trainer.global_step, self.path)


class ConsoleReport(Callback):
    """What a person reading the console or a log file learns during a fit.

    - A progress line every ``every_seconds`` of training: the step, the mean training loss since the last
      line, target tokens per second and the time left. Only where no progress bar draws: when the fit has
      none, or when standard output or error is not a terminal (a log file, ``nohup``, a scheduler, CI).
    - A line after each validation with its scores, and how many examples its sequence metrics decoded
      when that is a subset (``module.decode_batches``).
    - Why the fit stopped: early stopping, ``max_time``, ``max_steps`` or ``max_epochs``.
    """

    def __init__(self, every_seconds: float = 10.0) -> None:
        check_float("every_seconds", every_seconds, at_least=0, finite=False)  # infinity: no progress lines
        self.every_seconds = every_seconds
        self.enabled = False

    # ----- progress lines ------------------------------------------------------------

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        bar_draws = trainer.progress_bar_callback is not None and sys.stdout.isatty() and sys.stderr.isatty()
        self.enabled = trainer.is_global_zero and not bar_draws
        self._start_interval(pl_module)

    def _start_interval(self, pl_module: LightningModule) -> None:
        self.interval_begin = time.monotonic()
        self.interval_batches = 0
        # Summed on the device, read once a line: no host sync per step.
        self.interval_loss = torch.zeros((), device=pl_module.device)
        self.interval_tokens = torch.zeros((), dtype=torch.long, device=pl_module.device)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self.enabled:
            return
        # Lightning divides the loss it hands back by accumulate_grad_batches; undo it for the mean.
        self.interval_loss += outputs["loss"].detach() * trainer.accumulate_grad_batches
        self.interval_tokens += batch["tgt_out"].ne(pl_module.model.config.pad_id).sum()
        self.interval_batches += 1
        seconds = time.monotonic() - self.interval_begin
        if seconds >= self.every_seconds:
            logger.info(self._progress_line(trainer, seconds))
            self._start_interval(pl_module)

    def _progress_line(self, trainer: Trainer, seconds: float) -> str:
        seconds = max(seconds, 1e-9)
        step, planned = trainer.global_step, trainer.estimated_stepping_batches
        loss = float(self.interval_loss) / self.interval_batches
        tokens_per_second = int(self.interval_tokens) * trainer.world_size / seconds
        of = f" of {planned:,}" if planned != float("inf") else ""
        line = (f"step {step:,}{of} (epoch {_epochs(trainer):.2f}): loss {loss:.4f}, "
                f"{tokens_per_second:,.0f} target tokens/s")
        steps_per_second = self.interval_batches / trainer.accumulate_grad_batches / seconds
        left = [(planned - step) / steps_per_second] if planned != float("inf") else []
        timer = _timer(trainer)
        if timer is not None and timer.time_remaining() is not None:
            left.append(max(timer.time_remaining(), 0.0))  # max_time
        if left:
            line += f", {timedelta(seconds=round(min(left)))} left"
        return line

    # ----- validation lines ----------------------------------------------------------

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and trainer.is_global_zero and _max_time_is_up(trainer):
            logger.info("%s at step %s: validating it before the fit ends", _max_time_reached(trainer),
                        f"{trainer.global_step:,}")

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        scores = ", ".join(f"{name} {float(value):.4f}" for name, value in sorted(metrics.items())
                           if name.startswith("val/") and not name.endswith("examples"))
        where = f"validation at step {trainer.global_step:,}" if trainer.state.fn == TrainerFn.FITTING else "validation"
        line = f"{where}: {scores}"
        examples, decoded = metrics.get("val/examples"), metrics.get("val/decoded_examples")
        if examples is not None and decoded is not None and decoded < examples:
            line += (f" (sequence metrics on the first {int(decoded):,} of {int(examples):,} examples: "
                     f"module.decode_batches={pl_module.hparams.get('decode_batches')})")
        logger.info(line)
        if self.enabled:
            self._start_interval(pl_module)  # the next progress line times training only

    # ----- the end -------------------------------------------------------------------

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            logger.info("the fit stopped at step %s (epoch %.2f): %s", f"{trainer.global_step:,}", _epochs(trainer),
                        stop_reason(trainer))


class TrainingClock(Callback):
    """Time the training loop and count its tokens; writes :data:`CLOCK_FILE` into the run folder.

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


def _epochs(trainer: Trainer) -> float:
    """Epochs trained so far, in fractions of one: the progress a step count means on this data."""
    steps_per_epoch = trainer.num_training_batches / trainer.accumulate_grad_batches
    return trainer.global_step / steps_per_epoch if 0 < steps_per_epoch < float("inf") else float(trainer.current_epoch)


def stop_reason(trainer: Trainer) -> str:
    """Why a finished fit stopped, in words: Lightning says so only at INFO level, which the console hides."""
    for callback in trainer.callbacks:
        if isinstance(callback, EarlyStopping) and callback.stopping_reason != EarlyStoppingReason.NOT_STOPPED:
            return callback.stopping_reason_message or f"early stopping on {callback.monitor}"
    if any(isinstance(callback, ValidationCadence) and callback.stopped_for_max_time for callback in trainer.callbacks):
        return f"{_max_time(trainer)}: stopped early enough to validate its last step inside the budget"
    if _max_time_is_up(trainer):
        return _max_time_reached(trainer)
    if trainer.fast_dev_run:  # before max_steps, which it sets
        return "trainer.fast_dev_run"
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return f"trainer.max_steps={trainer.max_steps} reached"
    if trainer.max_epochs not in (None, -1) and trainer.current_epoch >= trainer.max_epochs:
        return f"trainer.max_epochs={trainer.max_epochs} reached"
    return "a callback asked it to stop (trainer.should_stop)"


def _timer(trainer: Trainer) -> Timer | None:
    """The Timer that Lightning adds for ``trainer.max_time``, if any."""
    return next((callback for callback in trainer.callbacks if isinstance(callback, Timer)), None)


def _max_time_is_up(trainer: Trainer) -> bool:
    """Whether ``trainer.max_time`` is set and spent: the Timer has asked the fit to stop, or will."""
    timer = _timer(trainer)
    return timer is not None and timer.time_remaining() is not None and timer.time_remaining() <= 0


def _max_time(trainer: Trainer) -> str:
    timer = _timer(trainer)
    budget = timer.time_elapsed() + timer.time_remaining()  # the configured max_time, through public calls
    return f"trainer.max_time={timedelta(seconds=round(budget))}"


def _max_time_reached(trainer: Trainer) -> str:
    return f"{_max_time(trainer)} reached"

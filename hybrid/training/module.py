"""LitSeq2Seq: the Lightning module that trains a Seq2Seq and scores what it decodes.

The network is a plain :class:`hybrid.Seq2Seq` held in ``self.model``; this wrapper adds the
loss, the optimiser and its schedule, and the metrics. Every stage shares ``_common_step``:
teacher-forced, label-smoothed cross-entropy plus token accuracy and perplexity. Validation
greedy-decodes its first ``decode_batches`` batches (a subset, for speed), test its whole split, and
both score the text against the references with the task's own sequence metrics. A checkpoint
carries the model config and the tokenizer as plain data, so it loads with
``torch.load(..., weights_only=True)`` and exports to a folder that needs neither Lightning nor
Hydra (see :mod:`hybrid.training.checkpoint`).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor, nn
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity

from hybrid.config import ModelConfig
from hybrid.model import Seq2Seq
from hybrid.tokenizer import Seq2SeqTokenizer
from hybrid.training.checkpoint import tokenizer_from_json_str
from hybrid.training.distill import (
    DistillOptions,
    distillation_kl,
    freeze_all_but_mixers,
    load_teacher,
    mixer_transfer_loss,
    swapped_layers,
)
from hybrid.training.scoring import CORPUS_METRICS, SEQUENCE_METRICS, closest_reference, greedy_length_limit
from hybrid.validators import check_choice, check_float, check_int

STAGES = ("train", "val", "test")
LR_SCHEDULES = ("cosine", "inverse_sqrt", "constant")

logger = logging.getLogger(__name__)


def lr_multiplier(step: int, schedule: str, warmup_steps: int, total_steps: float, min_lr_ratio: float) -> float:
    """The fraction of the peak learning rate to use at optimiser step ``step`` (0-based).

    A linear warm-up over ``warmup_steps`` reaches the peak, then ``schedule`` takes over:
    ``"cosine"`` decays to ``min_lr_ratio`` of the peak at ``total_steps`` and stays there,
    ``"inverse_sqrt"`` decays as ``sqrt(warmup_steps / step)`` (the original transformer's rule),
    and ``"constant"`` keeps the peak.
    """
    check_choice("lr_schedule", schedule, LR_SCHEDULES)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "inverse_sqrt":
        return math.sqrt(max(warmup_steps, 1) / max(step, warmup_steps, 1))
    progress = min(1.0, (step - warmup_steps) / max(1.0, total_steps - warmup_steps))  # cosine
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def capped_warmup_steps(warmup_steps: int, planned_steps: float, max_fraction: float | None) -> int:
    """``warmup_steps``, or ``max_fraction`` of the planned steps (rounded up) when that is fewer: a warm-up
    longer than the run would leave the learning rate short of its peak and the schedule never begun.
    ``max_fraction`` None, or an unknown length (``planned_steps`` infinite), leaves it as it is."""
    if max_fraction is None or not math.isfinite(planned_steps):
        return warmup_steps
    return min(warmup_steps, math.ceil(max_fraction * planned_steps))


class LitSeq2Seq(LightningModule):
    """Trains a :class:`hybrid.Seq2Seq` built from ``model_config`` (a ``ModelConfig.to_dict()``).

    ``tokenizer`` turns decoded ids back into text for the sequence metrics, and is saved in every
    checkpoint (and restored from it by ``load_from_checkpoint``). AdamW with decoupled weight
    decay on matrices and embeddings only; the learning rate follows :func:`lr_multiplier`, stepped
    after every optimiser step. Gradient clipping and mixed precision are the Trainer's
    (``gradient_clip_val``, ``precision``). Logged per stage: ``{stage}/loss`` (label-smoothed, per
    target token), ``{stage}/accuracy`` (next-token, padding ignored) and ``{stage}/perplexity``
    (from the unsmoothed cross-entropy); at validation and test also ``{stage}/<metric>`` for each
    name in ``metrics`` (keys of :data:`hybrid.training.scoring.SEQUENCE_METRICS`; a data module's ``metrics()``
    are its task's), over the greedy decoding of the first ``decode_batches`` validation batches (None: all)
    and of every test batch, with at most ``max_new_tokens`` new tokens (None: as
    :func:`hybrid.training.scoring.greedy_length_limit` says), and how many examples those scores and the loss
    cover (``{stage}/decoded_examples``, ``{stage}/examples``). The warm-up lasts ``warmup_steps``, at most
    ``max_warmup_fraction`` of the planned steps (None: no cap; see :func:`capped_warmup_steps`). ``seed``
    (None: torch's current one; a checkpoint keeps it) seeds each training batch's dropout together with the
    batch's step, so a resumed run is bit-identical to an uninterrupted one. ``distill`` (None, or no
    ``teacher`` in it: no teacher) trains against a teacher, as :class:`hybrid.training.distill.DistillOptions`
    says: its ``match: mixers`` trains only the swapped mixers (logged as ``train/mixer_mse``), its
    ``match: logits`` mixes the KL to the teacher into the training loss (``train/kl``; validation and test
    keep the plain cross-entropy, comparable across runs).
    """

    def __init__(
        self,
        model_config: dict[str, Any],
        tokenizer: Seq2SeqTokenizer | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.01,
        betas: Sequence[float] = (0.9, 0.98),
        warmup_steps: int = 500,
        max_warmup_fraction: float | None = 0.2,
        lr_schedule: str = "cosine",
        min_lr_ratio: float = 0.1,
        label_smoothing: float = 0.1,
        decode_batches: int | None = 8,
        max_new_tokens: int | None = None,
        metrics: Sequence[str] = ("exact_match",),
        seed: int | None = None,
        distill: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        check_choice("lr_schedule", lr_schedule, LR_SCHEDULES)
        unknown = sorted(set(metrics) - SEQUENCE_METRICS.keys())
        if unknown:
            raise ValueError(f"unknown sequence metrics {unknown}; allowed: {sorted(SEQUENCE_METRICS)}")
        check_int("decode_batches", decode_batches, at_least=0, optional=True)  # None: every batch
        check_float("max_warmup_fraction", max_warmup_fraction, above=0, at_most=1, optional=True)  # None: no cap
        # The tokenizer is kept out of the hyperparameters (loggers would print its whole vocabulary);
        # on_save_checkpoint stores it instead.
        # Not a hyperparameter: Lightning merges those with the data module's, which has a seed of its
        # own. The checkpoint carries it instead (on_save_checkpoint), so a resumed run keeps it.
        self.seed = torch.initial_seed() if seed is None else seed  # None: what seed_everything last set
        self.save_hyperparameters(ignore=["tokenizer", "seed"])
        self.model = Seq2Seq(ModelConfig.from_dict(model_config, partial=True))  # the fields it changes
        self.tokenizer = tokenizer
        self.distill = DistillOptions.from_dict(distill)
        if self.distill is not None:
            # Kept out of the module's children, so the teacher is neither saved in checkpoints nor trained.
            self.__dict__["teacher"] = load_teacher(self.distill.teacher, self.model.config)
            if self.distill.match == "mixers":
                self.transferred_layers = swapped_layers(self.teacher.config, self.model.config)
                freeze_all_but_mixers(self.model, self.transferred_layers)
        vocab_size, pad_id = self.model.config.vocab_size, self.model.config.pad_id
        # One metric object per stage and name, keyed "{stage}_{name}" (a key may not be "train",
        # which nn.Module already has).
        self.token_metrics = nn.ModuleDict()
        for stage in STAGES:
            self.token_metrics[f"{stage}_loss"] = MeanMetric()
            self.token_metrics[f"{stage}_accuracy"] = MulticlassAccuracy(vocab_size, average="micro",
                                                                         ignore_index=pad_id)
            self.token_metrics[f"{stage}_perplexity"] = Perplexity(ignore_index=pad_id)
        self.sequence_metric_names = list(metrics)
        self.sequence_metrics = nn.ModuleDict(
            {f"{stage}_{name}": SEQUENCE_METRICS[name]() for stage in ("val", "test") for name in metrics})
        # How many examples the loss and the sequence metrics cover, so that a score of a subset says so.
        self.example_counts = nn.ModuleDict({f"{stage}_{count}": SumMetric() for stage in ("val", "test")
                                             for count in ("examples", "decoded_examples")})

    # ----- steps ---------------------------------------------------------------------

    def _common_step(self, batch: dict[str, Any], stage: str) -> tuple[Tensor, Tensor]:
        """Teacher-forced loss and logits of one batch; updates and logs the stage's token-level metrics."""
        targets = batch["tgt_out"]  # (B, T)
        logits = self.model(batch["src_ids"], batch["tgt_in"], batch["src_mask"])  # (B, T, V)
        pad_id = self.model.config.pad_id
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id,
                               label_smoothing=self.hparams.label_smoothing)
        metrics = self.token_metrics
        # Calling (not just updating) the metrics gives the per-step values that training logs.
        metrics[f"{stage}_loss"](loss.detach(), targets.ne(pad_id).sum())
        metrics[f"{stage}_accuracy"](logits.detach().argmax(dim=-1), targets)
        metrics[f"{stage}_perplexity"](logits.detach().float(), targets)
        for name in ("loss", "accuracy", "perplexity"):
            self.log(f"{stage}/{name}", metrics[f"{stage}_{name}"], on_step=stage == "train", on_epoch=True,
                     prog_bar=name == "loss", batch_size=targets.shape[0])
        return loss, logits

    def on_train_batch_start(self, batch: dict[str, Any], batch_idx: int) -> None:
        # fairseq's rule: every random draw of a training batch (dropout) comes from a seed made of
        # the run's seed and the batch's place in training, never from what ran before it. A run
        # resumed from a checkpoint then draws exactly what the uninterrupted run drew, and ranks
        # of a DDP run draw different masks.
        micro_batch = batch_idx % self.trainer.accumulate_grad_batches
        place = (self.seed, self.global_step, micro_batch, self.global_rank)
        torch.manual_seed(int.from_bytes(hashlib.blake2b(repr(place).encode(), digest_size=8).digest(), "little"))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        if self.distill is None:
            return self._common_step(batch, "train")[0]
        if self.distill.match == "mixers":
            loss = mixer_transfer_loss(self.model, self.teacher, self.transferred_layers, batch)
            self.log("train/mixer_mse", loss.detach(), on_step=True, on_epoch=True, prog_bar=True,
                     batch_size=batch["tgt_out"].shape[0])
            return loss
        with torch.no_grad():
            teacher_logits = self.teacher(batch["src_ids"], batch["tgt_in"], batch["src_mask"])
        loss, logits = self._common_step(batch, "train")
        kl = distillation_kl(logits, teacher_logits, batch["tgt_out"].ne(self.model.config.pad_id),
                             self.distill.temperature)
        self.log("train/kl", kl.detach(), on_step=True, on_epoch=True, batch_size=batch["tgt_out"].shape[0])
        return (1 - self.distill.alpha) * loss + self.distill.alpha * kl

    def on_fit_start(self) -> None:
        if self.distill is not None:
            self.teacher.to(self.device).eval()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._common_step(batch, "val")
        limit = self.hparams.decode_batches
        # A subset, for speed: val/decoded_examples says how many of val/examples the sequence metrics cover.
        self._score_decoding(batch, "val", decode=limit is None or batch_idx < limit)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._common_step(batch, "test")
        self._score_decoding(batch, "test", decode=True)  # always the whole split: a test figure is the test set's

    def _count(self, stage: str, name: str, examples: int) -> None:
        counter = self.example_counts[f"{stage}_{name}"]
        counter.update(examples)
        self.log(f"{stage}/{name}", counter, on_step=False, on_epoch=True)

    def _score_decoding(self, batch: dict[str, Any], stage: str, decode: bool) -> None:
        """Count the batch's examples and, if ``decode``, greedy-decode them and update the sequence metrics."""
        examples = len(batch["src_ids"])
        self._count(stage, "examples", examples)
        if not self.sequence_metric_names:
            return
        self._count(stage, "decoded_examples", examples if decode else 0)
        if not decode:
            return
        if self.tokenizer is None:
            raise RuntimeError("LitSeq2Seq needs a tokenizer to score decoded text: pass tokenizer=..., "
                               "or set metrics=[]")
        predictions = self.tokenizer.batch_decode(self.decode(batch["src_ids"], batch["src_mask"]))
        every_reference = batch["tgt_references"]
        closest = [closest_reference(prediction, references)
                   for prediction, references in zip(predictions, every_reference, strict=True)]
        for name in self.sequence_metric_names:
            metric = self.sequence_metrics[f"{stage}_{name}"]
            metric.update(predictions, every_reference if name in CORPUS_METRICS else closest)
            self.log(f"{stage}/{name}", metric, on_step=False, on_epoch=True, batch_size=len(closest))

    def decode(self, src_ids: Tensor, src_mask: Tensor) -> Tensor:
        """Greedy decoding, (B, S) -> (B, L) ids, bounded by the ``max_new_tokens`` hyperparameter."""
        max_new_tokens = greedy_length_limit(src_ids.shape[1], self.model.config.max_positions,
                                             self.hparams.max_new_tokens)
        return self.model.generate(src_ids, src_mask, max_new_tokens=max_new_tokens)

    # ----- optimisation --------------------------------------------------------------

    def configure_optimizers(self) -> dict[str, Any]:
        # Decay weight matrices and embeddings, never biases or norm gains (nanoGPT's rule).
        # Frozen parameters (mixer transfer's) stay out, so nothing moves them, weight decay included.
        trained = [p for p in self.parameters() if p.requires_grad]
        decayed = [p for p in trained if p.dim() >= 2]
        undecayed = [p for p in trained if p.dim() < 2]
        hparams = self.hparams
        optimizer = AdamW([{"params": decayed, "weight_decay": hparams.weight_decay},
                           {"params": undecayed, "weight_decay": 0.0}],
                          lr=hparams.learning_rate, betas=tuple(hparams.betas))
        # The planned steps follow from the config and the data alone (never from a resume's starting
        # point), so a resumed run rebuilds the very schedule it was saved with.
        total_steps = self.trainer.estimated_stepping_batches
        if hparams.lr_schedule == "cosine" and not math.isfinite(total_steps):
            raise ValueError("module.lr_schedule=cosine needs a finite training length: set trainer.max_steps "
                             "or trainer.max_epochs, or use module.lr_schedule=inverse_sqrt")
        warmup_steps = capped_warmup_steps(hparams.warmup_steps, total_steps, hparams.max_warmup_fraction)
        if warmup_steps < hparams.warmup_steps and self.trainer.is_global_zero:
            logger.info("warm-up: %d steps, not module.warmup_steps=%d: module.max_warmup_fraction=%g of the %d "
                        "planned steps", warmup_steps, hparams.warmup_steps, hparams.max_warmup_fraction, total_steps)
        # A lambda (not a partial): LambdaLR saves no state for plain functions, keeping checkpoints plain data.
        scheduler = LambdaLR(optimizer, lambda step: lr_multiplier(
            step, hparams.lr_schedule, warmup_steps, total_steps, hparams.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ----- checkpoints ---------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the model config, the vocabulary and the generation defaults in the checkpoint, as plain data
        (no pickled objects)."""
        checkpoint["model_config"] = self.model.config.to_dict()
        checkpoint["tokenizer"] = None if self.tokenizer is None else self.tokenizer.to_json_str()
        checkpoint["training_seed"] = self.seed
        checkpoint["generation_config"] = self.model.generation_config  # an imported model's, through fine-tuning

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the tokenizer, the training seed and the generation defaults that :meth:`on_save_checkpoint`
        saved."""
        if checkpoint.get("tokenizer") is not None:
            self.tokenizer = tokenizer_from_json_str(checkpoint["tokenizer"], self.model.config)
        self.seed = checkpoint.get("training_seed", self.seed)
        self.model.generation_config = dict(checkpoint.get("generation_config") or {})

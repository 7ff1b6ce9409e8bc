"""Let the new mixers of a converted model catch up first: the copied weights stay frozen for K steps.

After ``hybrid convert`` the copied weights (embeddings, encoder, cross-attention, FFNs, norms)
already work together, while the swapped-in mixers are random. Training everything at once lets
the random mixers' large early gradients disturb what was copied; freezing the copied weights for
a few steps trains the new mixers against a fixed model first.
"""

from __future__ import annotations

import logging

from lightning import Callback, LightningModule, Trainer
from torch import nn

from hybrid.validators import check_int

logger = logging.getLogger(__name__)


class FreezeCopiedWeights(Callback):
    """Freeze every parameter that ``hybrid convert`` copied for the first ``steps`` optimiser steps.

    The new parameters are those named in ``model.config.extra["fresh_parameters"]`` (written by
    :func:`hybrid.convert.convert`); every other parameter of ``pl_module.model`` gets
    ``requires_grad=False`` until ``trainer.global_step`` reaches ``steps``, then trains again.
    A frozen parameter gets no gradient, so AdamW leaves it and its moments untouched, weight decay
    included. A model that was not converted has no copied weights, so nothing is frozen (with a
    warning); nor is anything frozen when the conversion added no parameters (attention -> linear
    keeps them all); ``steps=0`` does nothing.
    """

    def __init__(self, steps: int = 0) -> None:
        self.steps = check_int("steps", steps, at_least=0)
        self.frozen: list[nn.Parameter] = []

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_step >= self.steps:  # steps=0, or a resumed run already past them
            return
        model = pl_module.model
        fresh = model.config.extra.get("fresh_parameters")
        if fresh is None:
            logger.warning("freezing copied weights for %d steps: the model was not converted (no "
                           "fresh_parameters in its config), so every weight is new and none is frozen", self.steps)
            return
        if not fresh:  # e.g. attention -> linear: every weight carried over, so there is nothing to train alone
            logger.info("freezing copied weights for %d steps: the conversion added no new parameters, "
                        "so every weight trains from the start", self.steps)
            return
        names = dict(model.named_parameters())
        unknown = sorted(set(fresh) - names.keys())
        if unknown:
            raise ValueError(f"fresh_parameters names {unknown[:3]}, which the model does not have")
        self.frozen = [parameter for name, parameter in names.items()
                       if name not in fresh and parameter.requires_grad]
        for parameter in self.frozen:
            parameter.requires_grad_(False)
        logger.info("training only the %d new tensors for the first %d steps; %d copied tensors frozen",
                    len(fresh), self.steps, len(self.frozen))

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: object,
                             batch_idx: int) -> None:
        if self.frozen and trainer.global_step >= self.steps:
            logger.info("step %d: unfreezing the copied weights", trainer.global_step)
            self._unfreeze()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._unfreeze()  # a run shorter than `steps` still leaves a trainable model behind

    def _unfreeze(self) -> None:
        for parameter in self.frozen:
            parameter.requires_grad_(True)
        self.frozen = []

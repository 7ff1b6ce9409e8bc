"""Learning from a teacher: a converted model's new mixers first imitate the mixers they replaced, then the
whole student imitates the teacher's next-token distributions.

After ``hybrid convert`` swaps a trained model's decoder self-attention for another mixer, fine-tuning on a
user's (usually small) data alone tends to forget what the model learned in pretraining. Two losses bring
the original model in as a teacher (``module.distill``, read by :class:`hybrid.training.LitSeq2Seq`):

- ``match: mixers``, *mixer transfer* (LoLCATs' "attention transfer", Zhang et al., 2024, for any mixer):
  every swapped layer's new mixer reads the input the teacher's mixer read in that layer and learns, with a
  mean squared error, to give what it gave. The layers train side by side, each on the teacher's own
  inputs, and every other weight of the student is frozen: a first stage that needs no labels.
- ``match: logits``, token-level knowledge distillation (Hinton et al., 2015; Kim and Rush, 2016): the loss
  is ``(1 - alpha)`` times the usual cross-entropy plus ``alpha`` times the KL divergence from the teacher's
  next-token distribution to the student's, both at ``temperature`` (scaled by its square, so gradients
  keep their size whatever the temperature).

Sequence-level knowledge distillation, training on the teacher's own translations, is a data step instead:
``hybrid distill-data`` decodes the training sources with the teacher through the bulk job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.config import ModelConfig
from hybrid.convert import changed_layers
from hybrid.model import Seq2Seq
from hybrid.validators import check_choice, check_float

MATCHES = ("logits", "mixers")


@dataclasses.dataclass(frozen=True)
class DistillOptions:
    """``module.distill``: the teacher (a ``.ckpt`` or a model folder: ``hybrid import``'s, ``hybrid export``'s),
    what the student learns to match (``"logits"`` or ``"mixers"``), and for ``"logits"`` the weight ``alpha``
    of the KL term (``1 - alpha`` on the cross-entropy to the references) and the ``temperature``."""

    teacher: str
    match: str = "logits"
    alpha: float = 0.5
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.teacher, str) or not self.teacher:
            raise ValueError(f"module.distill.teacher must be the path of a checkpoint or model folder, "
                             f"got {self.teacher!r}")
        check_choice("module.distill.match", self.match, MATCHES)
        check_float("module.distill.alpha", self.alpha, at_least=0, at_most=1)
        check_float("module.distill.temperature", self.temperature, above=0)

    @classmethod
    def from_dict(cls, data: object) -> DistillOptions | None:
        """The options of the ``module.distill`` config node; None where it is null or names no teacher."""
        allowed = [field.name for field in dataclasses.fields(cls)]
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError(f"module.distill must be null or a dict with {allowed}, got {data!r}")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise ValueError(f"module.distill: unknown options {unknown}; allowed: {allowed}")
        return None if data.get("teacher") is None else cls(**data)


def load_teacher(path: str, student: ModelConfig) -> Seq2Seq:
    """The teacher at ``path`` in eval mode, with no parameter that trains; it must share the student's
    vocabulary and special ids (their logits and targets are compared token for token)."""
    from hybrid.training.checkpoint import read_trained_model

    teacher = read_trained_model(path).build()
    mismatched = [name for name in ("vocab_size", "pad_id", "bos_id", "eos_id")
                  if getattr(teacher.config, name) != getattr(student, name)]
    if mismatched:
        found = ", ".join(f"{name} {getattr(teacher.config, name)} vs {getattr(student, name)}" for name in mismatched)
        raise ValueError(f"module.distill.teacher={path} does not share the student's vocabulary ({found}): "
                         "distil from the model the student was converted from, or one trained on its tokenizer")
    teacher.requires_grad_(False)
    return teacher


def distillation_kl(student_logits: Tensor, teacher_logits: Tensor, mask: Tensor, temperature: float) -> Tensor:
    """``temperature**2 * KL(p_teacher || p_student)``, both softmaxes at ``temperature``, averaged over the
    target tokens where ``mask`` (B, T) is true; logits are (B, T, V)."""
    student_log_probs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    per_token = F.kl_div(student_log_probs, teacher_log_probs, log_target=True, reduction="none").sum(dim=-1)
    return temperature**2 * per_token[mask].mean()


def swapped_layers(teacher: ModelConfig, student: ModelConfig) -> list[int]:
    """The decoder layers whose mixer the student changed (kind or options): what mixer transfer trains."""
    shape = ("d_model", "decoder_layers", "vocab_size", "pre_norm")
    differing = [name for name in shape if getattr(teacher, name) != getattr(student, name)]
    if differing:
        raise ValueError(f"mixer transfer needs the teacher the student was converted from: they differ in "
                         f"{differing}, beyond their mixers")
    layers = changed_layers(teacher, student)
    if not layers:
        raise ValueError(f"mixer transfer: the student's decoder mixers {student.decoder_mixers} are the teacher's; "
                         "swap some with hybrid convert first, or distil with module.distill.match=logits")
    return layers


@contextmanager
def recorded_mixers(model: Seq2Seq, layers: list[int]) -> Iterator[dict[int, tuple[Tensor, Tensor]]]:
    """While open, every parallel forward of ``model`` records each listed decoder layer's mixer input and
    output (both (B, T, D)) into the yielded dict, keyed by layer."""
    records: dict[int, tuple[Tensor, Tensor]] = {}

    def hook(layer: int):
        def record(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            records[layer] = (inputs[0], output)
        return record

    handles = [model.decoder_layers[i].mixer.register_forward_hook(hook(i)) for i in layers]
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


def mixer_transfer_loss(student: Seq2Seq, teacher: Seq2Seq, layers: list[int], batch: dict[str, Any]) -> Tensor:
    """The mean squared error between each swapped mixer of ``student`` and the teacher's mixer of that layer,
    both reading the teacher's input to it, over the batch's real target positions; summed over ``layers``.

    Only the student's mixers run: the teacher's forward (no gradient) supplies every layer's input, so each
    new mixer learns to stand in for the old one where the old one sat, and nothing else gets a gradient.
    """
    with torch.no_grad(), recorded_mixers(teacher, layers) as records:
        teacher(batch["src_ids"], batch["tgt_in"], batch["src_mask"])
    real = batch["tgt_out"].ne(student.config.pad_id)  # (B, T): the positions that predict a token
    loss = 0.0
    for layer in layers:
        inputs, target = records[layer]
        output = student.decoder_layers[layer].mixer(inputs)
        loss = loss + F.mse_loss(output[real], target[real])
    return loss


def freeze_all_but_mixers(student: Seq2Seq, layers: list[int]) -> list[str]:
    """Let only the mixers of ``layers`` train (``requires_grad``); returns the names of what trains."""
    trained = tuple(f"decoder_layers.{i}.mixer." for i in layers)
    names = []
    for name, parameter in student.named_parameters():
        parameter.requires_grad_(name.startswith(trained))
        if parameter.requires_grad:
            names.append(name)
    return names

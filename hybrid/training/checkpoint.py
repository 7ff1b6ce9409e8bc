"""Trained models without Lightning: read and write training checkpoints, load a model for inference, export.

A ``LitSeq2Seq`` checkpoint holds the weights under ``state_dict`` (prefixed ``model.``), the
``ModelConfig`` as a plain dict under ``model_config`` and the tokenizer as a JSON string under
``tokenizer``, so it is read with ``torch.load(..., weights_only=True)``, never through pickle.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import Tensor

from hybrid.config import ModelConfig
from hybrid.files import write_atomically
from hybrid.model import CONFIG_FILE, Seq2Seq
from hybrid.training.tokenizer import Seq2SeqTokenizer

_MODEL_PREFIX = "model."  # LitSeq2Seq keeps the network in self.model


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writes (``last.ckpt``, the best ones, ``trainer.save_checkpoint``), made atomic.

    Lightning's own ``TorchCheckpointIO`` serialises to memory and then writes over the target in
    place, so a kill during that write leaves a truncated ``last.ckpt`` and no previous one. Here the
    checkpoint goes to a temporary file beside the target, is fsynced and renamed over it
    (:func:`hybrid.files.write_atomically`): a reader sees the old checkpoint or the whole new one.
    Remote targets (``s3://`` and the like) keep Lightning's write, as their stores replace objects
    whole. Set in ``configs/trainer/default.yaml`` as the Trainer's plugin.
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        protocol = get_filesystem(path).protocol  # "file", or ("file", "local"), for a local path
        if storage_options is not None or "file" not in ((protocol,) if isinstance(protocol, str) else protocol):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda temporary: torch.save(checkpoint, temporary))


@dataclass
class TrainedModel:
    """What a training checkpoint holds for inference: the config, the vocabulary and the weights."""

    config: ModelConfig
    tokenizer: Seq2SeqTokenizer
    state_dict: dict[str, Tensor]
    global_step: int

    def build(self, device: str | torch.device = "cpu") -> Seq2Seq:
        """The model with these weights, on ``device``, in eval mode."""
        model = Seq2Seq(self.config)
        model.load_state_dict(self.state_dict, strict=True)
        return model.to(device).eval()


def read_checkpoint(path: str | os.PathLike) -> TrainedModel:
    """Read a ``LitSeq2Seq`` checkpoint with ``weights_only=True`` (plain data and tensors only)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint file (a .ckpt written by hybrid fit)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file: the zip reader's RuntimeError, EOFError, OSError...
        raise ValueError(f"{path} is not a readable checkpoint (truncated or not written by torch.save): "
                         f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from error
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path} holds a {type(checkpoint).__name__}, not a training checkpoint")
    missing = [key for key in ("state_dict", "model_config", "tokenizer") if checkpoint.get(key) is None]
    if missing:
        raise ValueError(f"{path} lacks {missing}: it was not written by hybrid's LitSeq2Seq with a tokenizer")
    weights = {key.removeprefix(_MODEL_PREFIX): value for key, value in checkpoint["state_dict"].items()
               if key.startswith(_MODEL_PREFIX)}
    return TrainedModel(ModelConfig.from_saved(checkpoint["model_config"]),
                        Seq2SeqTokenizer.from_json_str(checkpoint["tokenizer"]),
                        weights, checkpoint.get("global_step", 0))


def write_checkpoint(model: Seq2Seq, tokenizer: Seq2SeqTokenizer, path: str | os.PathLike) -> Path:
    """Write ``model`` and ``tokenizer`` as a ``LitSeq2Seq`` checkpoint holds them (what :func:`read_checkpoint`
    and ``hybrid fit init_from=...`` read: plain data and tensors, at step 0), atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {"state_dict": {f"{_MODEL_PREFIX}{key}": value for key, value in model.state_dict().items()},
                  "model_config": model.config.to_dict(), "tokenizer": tokenizer.to_json_str(), "global_step": 0}
    return write_atomically(path, functools.partial(torch.save, checkpoint))


def load_for_inference(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[Seq2Seq, Seq2SeqTokenizer]:
    """The model (eval mode, on ``device``) and tokenizer from a training checkpoint file or an
    exported folder (see :func:`export_checkpoint`)."""
    path = Path(path)
    if path.is_dir():
        if not (path / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{path} is a folder without {CONFIG_FILE}: expected one written by "
                                    "`hybrid export`, or give a .ckpt file")
        return Seq2Seq.from_pretrained(path, device=device), Seq2SeqTokenizer.load(path)
    trained = read_checkpoint(path)
    return trained.build(device), trained.tokenizer


def export_checkpoint(checkpoint_path: str | os.PathLike, directory: str | os.PathLike) -> Path:
    """Write a training checkpoint's model (``save_pretrained``) and tokenizer into ``directory``.

    The folder loads with ``Seq2Seq.from_pretrained(directory)`` and
    ``Seq2SeqTokenizer.load(directory)``, with neither Lightning nor Hydra installed.
    """
    model, tokenizer = load_for_inference(checkpoint_path)
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save(directory)
    return directory

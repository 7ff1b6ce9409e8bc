"""Trained models without Lightning: read and write training checkpoints, load a model for inference, export.

A ``LitSeq2Seq`` checkpoint holds the weights under ``state_dict`` (prefixed ``model.``), the
``ModelConfig`` as a plain dict under ``model_config`` and the tokenizer as a JSON string under
``tokenizer``, so it is read with ``torch.load(..., weights_only=True)``, never through pickle.

A model folder (``save_pretrained``, ``hybrid export``, ``hybrid import``) holds its tokenizer beside the
weights: hybrid's own tokenizer files, or an imported model's transformers tokenizer in ``tokenizer/``.
:func:`load_tokenizer` and :func:`save_tokenizer` are the one place that tells them apart.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hybrid.config import ModelConfig
from hybrid.files import write_atomically
from hybrid.hf import TOKENIZER_FOLDER
from hybrid.hf.tokenizer import PretrainedTokenizer
from hybrid.model import CONFIG_FILE, Seq2Seq
from hybrid.tokenizer import Seq2SeqTokenizer

AnyTokenizer = Seq2SeqTokenizer | PretrainedTokenizer
_NATIVE_TOKENIZER_FILE = "levels.json"  # one of the files Seq2SeqTokenizer.save writes

_MODEL_PREFIX = "model."  # LitSeq2Seq keeps the network in self.model


@dataclass
class TrainedModel:
    """What a training checkpoint (or a model folder) holds for inference: the config, the vocabulary, the
    weights and the model's own generation defaults (an imported model's; none for a trained one)."""

    config: ModelConfig
    tokenizer: AnyTokenizer
    state_dict: dict[str, Tensor]
    global_step: int
    generation_config: dict[str, Any] = field(default_factory=dict)

    def build(self, device: str | torch.device = "cpu") -> Seq2Seq:
        """The model with these weights and generation defaults, on ``device``, in eval mode."""
        model = Seq2Seq(self.config)
        model.load_state_dict(self.state_dict, strict=True)
        model.generation_config = dict(self.generation_config)
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
    config = ModelConfig.from_saved(checkpoint["model_config"])
    return TrainedModel(config, tokenizer_from_json_str(checkpoint["tokenizer"], config), weights,
                        checkpoint.get("global_step", 0), checkpoint.get("generation_config") or {})


def read_trained_model(path: str | os.PathLike) -> TrainedModel:
    """A training checkpoint (:func:`read_checkpoint`) or a model folder (:func:`load_for_inference`: an
    exported model, or an imported one with its own tokenizer and generation defaults) as a :class:`TrainedModel`."""
    if not Path(path).is_dir():
        return read_checkpoint(path)
    model, tokenizer = load_for_inference(path)
    return TrainedModel(model.config, tokenizer, model.state_dict(), 0, model.generation_config)


def tokenizer_from_json_str(data: str, config: ModelConfig) -> AnyTokenizer:
    """The tokenizer a checkpoint keeps as ``to_json_str`` wrote it: hybrid's own, or an imported model's
    transformers tokenizer (checked against ``config``, the checkpoint's model)."""
    if PretrainedTokenizer.is_json_str(data):
        return PretrainedTokenizer.from_json_str(data, config)
    return Seq2SeqTokenizer.from_json_str(data)


def load_tokenizer(directory: str | os.PathLike, config: ModelConfig) -> AnyTokenizer:
    """The tokenizer of a model folder: hybrid's own files (``hybrid export``), else the transformers tokenizer
    in its ``tokenizer/`` subfolder (``hybrid import``), checked against ``config``, the folder's model."""
    directory = Path(directory)
    if (directory / _NATIVE_TOKENIZER_FILE).is_file():
        return Seq2SeqTokenizer.load(directory)
    if (directory / TOKENIZER_FOLDER).is_dir():
        return PretrainedTokenizer.load(directory / TOKENIZER_FOLDER, config)
    raise FileNotFoundError(f"{directory} has no tokenizer: neither hybrid's tokenizer files "
                            f"({_NATIVE_TOKENIZER_FILE}, source_tokenizer.json, target_tokenizer.json: hybrid export "
                            f"writes them) nor a {TOKENIZER_FOLDER}/ folder (hybrid import writes one)")


def save_tokenizer(tokenizer: AnyTokenizer, directory: str | os.PathLike) -> None:
    """Write ``tokenizer`` into the model folder ``directory``, where :func:`load_tokenizer` finds it."""
    directory = Path(directory)
    tokenizer.save(directory / TOKENIZER_FOLDER if isinstance(tokenizer, PretrainedTokenizer) else directory)


def write_checkpoint(model: Seq2Seq, tokenizer: AnyTokenizer, path: str | os.PathLike) -> Path:
    """Write ``model`` and ``tokenizer`` as a ``LitSeq2Seq`` checkpoint holds them (what :func:`read_checkpoint`
    and ``hybrid fit init_from=...`` read: plain data and tensors, at step 0), atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {"state_dict": {f"{_MODEL_PREFIX}{key}": value for key, value in model.state_dict().items()},
                  "model_config": model.config.to_dict(), "tokenizer": tokenizer.to_json_str(), "global_step": 0,
                  "generation_config": model.generation_config}
    return write_atomically(path, functools.partial(torch.save, checkpoint))


def load_for_inference(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[Seq2Seq, AnyTokenizer]:
    """The model (eval mode, on ``device``) and tokenizer from a training checkpoint file, an exported
    folder (see :func:`export_checkpoint`) or an imported one (``hybrid import``; see :func:`load_tokenizer`)."""
    path = Path(path)
    if path.is_dir():
        if not (path / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"{path} is a folder without {CONFIG_FILE}: expected one written by "
                                    "`hybrid export` or `hybrid import`, or give a .ckpt file")
        model = Seq2Seq.from_pretrained(path, device=device)
        return model, load_tokenizer(path, model.config)
    trained = read_checkpoint(path)
    return trained.build(device), trained.tokenizer


def export_checkpoint(checkpoint_path: str | os.PathLike, directory: str | os.PathLike) -> Path:
    """Write a training checkpoint's model (``save_pretrained``) and tokenizer into ``directory``.

    The folder loads with ``Seq2Seq.from_pretrained(directory)`` and :func:`load_tokenizer`
    (``Seq2SeqTokenizer.load(directory)`` for hybrid's own), with neither Lightning nor Hydra installed.
    """
    model, tokenizer = load_for_inference(checkpoint_path)
    directory = Path(directory)
    model.save_pretrained(directory)
    save_tokenizer(tokenizer, directory)
    return directory

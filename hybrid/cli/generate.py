"""``hybrid generate``: decode every line of a file or of standard input as a bulk job (:mod:`hybrid.bulk`).

Generation options may be given bare (``num_beams=4``) as well as under their node
(``generation.num_beams=4``): :func:`qualify_generation_option` adds the node before Hydra reads them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig, OmegaConf

from hybrid.generation.config import GenerationConfig
from hybrid.training.checkpoint import load_for_inference
from hybrid.validators import check_int

if TYPE_CHECKING:
    from hybrid.bulk import BulkJob
    from hybrid.model import Seq2Seq
    from hybrid.training.checkpoint import AnyTokenizer

GENERATION_OPTIONS = GenerationConfig.command_line_options()  # each field says whether a command line can set it


def run_generate(cfg: DictConfig) -> bool:
    """Decode every source of ``cfg.input`` (a file, or standard input) into ``cfg.output`` (a file, or
    standard output), one line per source in input order, as a bulk job (:mod:`hybrid.bulk`):
    bucketed, batched by a token budget, refilled, resumable, split by ``shard=i/n`` or over DDP ranks
    (``strategy=ddp devices=N``). Returns whether the output is complete."""
    from hybrid.bulk import run_bulk, run_bulk_ddp

    if cfg.strategy is not None and not cfg.resume:
        raise ValueError("resume=false would let every rank empty the work folder: delete it before the run")
    model, tokenizer, job = load_bulk_job(cfg, cfg.on_error)
    options = dict(input_format=cfg.input_format, shard=cfg.shard, work_dir=cfg.work_dir,
                   keep_shards=cfg.keep_shards, progress=cfg.progress, fingerprint=decoder_fingerprint(cfg))
    if cfg.strategy is None:
        return run_bulk(model, tokenizer, cfg.input, cfg.output, job, resume=cfg.resume, **options)
    trainer = dict(strategy=cfg.strategy, devices=cfg.devices, num_nodes=cfg.num_nodes,
                   accelerator="cpu" if next(model.parameters()).device.type == "cpu" else "gpu")
    return run_bulk_ddp(model, tokenizer, cfg.input, cfg.output, job, trainer, **options)


def load_bulk_job(cfg: DictConfig, on_error: str) -> tuple[Seq2Seq, AnyTokenizer, BulkJob]:
    """The model and tokenizer of ``cfg.ckpt_path`` on ``cfg.device`` (``auto``: cuda when available), and the
    bulk job of a verb's config: its ``generation`` node laid over the model's own generation defaults, and
    its batching keys (``max_tokens``, ``batch_size``, ``window``, ``refill``, ``shard_size``, ``seed``), with
    ``on_error`` for undecodable lines. The job is validated as soon as the model's defaults are known, so a
    bad option fails before the fast path (``cfg.optimize``, int8 weights with ``cfg.quantize``) is built and
    cached, and before any input is read."""
    from hybrid.bulk import BulkJob

    if cfg.quantize and not cfg.optimize:
        raise ValueError("quantize needs optimize=true: quantized weights are part of the fast path")
    set_threads(cfg.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    model, tokenizer = load_for_inference(cfg.ckpt_path, device)
    job = BulkJob.for_model(model, generation_options(cfg.generation), max_tokens=cfg.max_tokens,
                            max_batch_size=cfg.batch_size, window=cfg.window, refill=cfg.refill,
                            shard_size=cfg.shard_size, seed=cfg.seed, on_error=on_error)
    if cfg.optimize:
        from hybrid.accel.onnx import cache_dir_for

        model.optimize_for_inference(cfg.quantize, cache_dir=cache_dir_for(cfg.ckpt_path), threads=cfg.threads)
    return model, tokenizer, job


def set_threads(threads: int | None) -> None:
    """A decoding verb's ``threads``: torch's intra-op threads, and so the fast path's (ONNX Runtime's, which
    reads torch's); None leaves torch's default."""
    if check_int("threads", threads, at_least=1, optional=True) is not None:
        torch.set_num_threads(threads)


def decoder_fingerprint(cfg: DictConfig) -> dict:
    """What a rerun of a bulk job must share beyond the model's weights for its finished shards to be reused."""
    return {"ckpt_path": str(Path(cfg.ckpt_path).resolve()), "optimize": cfg.optimize, "quantize": cfg.quantize}


def generation_options(node: DictConfig) -> dict:
    """The options a ``generation`` node sets: a null one is left to the model's own defaults (its
    ``generation_config.json``), else to generate()'s, as ``configs/generation/model.yaml`` says."""
    return {key: value for key, value in OmegaConf.to_container(node, resolve=True).items() if value is not None}


def qualify_generation_option(override: str) -> str:
    """``num_beams=4`` -> ``generation.num_beams=4``: generation options may be given without their node."""
    match = re.fullmatch(r"([+~]{0,2})(\w+)(=.*)?", override, flags=re.S)
    if match and match.group(2) in GENERATION_OPTIONS:
        prefix, key, rest = match.groups()
        return f"{prefix}generation.{key}{rest or ''}"
    return override

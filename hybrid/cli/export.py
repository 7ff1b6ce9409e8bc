"""``hybrid export``: a training checkpoint as a folder that loads with neither Lightning nor Hydra."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from hybrid.training.checkpoint import export_checkpoint


def run_export(cfg: DictConfig) -> Path:
    """Write the model and tokenizer of ``cfg.ckpt_path`` into the folder ``cfg.output`` (the composed
    ``export.yaml``); it loads with ``Seq2Seq.from_pretrained`` and ``Seq2SeqTokenizer.load``."""
    directory = export_checkpoint(cfg.ckpt_path, cfg.output)
    print(f"wrote {directory}: load it with Seq2Seq.from_pretrained and Seq2SeqTokenizer.load")
    return directory

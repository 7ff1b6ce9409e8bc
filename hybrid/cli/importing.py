"""``hybrid import``: a transformers encoder-decoder as a hybrid model folder (:mod:`hybrid.hf`)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from hybrid.hf.importer import import_folder


def run_import(cfg: DictConfig) -> Path:
    """Import the transformers folder ``cfg.hf`` into the folder ``cfg.output`` (the composed ``import.yaml``)."""
    directory = import_folder(cfg.hf, cfg.output)
    print(f"wrote {directory}: decode with hybrid generate ckpt_path={directory}, swap its decoder's "
          f"self-attention with hybrid convert ckpt_path={directory} pattern=lstm output=...")
    return directory

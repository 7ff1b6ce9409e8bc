"""``hybrid export``: a checkpoint as a folder that loads with neither Lightning nor Hydra, or, with
``format=transformers``, as the transformers model of its family."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from hybrid.training.checkpoint import export_checkpoint, load_for_inference
from hybrid.validators import check_choice

FORMATS = ("hybrid", "transformers")


def run_export(cfg: DictConfig) -> Path:
    """Write the model and tokenizer of ``cfg.ckpt_path`` into the folder ``cfg.output`` (the composed
    ``export.yaml``): as hybrid's own folder, which loads with ``Seq2Seq.from_pretrained`` and
    ``Seq2SeqTokenizer.load``, or as transformers' (``format=transformers``)."""
    check_choice("format", cfg.format, FORMATS)
    if cfg.format == "transformers":
        from hybrid.hf.exporter import save_transformers
        from hybrid.hf.tokenizer import PretrainedTokenizer

        # An imported model's tokenizer (from its folder, or kept in a checkpoint) goes with it; hybrid's own
        # tokenizer has no transformers form.
        model, tokenizer = load_for_inference(cfg.ckpt_path)
        directory = save_transformers(model, cfg.output,
                                      tokenizer if isinstance(tokenizer, PretrainedTokenizer) else None)
        print(f"wrote {directory}: load it with transformers' AutoModelForSeq2SeqLM.from_pretrained, or convert it "
              f"with ct2-transformers-converter --model {directory}")
        return directory
    directory = export_checkpoint(cfg.ckpt_path, cfg.output)
    print(f"wrote {directory}: load it with Seq2Seq.from_pretrained and Seq2SeqTokenizer.load")
    return directory

"""``hybrid convert``: a trained model with some decoder mixers swapped (:mod:`hybrid.convert`), written as a
checkpoint that ``hybrid fit init_from=...`` fine-tunes."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from hybrid.convert import convert, summary
from hybrid.training.checkpoint import load_for_inference, read_checkpoint, write_checkpoint


def run_convert(cfg: DictConfig) -> Path:
    """Swap the decoder mixers of ``cfg.ckpt_path`` (a ``.ckpt`` or an exported folder) for ``cfg.pattern``
    and write the result to ``cfg.output`` (the composed ``convert.yaml``); prints what was copied and
    what is new."""
    source = Path(cfg.ckpt_path)
    trained = None if source.is_dir() else read_checkpoint(source)
    model, tokenizer = load_for_inference(source) if trained is None else (trained.build(), trained.tokenizer)
    pattern = OmegaConf.to_object(cfg.pattern) if OmegaConf.is_config(cfg.pattern) else cfg.pattern
    converted, fresh = convert(model, pattern, mixer_options=OmegaConf.to_container(cfg.mixer_options, resolve=True),
                               seed=cfg.seed)
    if trained is not None:  # so a table of runs can count the source's training steps too
        converted.config.extra["converted_at_step"] = trained.global_step
    path = write_checkpoint(converted, tokenizer, cfg.output)
    print(summary(model, converted, fresh))
    print(f"wrote {path}: fine-tune with hybrid fit init_from={path} (add "
          "callbacks.freeze_copied_weights.steps=K to train only the new mixers for the first K steps)")
    return path

"""Export a hybrid model back to transformers: the model of its family, its generation config and tokenizer.

Only a decoder of attention mixers has a transformers counterpart, and only an architecture of a
family :mod:`hybrid.hf.families` knows (hybrid's own rotary model has none); anything else is refused
with the reason. The folder that :func:`save_transformers` writes loads with
``AutoModelForSeq2SeqLM.from_pretrained`` and converts with CTranslate2's converter, and importing it
again gives the same weights bit for bit.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from hybrid.hf.families import family_of_config, position_table_of, transformers_config_fields, weight_names


def to_transformers(model):
    """``model`` as the transformers model of its family (eval mode, same dtype), with its generation
    defaults as the model's ``generation_config``."""
    import transformers

    config = model.config
    family = family_of_config(config)
    saved = config.extra.get("transformers", {}).get("config", {})
    fields = {**family.legacy_config, **saved}
    fields.update(transformers_config_fields(config), architectures=[family.model_class])
    if saved.get("decoder_start_token_id") is None and saved.get("bos_token_id") == config.bos_id:
        fields["decoder_start_token_id"] = None  # as imported (mBART): transformers then starts from bos_token_id
    hf_config = transformers.AutoConfig.for_model(family.model_type, **fields)
    dtype = next(model.parameters()).dtype
    hf_model = getattr(transformers, family.model_class)(hf_config).to(dtype)
    ours, shapes = model.state_dict(), {name: t.shape for name, t in hf_model.state_dict().items()}
    theirs = {}
    for name, targets in weight_names(config):
        for target, piece in zip(targets, ours[name].chunk(len(targets)), strict=True):
            theirs[target] = piece.reshape(shapes[target])
    missing, unexpected = hf_model.load_state_dict(theirs, strict=False)
    # Not loaded by name, yet set: a tensor tied to a loaded one (the head, each side's embed_tokens), and the
    # sinusoid tables transformers computes (checked below).
    state = hf_model.state_dict()
    loaded = {state[key].data_ptr() for key in theirs}
    left = [key for key in missing if "embed_positions" not in key and state[key].data_ptr() not in loaded]
    if left or unexpected:
        raise ValueError(f"the {family.model_class} weights did not map one to one: missing {left}, "
                         f"unexpected {unexpected}")
    if config.positions == "sinusoidal":
        _check_sinusoids(model, hf_model, family.model_class)
    ids = {key: getattr(hf_config, key) for key in ("decoder_start_token_id", "pad_token_id", "eos_token_id",
                                                    "bos_token_id")}
    hf_model.generation_config = transformers.GenerationConfig(**{**ids, **_generation_options(model)})
    return hf_model.eval()


def save_transformers(model, directory: str | os.PathLike, tokenizer=None) -> Path:
    """Write ``model`` as a transformers folder (``save_pretrained``), with an imported model's transformers
    tokenizer (a :class:`~hybrid.hf.tokenizer.PretrainedTokenizer`) beside it when given; each file is moved
    into place whole."""
    hf_model = to_transformers(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".export-") as staging:
        hf_model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save(staging)  # its files as they were imported
        for file in Path(staging).iterdir():
            os.replace(file, directory / file.name)
    return directory


def _generation_options(model) -> dict[str, Any]:
    """hybrid's generation defaults under transformers' names (``max_new_tokens`` and ``min_new_tokens``
    as the ``max_length`` and ``min_length`` that count the decoder start token)."""
    options = dict(model.generation_config)
    if "max_new_tokens" in options:
        options["max_length"] = options.pop("max_new_tokens") + 1
    if "min_new_tokens" in options:
        options["min_length"] = options.pop("min_new_tokens") + 1
    return options


def _check_sinusoids(model, hf_model, class_name: str) -> None:
    for side in ("encoder", "decoder"):
        ours = getattr(model, f"{side}_positions").weight
        theirs = position_table_of(getattr(hf_model.model, side).embed_positions)[:ours.shape[0]].to(ours.dtype)
        if not torch.allclose(ours, theirs, atol=1e-6):
            raise ValueError(f"this model's {side} position table is not the sinusoids {class_name} computes, so "
                             "transformers would decode it with other positions")

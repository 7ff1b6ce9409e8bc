"""Import a transformers encoder-decoder exactly: its weights, special ids, generation defaults and tokenizer.

``Seq2Seq.from_transformers(model_or_path)`` and ``hybrid import hf=PATH output=DIR`` come here. The
result is a :class:`hybrid.Seq2Seq` whose decoder layers are attention mixers and whose logits equal
transformers' own forward; ``hybrid convert`` then swaps its decoder's self-attention for any mixer.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from hybrid.config import ModelConfig
from hybrid.hf.families import family_of, model_config_fields, position_table_of, weight_names

logger = logging.getLogger(__name__)

TOKENIZER_FOLDER = "tokenizer"  # where an imported model keeps transformers' tokenizer files
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "source.spm", "spiece.model", "sentencepiece.bpe.model")

# transformers' generation options that hybrid's GenerationConfig has under the same name and meaning.
_SAME_OPTIONS = ("num_beams", "length_penalty", "early_stopping", "no_repeat_ngram_size", "repetition_penalty",
                 "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "do_sample", "temperature",
                 "top_k", "top_p", "num_return_sequences", "use_cache")
# Ids the model config holds, what generate() returns rather than how it decodes, and bookkeeping.
# Keys of a transformers config that describe the saved object, not the model: not kept with an import.
_BOOKKEEPING = ("architectures", "transformers_version", "model_type", "dtype", "torch_dtype", "_name_or_path")
_NOT_OPTIONS = ("bos_token_id", "pad_token_id", "decoder_start_token_id", "output_attentions", "output_hidden_states",
                "transformers_version", "_from_model_config")


def load_transformers_model(model_or_path):
    """The transformers model itself: ``model_or_path`` when it is one, else loaded from a local folder,
    refused early, by name, when the folder's class is not one hybrid imports or it holds no weights."""
    if not isinstance(model_or_path, (str, os.PathLike)):
        family_of(getattr(model_or_path.config, "model_type", None), type(model_or_path).__name__)
        return model_or_path
    folder = Path(model_or_path)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: expected a folder written by transformers' "
                                "save_pretrained (models are never downloaded)")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    named = (config.get("architectures") or [None])[0]
    family = family_of(config.get("model_type"), named or f"model_type {config.get('model_type')!r}")
    if not any((folder / name).is_file() for name in _WEIGHT_FILES):
        raise FileNotFoundError(f"{folder} holds a {named or family.model_class} config but no weights (none of "
                                f"{', '.join(_WEIGHT_FILES)})")
    import transformers

    return getattr(transformers, family.model_class).from_pretrained(folder)


def from_transformers(model_or_path, device: str | torch.device = "cpu"):
    """A :class:`hybrid.Seq2Seq` with a transformers model's weights, ids and generation defaults (see
    :meth:`hybrid.Seq2Seq.from_transformers`)."""
    from hybrid.model import Seq2Seq

    hf_model = load_transformers_model(model_or_path)
    hf_config = hf_model.config
    family = family_of(hf_config.model_type, type(hf_model).__name__)
    generation = getattr(hf_model, "generation_config", None)
    start_id = _first_set(hf_config.decoder_start_token_id, getattr(generation, "decoder_start_token_id", None),
                          hf_config.bos_token_id)
    eos_ids = _ids(hf_config.eos_token_id)
    if start_id is None or not eos_ids or hf_config.pad_token_id is None:
        raise ValueError(f"{type(hf_model).__name__}'s config lacks a decoder start, EOS or pad id "
                         f"(decoder_start_token_id={hf_config.decoder_start_token_id}, "
                         f"eos_token_id={hf_config.eos_token_id}, pad_token_id={hf_config.pad_token_id})")
    # The transformers config is kept whole (less what describes the saved object), so an export restores
    # every option the spec has no field for (attention_dropout, id2label, ...); the family's legacy keys are
    # the export's to write.
    kept = {key: value for key, value in hf_config.to_dict().items()
            if key not in _BOOKKEEPING and key not in family.legacy_config}
    config = ModelConfig(**model_config_fields(family, hf_config), decoder_mixers="attention",
                         pad_id=hf_config.pad_token_id, bos_id=start_id, eos_id=eos_ids[0],
                         extra={"transformers": {"model_type": family.model_type, "config": _plain(kept)}})
    dtype = next(hf_model.parameters()).dtype
    model = Seq2Seq(config).to(dtype)
    theirs, shapes = hf_model.state_dict(), {name: t.shape for name, t in model.state_dict().items()}
    ours = {name: torch.cat([theirs[source] for source in sources]).reshape(shapes[name])
            for name, sources in weight_names(config)}
    if config.positions == "sinusoidal":  # a fixed table: transformers rebuilds it rather than saving it
        rows = config.max_positions + config.position_offset
        for side in ("encoder", "decoder"):
            table = position_table_of(getattr(hf_model.model, side).embed_positions)
            ours[f"{side}_positions.weight"] = table[:rows]
    model.load_state_dict(ours, strict=True)
    model.generation_config = generation_defaults(generation, eos_ids, config)
    return model.to(device).eval()


def import_folder(path: str | os.PathLike, output: str | os.PathLike) -> Path:
    """``hybrid import``: the transformers folder ``path`` as a hybrid folder ``output``: the model
    (``save_pretrained``, with its generation defaults) and the transformers tokenizer in ``output/tokenizer``,
    checked against the model's vocabulary and ids. A folder without tokenizer files imports without one,
    with a warning: ``hybrid generate`` then has no way to read text."""
    from hybrid.hf.tokenizer import PretrainedTokenizer

    model = from_transformers(path)
    output = Path(output)
    model.save_pretrained(output)
    if any((Path(path) / name).is_file() for name in _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(path).save_pretrained(output / TOKENIZER_FOLDER)
        PretrainedTokenizer.load(output / TOKENIZER_FOLDER, model.config)  # refuses one that does not fit the model
    else:
        logger.warning("%s has no tokenizer files (%s): the imported model reads and writes token ids only",
                       path, ", ".join(_TOKENIZER_FILES))
    return output


def generation_defaults(generation, eos_ids: list[int], config: ModelConfig) -> dict[str, Any]:
    """A transformers ``GenerationConfig`` as hybrid's generate() defaults: the options it sets (not
    transformers' own defaults), under hybrid's names. ``max_length`` and ``min_length`` count the decoder
    start token in an encoder-decoder, so they become ``max_new_tokens`` and ``min_new_tokens`` one
    lower; options hybrid does not have are left out, with a warning naming them."""
    if generation is None:
        return {}
    given = {key: value for key, value in generation.to_diff_dict().items() if key not in _NOT_OPTIONS}
    defaults: dict[str, Any] = {}
    if len(eos_ids) > 1 or _ids(given.pop("eos_token_id", None)) not in ([], [config.eos_id]):
        defaults["eos_token_id"] = _ids(generation.eos_token_id)
    if "max_length" in given:
        defaults["max_new_tokens"] = max(1, given.pop("max_length") - 1)
    if "max_new_tokens" in given:
        defaults["max_new_tokens"] = given.pop("max_new_tokens")
    if "min_length" in given:
        defaults["min_new_tokens"] = max(0, given.pop("min_length") - 1)
    for key in _SAME_OPTIONS:
        if key in given:
            defaults[key] = given.pop(key)
    if given:
        logger.warning("the model's generation config sets options hybrid's generate() does not have, left out: %s",
                       ", ".join(f"{key}={value!r}" for key, value in sorted(given.items())))
    return defaults


def _first_set(*values):
    return next((value for value in values if value is not None), None)


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def _plain(value):
    """A transformers config dict as JSON reads it back: string keys (id2label's are ints), torch dtypes
    as their names."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)

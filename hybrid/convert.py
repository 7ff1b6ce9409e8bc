"""Swap decoder mixers of a trained model, keep every other weight: the first half of
"Finetuning Pretrained Transformers into RNNs" (Kasai et al., 2021), for every registered mixer.

The converted model has new mixers in the named layers and bit-identical copies of everything
else (embeddings, encoder, cross-attention, FFNs, norms, head). Within a new mixer, what its class
declares in ``carried_over`` (for ``linear``, ``t2r`` and ``performer``: the attention layer's Q/K/V and
output projections) is copied too, and the rest is freshly initialised; a short fine-tune then teaches
the new mixers to stand in for the old ones.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from hybrid.config import ModelConfig
from hybrid.mixers import MIXERS
from hybrid.model import Seq2Seq


def parse_pattern(pattern: str | Sequence[str], layers: int) -> list[str]:
    """A decoder pattern as one mixer name per layer.

    Accepted forms: one name for every layer (``"lstm"``); one name per layer (``"lstm,lstm,attention"``
    or a list); or layer ranges that cover every layer exactly once (``"0-2:lstm,3:attention"`` or
    a list of such parts, as Hydra's ``pattern=[0-2:lstm,3:attention]`` gives it).
    """
    parts = [part.strip() for part in (pattern.split(",") if isinstance(pattern, str) else pattern)]
    if any(":" in part for part in parts):
        names = [""] * layers
        for part in parts:
            span, _, name = part.partition(":")
            match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", span)
            if not match:
                raise ValueError(f"pattern part {part!r} must look like 'LAYER:NAME' or 'FIRST-LAST:NAME'")
            first, last = int(match.group(1)), int(match.group(2) or match.group(1))
            if not 0 <= first <= last < layers:
                raise ValueError(f"pattern part {part!r}: layers must lie in [0, {layers - 1}]")
            for layer in range(first, last + 1):
                if names[layer]:
                    raise ValueError(f"pattern names layer {layer} twice")
                names[layer] = name.strip()
        missing = [i for i, name in enumerate(names) if not name]
        if missing:
            raise ValueError(f"pattern leaves decoder layers {missing} without a mixer; name every layer")
    else:
        names = parts * layers if len(parts) == 1 else parts
    if len(names) != layers:
        raise ValueError(f"pattern names {len(names)} layers but the model has {layers} decoder layers")
    for name in names:
        if name not in MIXERS:
            raise ValueError(f"pattern: unknown mixer {name!r}; allowed: {sorted(MIXERS)}")
    return names


def changed_layers(old: ModelConfig, new: ModelConfig) -> list[int]:
    """The decoder layers whose mixer differs from ``old`` to ``new``, in kind or in its options."""
    return [i for i, (before, after) in enumerate(zip(old.decoder_mixers, new.decoder_mixers, strict=True))
            if before != after or new.options_for(after) != old.options_for(before)]


def convert(model: Seq2Seq, pattern: str | Sequence[str], mixer_options: dict[str, dict] | None = None,
            seed: int = 0) -> tuple[Seq2Seq, list[str]]:
    """A copy of ``model`` whose decoder layers use the mixers of ``pattern``.

    ``mixer_options`` (``{mixer: {option: value}}``) sets the new mixers' own options over the
    source's. Layers whose mixer changes, or whose mixer's options change, get a freshly initialised
    one (seeded); every other tensor is copied unchanged, including the mixers of layers that keep
    their kind. Returns the new model and the names of its newly initialised parameters (for
    freezing the rest).
    """
    config = model.config
    names = parse_pattern(pattern, config.decoder_layers)
    options = {name: dict(values) for name, values in config.mixer_options.items()}
    for name, values in (mixer_options or {}).items():
        options[name] = {**options.get(name, {}), **values}
    new_config = ModelConfig.from_dict(dict(config.to_dict(), decoder_mixers=names, mixer_options=options))
    torch.manual_seed(seed)
    converted = Seq2Seq(new_config)
    changed = changed_layers(config, new_config)
    swapped = tuple(f"decoder_layers.{i}.mixer." for i in changed)
    # Within a swapped mixer, the submodules its class declares it shares with the old one carry over.
    carried = tuple(f"decoder_layers.{i}.mixer.{module}." for i in changed
                    for module in MIXERS[names[i]].carried_over.get(config.decoder_mixers[i], ()))

    def is_fresh(key: str) -> bool:
        return key.startswith(swapped) and not key.startswith(carried)

    source = model.state_dict()
    target = converted.state_dict()
    copied = {key: value for key, value in source.items() if not is_fresh(key)}
    missing = [key for key in target if not is_fresh(key) and key not in copied]
    if missing:
        raise ValueError(f"cannot copy {missing[:3]}...: the model's shape differs beyond its mixers")
    converted.load_state_dict({**target, **copied}, strict=True)
    fresh = [name for name, _ in converted.named_parameters() if is_fresh(name)]
    converted.config.extra = dict(config.extra, converted_from=config.decoder_mixers, fresh_parameters=fresh)
    converted.generation_config = dict(model.generation_config)  # an imported model's decoding defaults stay
    return converted.to(next(model.parameters()).device), fresh


def summary(model: Seq2Seq, converted: Seq2Seq, fresh: list[str]) -> str:
    """One paragraph: what changed and what was copied."""
    total = sum(p.numel() for p in converted.parameters())
    new = sum(p.numel() for name, p in converted.named_parameters() if name in fresh)
    return (f"decoder mixers {model.config.decoder_mixers} -> {converted.config.decoder_mixers}; "
            f"{len(fresh)} new tensors ({new:,} parameters, freshly initialised), "
            f"{total - new:,} of {total:,} parameters copied unchanged")

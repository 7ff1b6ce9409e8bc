"""The transformers families hybrid imports, each described by what it fixes in :class:`hybrid.ModelConfig`.

As in CTranslate2's converters, a family is not a model class: it is a loader onto the one spec.
BART, mBART, Marian and M2M100 (NLLB's class) share transformers' module layout (BART's) and differ
in a handful of architecture fields, which :data:`FAMILIES` lists; the rest (widths, depths, the
activation, the embedding scale, the special ids) is read from each model's own config.
:data:`WEIGHT_NAMES` maps that shared layout onto hybrid's parameter names once, for importing and
exporting alike.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

SUPPORTED = "BART (facebook/bart-*, distilbart), Marian (OPUS-MT), mBART and M2M100 (NLLB)"
# T5 (relative position bias, RMSNorm, gated FFNs, no biases, unscaled attention) does not fit this spec yet.
REFUSED = {"t5": "T5 and Flan-T5 are not supported yet: their relative attention bias, RMSNorm, bias-free "
                 "layers and unscaled attention are not in hybrid's architecture spec"}


@dataclasses.dataclass(frozen=True)
class Family:
    """One transformers family: its ``model_type``, the class that holds its generation head, the
    :class:`~hybrid.ModelConfig` fields every model of the family has, and the keys an export writes that
    transformers 5 no longer sets but the family's published configs carry and CTranslate2's converter
    reads (BART's ``normalize_before``)."""

    model_type: str
    model_class: str
    architecture: dict[str, Any]
    legacy_config: dict[str, Any] = dataclasses.field(default_factory=dict)


FAMILIES: dict[str, Family] = {family.model_type: family for family in (
    Family("bart", "BartForConditionalGeneration",  # post-norm, learned positions from row 2
           dict(positions="learned", position_offset=2, pre_norm=False, embedding_norm=True, final_norm=False,
                final_logits_bias=True), legacy_config=dict(normalize_before=False)),
    Family("mbart", "MBartForConditionalGeneration",  # BART made pre-norm, with final norms
           dict(positions="learned", position_offset=2, pre_norm=True, embedding_norm=True, final_norm=True,
                final_logits_bias=True), legacy_config=dict(normalize_before=True)),
    Family("marian", "MarianMTModel",  # post-norm, sinusoids from row 0, no embedding norm
           dict(positions="sinusoidal", position_offset=0, pre_norm=False, embedding_norm=False, final_norm=False,
                final_logits_bias=True)),
    Family("m2m_100", "M2M100ForConditionalGeneration",  # pre-norm, sinusoids from row 2 (past the pad row)
           dict(positions="sinusoidal", position_offset=2, pre_norm=True, embedding_norm=False, final_norm=True,
                final_logits_bias=False)),
)}

# transformers' activation_function names -> ModelConfig.activation.
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "swish": "silu", "silu": "silu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}


def family_of(model_type: str, class_name: str) -> Family:
    """The family of a transformers model, or a ValueError naming it and listing what is supported."""
    if model_type in REFUSED:
        raise ValueError(f"{class_name} ({model_type}): {REFUSED[model_type]}; supported: {SUPPORTED}")
    if model_type not in FAMILIES:
        raise ValueError(f"cannot import {class_name} (model_type {model_type!r}): hybrid imports encoder-decoders "
                         f"of the families {SUPPORTED}")
    return FAMILIES[model_type]


def family_of_config(config) -> Family:
    """The family whose fixed architecture fields a hybrid :class:`~hybrid.ModelConfig` has (the one it was
    imported from first, when it says), or a ValueError saying why none fits."""
    if any(mixer != "attention" for mixer in config.decoder_mixers):
        raise ValueError(f"only a decoder of attention mixers exports to transformers, whose models have no other "
                         f"kind of layer; this one has {config.decoder_mixers}")
    imported = config.extra.get("transformers", {}).get("model_type")
    candidates = [FAMILIES[imported]] if imported in FAMILIES else list(FAMILIES.values())
    for family in candidates:
        if all(getattr(config, name) == value for name, value in family.architecture.items()):
            return family
    raise ValueError("this model's architecture is not one of a transformers family "
                     f"({SUPPORTED}): hybrid's own (rotary positions) has no transformers class; got "
                     + ", ".join(f"{name}={getattr(config, name)!r}" for name in FAMILIES["bart"].architecture))


def model_config_fields(family: Family, hf_config) -> dict[str, Any]:
    """The :class:`~hybrid.ModelConfig` fields of a transformers config of ``family`` (ids and mixers aside),
    or a ValueError naming the option the spec cannot express."""
    name = f"{type(hf_config).__name__}"
    for encoder, decoder in (("encoder_attention_heads", "decoder_attention_heads"),
                             ("encoder_ffn_dim", "decoder_ffn_dim")):
        if getattr(hf_config, encoder) != getattr(hf_config, decoder):
            raise ValueError(f"{name} has {encoder}={getattr(hf_config, encoder)} but {decoder}="
                             f"{getattr(hf_config, decoder)}; hybrid's encoder and decoder share these widths")
    if getattr(hf_config, "decoder_vocab_size", None) not in (None, hf_config.vocab_size):
        raise ValueError(f"{name} has a decoder vocabulary of {hf_config.decoder_vocab_size} beside an encoder "
                         f"vocabulary of {hf_config.vocab_size}; hybrid's encoder and decoder share one")
    if not getattr(hf_config, "share_encoder_decoder_embeddings", True):
        raise ValueError(f"{name} has share_encoder_decoder_embeddings=False; hybrid's encoder and decoder share "
                         "one embedding table")
    activation = hf_config.activation_function
    if activation not in ACTIVATIONS:
        raise ValueError(f"{name}'s activation_function {activation!r} is not one hybrid has; allowed: "
                         f"{sorted(ACTIVATIONS)}")
    return {**family.architecture,
            "vocab_size": hf_config.vocab_size, "d_model": hf_config.d_model,
            "n_heads": hf_config.encoder_attention_heads, "d_ff": hf_config.encoder_ffn_dim,
            "encoder_layers": hf_config.encoder_layers, "decoder_layers": hf_config.decoder_layers,
            "max_positions": hf_config.max_position_embeddings, "dropout": hf_config.dropout,
            "activation": ACTIVATIONS[activation],
            "embedding_scale": math.sqrt(hf_config.d_model) if hf_config.scale_embedding else 1.0,
            "tie_embeddings": bool(getattr(hf_config, "tie_word_embeddings", True))}


def transformers_config_fields(config) -> dict[str, Any]:
    """The inverse of :func:`model_config_fields`: the transformers config keys of a hybrid config."""
    activation = {"gelu": "gelu", "relu": "relu", "silu": "swish", "gelu_tanh": "gelu_new"}[config.activation]
    return {"vocab_size": config.vocab_size, "d_model": config.d_model,
            "encoder_attention_heads": config.n_heads, "decoder_attention_heads": config.n_heads,
            "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
            "encoder_layers": config.encoder_layers, "decoder_layers": config.decoder_layers,
            "max_position_embeddings": config.max_positions, "dropout": config.dropout,
            "activation_function": activation, "scale_embedding": config.embedding_scale != 1.0,
            "tie_word_embeddings": config.tie_embeddings, "pad_token_id": config.pad_id,
            "eos_token_id": config.eos_id, "decoder_start_token_id": config.bos_id}


def position_table_of(module) -> torch.Tensor:
    """A transformers sinusoid module's table, which it computes rather than saves: Marian's is the
    embedding's ``weight``, M2M100's a buffer named ``weights``."""
    table = getattr(module, "weights", None)
    return (module.weight if table is None else table).detach()


def weight_names(config) -> list[tuple[str, tuple[str, ...]]]:
    """Every hybrid weight of a BART-layout model with its transformers names: (hybrid name, the transformers
    tensors it is made of, concatenated along dimension 0 when several: the fused projections)."""
    names: list[tuple[str, tuple[str, ...]]] = [("embed.weight", ("model.shared.weight",))]
    for side in ("encoder", "decoder"):
        if config.embedding_norm:
            names += [(f"{side}_embedding_norm.{p}", (f"model.{side}.layernorm_embedding.{p}",))
                      for p in ("weight", "bias")]
        if config.positions == "learned":
            names.append((f"{side}_positions.weight", (f"model.{side}.embed_positions.weight",)))
        if config.final_norm:
            names += [(f"{side}_norm.{p}", (f"model.{side}.layer_norm.{p}",)) for p in ("weight", "bias")]
    for index in range(config.encoder_layers):
        ours, theirs = f"encoder_layers.{index}", f"model.encoder.layers.{index}"
        names += _attention(f"{ours}.attn.qkv", f"{ours}.attn.out", f"{theirs}.self_attn")
        names += _norm_and_ffn(ours, theirs, ((f"{ours}.attn_norm", f"{theirs}.self_attn_layer_norm"),))
    for index in range(config.decoder_layers):
        ours, theirs = f"decoder_layers.{index}", f"model.decoder.layers.{index}"
        names += _attention(f"{ours}.mixer.qkv", f"{ours}.mixer.out", f"{theirs}.self_attn")
        for p in ("weight", "bias"):
            names += [(f"{ours}.cross.query.{p}", (f"{theirs}.encoder_attn.q_proj.{p}",)),
                      (f"{ours}.cross.key_value.{p}", (f"{theirs}.encoder_attn.k_proj.{p}",
                                                        f"{theirs}.encoder_attn.v_proj.{p}")),
                      (f"{ours}.cross.out.{p}", (f"{theirs}.encoder_attn.out_proj.{p}",))]
        names += _norm_and_ffn(ours, theirs, ((f"{ours}.mixer_norm", f"{theirs}.self_attn_layer_norm"),
                                              (f"{ours}.cross_norm", f"{theirs}.encoder_attn_layer_norm")))
    names.append(("lm_head.weight", ("lm_head.weight",)))
    if config.final_logits_bias:
        names.append(("lm_head.bias", ("final_logits_bias",)))  # (1, vocab) in transformers, (vocab,) here
    return names


def _attention(qkv: str, out: str, theirs: str) -> list[tuple[str, tuple[str, ...]]]:
    return [entry for p in ("weight", "bias") for entry in (
        (f"{qkv}.{p}", tuple(f"{theirs}.{name}_proj.{p}" for name in ("q", "k", "v"))),
        (f"{out}.{p}", (f"{theirs}.out_proj.{p}",)))]


def _norm_and_ffn(ours: str, theirs: str, norms: tuple[tuple[str, str], ...]) -> list[tuple[str, tuple[str, ...]]]:
    norms = (*norms, (f"{ours}.ffn_norm", f"{theirs}.final_layer_norm"))
    return [entry for p in ("weight", "bias") for entry in (
        *((f"{our_norm}.{p}", (f"{their_norm}.{p}",)) for our_norm, their_norm in norms),
        (f"{ours}.ffn.fc_in.{p}", (f"{theirs}.fc1.{p}",)),
        (f"{ours}.ffn.fc_out.{p}", (f"{theirs}.fc2.{p}",)))]

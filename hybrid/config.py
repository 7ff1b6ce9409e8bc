"""ModelConfig: every architectural choice of a Seq2Seq model, as plain JSON-safe data."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hybrid.mixers import MIXERS, MixerOptions
from hybrid.validators import check_bool, check_choice, check_float, check_int, check_token_id

POSITIONS = ("rotary", "learned", "sinusoidal")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")


@dataclass
class ModelConfig:
    """The shape of a :class:`hybrid.Seq2Seq` model.

    ``decoder_mixers`` is the ablation knob: one mixer name for every decoder layer
    (``"lstm"``) or one name per layer (``["lstm", "lstm", "attention"]``). The names
    come from the mixer registry in :mod:`hybrid.mixers`. The config validates itself
    on construction and round-trips through :meth:`to_dict` / :meth:`from_dict`, so a
    saved model can be rebuilt with neither Lightning nor Hydra.

    The architecture fields after ``layer_norm_eps`` are the handful of named choices (CTranslate2's
    converter spec names the same ones) that map BART, Marian, mBART and M2M100/NLLB onto this one
    model (:mod:`hybrid.hf`); their defaults build hybrid's own, a pre-norm transformer with rotary
    positions. The special ids are the decoder's: ``bos_id`` is the id decoding starts from
    (transformers' ``decoder_start_token_id``), which an imported model may share with its padding
    (Marian) or its EOS (BART, mBART, NLLB).
    """

    vocab_size: int = 128
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024  # 4 * d_model, the usual transformer FFN ratio
    encoder_layers: int = 3
    decoder_layers: int = 3
    decoder_mixers: str | Sequence[str] = "lstm"
    # Each mixer's own hyperparameters, {mixer name: {option: value}}, checked by the mixer's Options
    # class (e.g. {"lstm": {"hidden_size": 154}}); a mixer not listed takes its defaults.
    mixer_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    dropout: float = 0.1
    # Rotary positions are computed, not learned, so this only sizes the tables and
    # the longest KV cache that may be requested.
    max_positions: int = 4096
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    # How positions enter: "rotary" rotates every self-attention's queries and keys (nothing learned,
    # relative by construction); "learned" (BART, mBART) and "sinusoidal" (Marian, M2M100; a fixed table)
    # add a table row to each embedding, the encoder's and the decoder's their own tables.
    positions: str = "rotary"
    position_offset: int = 0  # the table row of position 0 (2 in BART's, mBART's and M2M100's tables)
    # Norm each sublayer's input, x + f(norm(x)) (the stable choice), or its residual sum, norm(x + f(x))
    # (BART's and Marian's post-norm).
    pre_norm: bool = True
    embedding_norm: bool = False  # a LayerNorm over the embeddings and positions (BART's layernorm_embedding)
    final_norm: bool = True  # a LayerNorm after the encoder's last layer and after the decoder's
    activation: str = "gelu"  # the feed-forward's: "gelu" (erf), "gelu_tanh", "relu" (M2M100) or "silu" (Marian)
    embedding_scale: float = 1.0  # token embeddings are multiplied by it (sqrt(d_model) in Marian and M2M100)
    final_logits_bias: bool = False  # a bias on the output projection (BART's and Marian's final_logits_bias)
    extra: dict[str, Any] = field(default_factory=dict)  # free-form metadata kept with the model

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers",
                     "max_positions"):
            check_int(name, getattr(self, name), at_least=1)
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        check_choice("positions", self.positions, POSITIONS)
        check_choice("activation", self.activation, ACTIVATIONS)
        check_int("position_offset", self.position_offset, at_least=0)
        for name in ("pre_norm", "embedding_norm", "final_norm", "final_logits_bias", "tie_embeddings"):
            check_bool(name, getattr(self, name))
        check_float("embedding_scale", self.embedding_scale, above=0)
        if self.positions == "rotary" and (self.d_model // self.n_heads) % 2 != 0:
            raise ValueError(
                f"d_model / n_heads = {self.d_model // self.n_heads} must be even for rotary positions")
        check_float("dropout", self.dropout, at_least=0, below=1)
        for name in ("pad_id", "bos_id", "eos_id"):
            check_token_id(name, getattr(self, name), vocab_size=self.vocab_size)
        check_float("layer_norm_eps", self.layer_norm_eps, above=0, below=1)
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra must be a dict (free-form metadata), got {self.extra!r}")
        if self.pad_id == self.eos_id:  # a padded row would read as ended; bos_id may be either (see above)
            raise ValueError(f"pad_id ({self.pad_id}) must differ from eos_id ({self.eos_id})")
        self.decoder_mixers = self._normalise_mixers(self.decoder_mixers)
        self.mixer_options = self._normalise_mixer_options(self.mixer_options)

    def _normalise_mixer_options(self, options: object) -> dict[str, dict[str, Any]]:
        if not isinstance(options, dict):
            raise ValueError(f"mixer_options must be a dict {{mixer name: {{option: value}}}}, got {options!r}")
        unknown = sorted(set(options) - set(MIXERS), key=str)
        if unknown:
            raise ValueError(f"mixer_options: unknown mixers {unknown}; allowed: {sorted(MIXERS)}")
        # Every option of every mixer the decoder uses spelled out (defaults included), so a saved config
        # says exactly what was built, and a default changed later cannot change what it rebuilds.
        options = {name: {} for name in self.decoder_mixers} | options
        return {name: MIXERS[name].Options.from_dict(values, f"mixer_options.{name}").to_dict()
                for name, values in sorted(options.items())}

    def options_for(self, mixer: str) -> MixerOptions:
        """The options of mixer ``mixer`` (its defaults where ``mixer_options`` does not list it)."""
        return MIXERS[mixer].Options.from_dict(self.mixer_options.get(mixer, {}), f"mixer_options.{mixer}")

    def _normalise_mixers(self, mixers: str | Sequence[str]) -> list[str]:
        allowed = sorted(MIXERS)
        if isinstance(mixers, str):
            mixers = [mixers] * self.decoder_layers
        elif isinstance(mixers, Sequence):
            mixers = list(mixers)
            if len(mixers) != self.decoder_layers:
                raise ValueError(
                    f"decoder_mixers lists {len(mixers)} names but decoder_layers is {self.decoder_layers}; "
                    "give one name for all layers or exactly one per layer")
        else:
            raise ValueError(f"decoder_mixers must be a mixer name or a list of one name per layer; allowed "
                             f"names: {allowed}; got {mixers!r}")
        for name in mixers:
            if not isinstance(name, str):
                raise ValueError(f"decoder_mixers: each entry must be a mixer name (one of {allowed}), "
                                 f"got {name!r}")
            if name not in MIXERS:
                raise ValueError(f"decoder_mixers: unknown mixer {name!r}; allowed: {allowed}")
        return mixers

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of every field (``decoder_mixers`` as one name per layer)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], partial: bool = False) -> ModelConfig:
        """Rebuild a config from :meth:`to_dict` output; unknown keys are an error, not ignored, and so
        are missing ones, unless ``partial`` (a config node that lists only what it changes)."""
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict):
            raise ValueError(f"a ModelConfig is a JSON object of its fields, got {type(data).__name__}")
        data = _upgrade(data)
        unknown, missing = sorted(set(data) - known), sorted(known - set(data))
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; allowed: {sorted(known)}")
        if missing and not partial:  # a default would silently build another shape than the weights were trained in
            raise ValueError(f"ModelConfig fields {missing} are missing; a saved config holds every field")
        return cls(**dict(data))

    @classmethod
    def from_saved(cls, data: dict[str, Any]) -> ModelConfig:
        """The config of a saved model (``config.json``, a checkpoint's ``model_config``): :meth:`from_dict`,
        after each used mixer's options are read as the layout they built (``MixerOptions.from_saved``):
        today every used mixer's options are spelled out, so an option missing from a saved config is one
        that did not exist when it was written."""
        if not isinstance(data, dict):
            return cls.from_dict(data)
        data = _upgrade(data)
        mixers = data.get("decoder_mixers")
        names = [mixers] if isinstance(mixers, str) else list(mixers) if isinstance(mixers, list) else []
        options = dict(data.get("mixer_options") or {})
        for name in dict.fromkeys(name for name in names if name in MIXERS):
            options[name] = MIXERS[name].Options.from_saved(options.get(name, {}))
        return cls.from_dict({**data, "mixer_options": options})


# The architecture fields added with importing (issue 28): a config saved before them built what their
# defaults build, hybrid's own architecture, so it reads as if it listed them.
_ARCHITECTURE_DEFAULTS = {"positions": "rotary", "position_offset": 0, "pre_norm": True, "embedding_norm": False,
                          "final_norm": True, "activation": "gelu", "embedding_scale": 1.0, "final_logits_bias": False}


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A config saved before the architecture fields, or before ``mixer_options`` (which had a shared
    ``lstm_hidden_size`` field), in today's form."""
    data = {**_ARCHITECTURE_DEFAULTS, **data}
    if "lstm_hidden_size" not in data:
        return data
    width = data.pop("lstm_hidden_size")
    options = {name: dict(values) for name, values in (data.get("mixer_options") or {}).items()}
    if width is not None:
        options.setdefault("lstm", {}).setdefault("hidden_size", width)
    data["mixer_options"] = options
    return data

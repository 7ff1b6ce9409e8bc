"""The data modules' shared core: tokenized examples, padded batches, length limits and seeded loaders.

A batch (:func:`collate`) is a dict:

    src_ids  [B, S] long   source ids, padded with pad
    src_mask [B, S] bool   True on real source tokens
    tgt_in   [B, T] long   bos + target ids (decoder input, teacher forcing), padded with pad
    tgt_out  [B, T] long   target ids + eos (what the decoder must predict), padded with pad
    src_text, tgt_text     the raw strings, for sequence-level metrics and printed examples
    tgt_references         each row's accepted targets (tgt_text first): what the metrics score against

Pad, bos and eos are the tokenizer's: hybrid's own tokenizer has 0, 1 and 2; an imported model's
(`PretrainedTokenizer`, set as the data module's tokenizer to evaluate that model) has the model's, its
bos being the id the decoder starts from (Marian's pad, BART's eos).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning import LightningDataModule
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from hybrid.records import Pair, ParseReport
from hybrid.tokenizer import BOS_ID, EOS_ID, PAD_ID, Seq2SeqTokenizer
from hybrid.training.data.loading import EpochSeededSampler, ResumableDataLoader
from hybrid.training.scoring import closest_reference
from hybrid.validators import check_bool, check_choice, check_int

if TYPE_CHECKING:
    from hybrid.hf.tokenizer import PretrainedTokenizer

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

    A subclass says where its string pairs come from (`_load_pairs`), how its tokenizer is built
    (`_make_tokenizer`), and what its task is: `task_name`, the `metrics()` it is scored with and how a
    printed example reads (`example_row`). Making one reads no data (the tokenizer is built on first use,
    the pairs at `setup()`), so the task of a run can be read from its saved config by instantiating its
    `data` node. `setup()` is idempotent and is also run on demand by the loaders
    and by `source_length`/`target_length`, so the module works outside a Trainer too. Training
    batches come in an order drawn from `seed` and the epoch (`EpochSeededSampler`), so a rerun
    sees the same batches, and a run resumed mid-epoch sees the ones it had left.

    Every data module takes this class's loader options as keywords (`seed`, `batch_size`, `num_workers`,
    `too_long`, `source_eos`, `max_source_length`, `max_target_length`) beside its own.

    Every source ends with eos (`source_eos`, as fairseq does): the encoder's positions are only
    relative, so without it nothing tells the encoder where a source of varied length ends. The
    tokenizer holds the rule (`Seq2SeqTokenizer.source_suffix`), so inference encodes sources alike.

    Examples longer than `max_source_length`/`max_target_length` tokens (the source's with its eos,
    as fairseq's max_source_positions; the target's without bos/eos; the training entry points lower
    them to what the model holds, `limit_lengths`) are dropped or cut to the limits (a cut source
    keeps its eos), as `too_long` says, in every split, and counted in `reports[split]`. A file, or
    a training split, left with nothing to train on is a `ValueError` that names it and counts why.
    """

    def __init__(self, *, seed: int = 0, batch_size: int = 64, num_workers: int = 0,
                 too_long: Literal["drop", "truncate"] = "drop", source_eos: bool = True,
                 max_source_length: int | None = None, max_target_length: int | None = None) -> None:
        super().__init__()
        # Every subclass passes these through (`**loader_options`), so their defaults live here only.
        # Called here rather than in each subclass, Lightning still records the subclass's own arguments
        # (it reads every `__init__` frame up the chain), with these defaults where none were given.
        self.save_hyperparameters()
        check_bool("source_eos", source_eos)
        check_choice("too_long", too_long, TOO_LONG_POLICIES)
        for name, limit in (("max_source_length", max_source_length), ("max_target_length", max_target_length)):
            check_int(name, limit, at_least=1, optional=True)
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

    @property
    def task_name(self) -> str:
        """The task's name in reports and tables: "g2p", "text", or a synthetic task's own ("copy", "recall")."""
        raise NotImplementedError

    def metrics(self) -> tuple[str, ...]:
        """The sequence metrics the task is scored with (keys of `hybrid.training.scoring.SEQUENCE_METRICS`):
        exact match and its field's usual scores; `module.metrics: null` in a config means these."""
        raise NotImplementedError

    def example_row(self, example: Example, prediction: str) -> tuple[str, str, str, str]:
        """A printed example's columns: the source, the prediction, the reference it is scored against (the
        closest of several) and "ok" or "x", as exact match would count it."""
        reference = closest_reference(prediction, example.references)
        return example.source, prediction, reference, "ok" if prediction == reference else "x"

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


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """Refuse validation and test fractions that are negative or leave no training set."""
    if not (0 <= val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):
        raise ValueError(f"split fractions must leave a training set: val={val_fraction}, test={test_fraction}")

"""Bulk decoding on many processes: Lightning's ``predict`` with DDP, each rank a worker of the bulk job.

Shards belong to ranks by index (:class:`hybrid.bulk.store.Worker`), so ranks never overlap: each
writes its own shards and manifest into the shared work folder, and rank 0 merges once all are done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from hybrid.bulk.inputs import Shard, ShardReader, count_sources, read_sources
from hybrid.bulk.job import BulkJob, decode_shard, job_fingerprint, pending_inputs, save_decoded, shard_seed
from hybrid.bulk.progress import BulkProgress
from hybrid.bulk.store import ShardStore, Worker, parse_shard
from hybrid.model import Seq2Seq

if TYPE_CHECKING:
    from hybrid.training.checkpoint import AnyTokenizer

logger = logging.getLogger(__name__)


def run_bulk_ddp(model: Seq2Seq, tokenizer: AnyTokenizer, input: str, output: str, job: BulkJob,
                 trainer_options: dict[str, Any], input_format: str = "auto", shard: str | None = None,
                 work_dir: str | None = None, keep_shards: bool = False, progress: bool = True,
                 fingerprint: dict[str, Any] | None = None) -> bool:
    """Decode ``input`` with Lightning's ``predict`` on every rank of ``trainer_options`` (e.g.
    ``strategy="ddp", devices=2``): each rank is a worker of its own, takes a disjoint set of
    shards and writes them to the shared ``work_dir``; rank 0 merges once all are done.

    The input must be a file (every rank reads it) and, across machines, ``work_dir`` must be
    on a shared file system. ``shard="i/n"`` splits the work between jobs first. Returns whether
    this process wrote the complete output (rank 0, once every shard is done).
    """
    import lightning

    if input is None or input == "-" or output is None or output == "-":
        raise ValueError("the DDP path reads the input in every process and writes shards: give input= and "
                         "output= files, not standard input or output")
    index, count = parse_shard(shard)
    work_dir = work_dir or f"{output}.parts"
    fingerprint = job_fingerprint(job, model, tokenizer, input, fingerprint)

    class BulkPredictor(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def predict_dataloader(self) -> torch.utils.data.DataLoader:
            ranks = self.trainer.world_size
            self.worker = Worker(index * ranks + self.trainer.global_rank, count * ranks)
            self.store = ShardStore(work_dir, fingerprint, self.worker.name)
            self.done = self.store.done()  # shards belong to ranks by index, so ranks never overlap
            self.reader = ShardReader(read_sources(input, input_format), job.shard_size,
                                      lambda shard, start: self.worker.owns(shard) and start not in self.done)
            return torch.utils.data.DataLoader(_Shards(self.reader), batch_size=None)

        def on_predict_start(self) -> None:
            pending = pending_inputs(count_sources(input), job, self.worker, self.done)
            self.progress = BulkProgress(pending, progress and self.trainer.is_global_zero, "rank 0").__enter__()

        def predict_step(self, shard: Shard) -> None:
            lines, rejects = decode_shard(self.model, tokenizer, shard.texts, job,
                                          shard_seed(job.seed, shard.index), self.progress.advance)
            save_decoded(self.store, shard, lines, rejects, job, input)

        def on_predict_end(self) -> None:
            self.progress.__exit__()
            logger.info("rank %d: %s", self.trainer.global_rank, self.progress.summary())
            self.store.finish(self.reader.total)
            self.trainer.strategy.barrier("bulk-merge")
            self.merged = self.trainer.is_global_zero and self.store.merge(output, keep_shards=keep_shards)

    trainer = lightning.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, use_distributed_sampler=False, **trainer_options)
    predictor = BulkPredictor()
    trainer.predict(predictor, return_predictions=False)
    return predictor.merged


class _Shards(torch.utils.data.IterableDataset):
    """A :class:`ShardReader` as a dataset, so that Lightning's predict loop can iterate it."""

    def __init__(self, reader: ShardReader) -> None:
        self.reader = reader

    def __iter__(self) -> Iterator[Shard]:
        return iter(self.reader)

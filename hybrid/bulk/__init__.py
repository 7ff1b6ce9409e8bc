"""Bulk inference: decode a large input, one output line per input line, resumably, on one process or many.

- :mod:`hybrid.bulk.inputs`: reading the input (text, TSV, JSONL; gzip or not), one source per line, in shards;
- :mod:`hybrid.bulk.store`: the work folder (finished shards, manifests, locks) and the merge into the output;
- :mod:`hybrid.bulk.job`: the job (:class:`BulkJob`, :func:`run_bulk`) over continuous refill and bucketing;
- :mod:`hybrid.bulk.progress`: the progress bar;
- :mod:`hybrid.bulk.ddp`: the same job over Lightning's DDP ranks (:func:`run_bulk_ddp`).
"""

from hybrid.bulk.ddp import run_bulk_ddp
from hybrid.bulk.inputs import Rejected, Shard, ShardReader, count_sources, read_sources
from hybrid.bulk.job import ON_ERROR, BulkJob, decode_shard, job_fingerprint, run_bulk, shard_seed
from hybrid.bulk.progress import BulkProgress
from hybrid.bulk.store import ShardStore, Worker, parse_shard

__all__ = ["ON_ERROR", "BulkJob", "BulkProgress", "Rejected", "Shard", "ShardReader", "ShardStore",
           "Worker", "count_sources", "decode_shard", "job_fingerprint", "parse_shard", "read_sources", "run_bulk",
           "run_bulk_ddp", "shard_seed"]

"""The bulk job: decode a large input with the hardware kept full, in input order, resumably.

The input is cut into **shards**, contiguous ranges of ``shard_size`` inputs (:mod:`hybrid.bulk.inputs`).
Each shard is decoded on its own: sources are sorted by length within a read-ahead ``window`` and
cut into batches by a token budget (:func:`hybrid.generation.refill.bucketed_batches`), then decoded
with continuous refill (:class:`hybrid.generation.refill.RefillDecoder`) when the options allow it,
or batch by batch with ``model.generate`` otherwise (beams, penalties, ...). A finished shard goes
to the work folder (:mod:`hybrid.bulk.store`), so a killed job loses at most the shards it was
decoding; a rerun with the same fingerprint skips finished shards, and sampling is seeded per
shard, so the merged output is byte-identical to an uninterrupted run.

``shard=i/n`` makes this job worker ``i`` of ``n`` (any scheduler can start the ``n`` jobs); Lightning's
DDP ``predict`` makes each rank a worker of its own (:mod:`hybrid.bulk.ddp`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hybrid.bulk.inputs import Rejected, Shard, ShardReader, count_sources, read_sources
from hybrid.bulk.progress import BulkProgress
from hybrid.bulk.store import ShardStore, Worker, parse_shard
from hybrid.generation.config import GenerationConfig, with_model_defaults
from hybrid.generation.refill import RefillDecoder, Source, bucketed_batches, pad_sources
from hybrid.model import Seq2Seq
from hybrid.validators import check_bool, check_choice, check_int

if TYPE_CHECKING:
    from hybrid.training.checkpoint import AnyTokenizer

logger = logging.getLogger(__name__)

# What a bulk job does with an input line it cannot decode (invalid UTF-8, a JSONL line without a string
# "source", a source longer than the model's max_positions). Every such line is counted, logged and
# listed with its line number in <output>.rejects.tsv; then
ON_ERROR = {
    "empty": "it gets an empty output line, so output line i still answers input line i",
    "skip": "it gets no output line (the rejects file says which lines are missing)",
    "fail": "the job stops with an error naming the line",
}


@dataclass(frozen=True)
class BulkJob:
    """What shapes a bulk job's output: how it decodes and how the input is cut and batched.

    ``generation`` is the whole decoding config, validated here, before any input is read or any file
    written; the job decodes with it as it is (:meth:`for_model` lays options over a model's own
    generation defaults, as ``hybrid generate`` does). Options no command line can set (a streamer, a
    generator, logits processors) are refused: a job seeds its own sampling per shard, writes text, and
    records its options in its manifests. A rerun must match all of this to reuse finished shards (it
    is the manifests' fingerprint). ``max_tokens`` bounds a batch's source tokens (rows times the
    longest source); ``max_batch_size`` bounds its rows and is the number of refill slots; ``seed``
    seeds sampling, per shard.
    """

    generation: GenerationConfig = field(default_factory=GenerationConfig)
    max_tokens: int = 8192
    max_batch_size: int = 256
    window: int = 2000
    refill: bool = True
    shard_size: int = 10000
    seed: int = 0
    on_error: str = "empty"  # an input line that cannot be decoded: see ON_ERROR

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_batch_size", "window", "shard_size"):
            check_int(name, getattr(self, name), at_least=1)
        check_bool("refill", self.refill)
        check_choice("on_error", self.on_error, tuple(ON_ERROR))
        if not isinstance(self.generation, GenerationConfig):
            raise TypeError(f"generation must be a GenerationConfig, got {type(self.generation).__name__}: "
                            "BulkJob.for_model(model, options) builds one from generate()'s options")
        self.generation.validate()
        given = [option.name for option in dataclasses.fields(GenerationConfig)
                 if option.name not in GenerationConfig.command_line_options()
                 and getattr(self.generation, option.name) is not option.default]
        if given:
            raise ValueError(f"a bulk job decodes with options a command line can set; it cannot take {given}")

    @classmethod
    def for_model(cls, model: Seq2Seq, options: dict[str, Any], **settings: Any) -> BulkJob:
        """The job that decodes with ``options`` (``generate()``'s keyword arguments) laid over ``model``'s
        own generation defaults, validated together; ``settings`` are the job's other fields."""
        return cls(generation=GenerationConfig.from_kwargs(**with_model_defaults(model, options)), **settings)

    def fingerprint(self, **more: Any) -> dict[str, Any]:
        """The job's settings and ``more`` as JSON data, as a manifest records them."""
        return json.loads(json.dumps({**dataclasses.asdict(self), **more}, sort_keys=True, default=str))


def shard_seed(seed: int, shard_index: int) -> int:
    """The sampling seed of one shard: a function of the job's seed and the shard alone, so a rerun,
    another split or another number of ranks samples the same shard the same way."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{shard_index}".encode()).digest()[:7], "little")


def decode_shard(model: Seq2Seq, tokenizer: AnyTokenizer, texts: list[str | Rejected], job: BulkJob,
                 seed: int | None = None, on_done: Callable[[int, int], None] | None = None,
                 ) -> tuple[list[str], dict[int, str]]:
    """One output line per text, in order (its ``num_return_sequences`` predictions, tab-separated), and
    the texts that could not be decoded, by index, with why: a :class:`Rejected` one, or a source longer
    than the model's ``max_positions``. Those get an empty line here; ``job.on_error`` decides the rest.

    Sources are bucketed by length and batched by ``job.max_tokens``, then decoded with continuous
    refill when the options allow it, else batch by batch with ``generate``. ``seed`` seeds
    sampling; ``on_done(sources, tokens)`` is told about each finished batch or sequence.
    """
    device = next(model.parameters()).device
    config = job.generation
    copies = config.num_return_sequences
    lines = ["\t".join([""] * copies)] * len(texts)  # an empty source gets empty predictions
    rejects, sources = {}, []
    limit = model.config.max_positions
    for index, text in enumerate(texts):
        if isinstance(text, Rejected):
            rejects[index] = text.reason
            continue
        ids = tokenizer.encode_source(text)
        if len(ids) > limit:
            rejects[index] = f"the source has {len(ids)} tokens; the model's max_positions is {limit}"
        elif not tokenizer.is_blank_source(ids):
            sources.append(Source(index, ids))
    if not sources:
        return lines, rejects
    if config.do_sample and seed is not None:
        config = dataclasses.replace(config, generator=torch.Generator(device).manual_seed(seed))
    # Every option, given by name: the job's config is the whole decoding config, so the model's own
    # defaults, which generate() and RefillDecoder lay under what they are not given, never apply twice.
    options = {option.name: getattr(config, option.name) for option in dataclasses.fields(config)}
    batches = bucketed_batches(sources, job.max_tokens, job.window, job.max_batch_size)
    if job.refill and not RefillDecoder.obstacles(model, **options):
        longest = max(len(source.ids) for source in sources)  # refill pads every slot to the longest source
        slots = max(1, min(job.max_batch_size, job.max_tokens // longest, len(sources)))
        for index, ids in RefillDecoder(model, slots, **options).run(batches):
            lines[index] = tokenizer.decode(ids)
            if on_done:
                on_done(1, len(ids))
        return lines, rejects
    pad_id = model.config.pad_id
    padding = pad_id if config.pad_token_id is None else config.pad_token_id  # after each EOS
    for batch in batches:
        src_ids = pad_sources(batch, pad_id, device)
        generated = model.generate(src_ids, src_ids.ne(pad_id), **options)
        texts_out = tokenizer.batch_decode(generated.tolist())
        for row, source in enumerate(batch):
            lines[source.index] = "\t".join(texts_out[row * copies:(row + 1) * copies])
        if on_done:
            on_done(len(batch), int(generated.ne(padding).sum()))
    return lines, rejects


def save_decoded(store: ShardStore, shard: Shard, lines: list[str], rejects: dict[int, str], job: BulkJob,
                 input: str | None) -> None:
    """Apply ``job.on_error`` to a decoded shard's rejected lines, then save the shard and its rejects."""
    if rejects:
        first = min(rejects)
        logger.warning("%s: %d line(s) of input could not be decoded, the first line %d: %s (on_error=%s)",
                       input or "standard input", len(rejects), shard.start + first + 1, rejects[first], job.on_error)
        if job.on_error == "fail":
            raise ValueError(f"{input or 'standard input'}:{shard.start + first + 1}: {rejects[first]} "
                             f"(on_error=fail; on_error=empty gives such a line an empty output line)")
    if job.on_error == "skip":
        lines = [line for index, line in enumerate(lines) if index not in rejects]
    store.save(shard, lines, {shard.start + index + 1: reason for index, reason in rejects.items()})


def decode_to_store(model: Seq2Seq, tokenizer: AnyTokenizer, input: str | None, input_format: str,
                    job: BulkJob, store: ShardStore, worker: Worker, progress: bool = True) -> BulkProgress:
    """Decode ``worker``'s unfinished shards of ``input`` into ``store``; returns the progress record."""
    done = store.done()
    if done:
        logger.info("resuming: %d shard(s) already done in %s", len(done), store.directory)
    pending = pending_inputs(count_sources(input), job, worker, done)
    reader = ShardReader(read_sources(input, input_format), job.shard_size,
                         lambda index, start: worker.owns(index) and start not in done)
    with BulkProgress(pending, enabled=progress) as bar:
        for shard in reader:
            lines, rejects = decode_shard(model, tokenizer, shard.texts, job, shard_seed(job.seed, shard.index),
                                          bar.advance)
            save_decoded(store, shard, lines, rejects, job, input)
    store.finish(reader.total)
    logger.info(bar.summary())
    return bar


def pending_inputs(total: int | None, job: BulkJob, worker: Worker, done: set[int]) -> int | None:
    """How many inputs ``worker`` has left to decode (for the ETA); None when the total is unknown."""
    if total is None:
        return None
    return sum(min(job.shard_size, total - start) for index, start in enumerate(range(0, total, job.shard_size))
               if worker.owns(index) and start not in done)


def run_bulk(model: Seq2Seq, tokenizer: AnyTokenizer, input: str | None, output: str | None, job: BulkJob,
             input_format: str = "auto", shard: str | None = None, work_dir: str | None = None,
             resume: bool = True, keep_shards: bool = False, progress: bool = True,
             fingerprint: dict[str, Any] | None = None) -> bool:
    """Decode ``input`` into ``output`` (None or "-": standard output) in input order; resumable.

    Finished shards go to ``work_dir`` (default ``<output>.parts``; for standard output a temporary
    folder, so nothing resumes unless one is given). ``shard="i/n"`` decodes this job's part only.
    ``resume=False`` empties the work folder first (refused while another job holds it). Returns True
    once the output is complete, False while other jobs' shards are missing (the last job to finish
    writes the output).
    ``fingerprint`` adds what else must match for a rerun to reuse shards (the checkpoint, say).
    """
    worker = Worker(*parse_shard(shard))
    to_stdout = output is None or output == "-"
    if to_stdout and worker.count > 1 and work_dir is None:
        raise ValueError("shard=i/n writes part of the output: give output= (or a shared work_dir)")
    with contextlib.ExitStack() as stack:
        if work_dir is None and to_stdout:
            work_dir = stack.enter_context(tempfile.TemporaryDirectory(ignore_cleanup_errors=True))
        work_dir = work_dir or f"{output}.parts"
        fingerprint = job_fingerprint(job, model, tokenizer, input, fingerprint)
        store = ShardStore(work_dir, fingerprint, worker.name, start_over=not resume)
        decode_to_store(model, tokenizer, input, input_format, job, store, worker, progress)
        merged = store.merge(sys.stdout if to_stdout else output, keep_shards=keep_shards)
        if not merged:
            logger.info("shard %s is done; the output is written by whichever job finishes last", shard)
        return merged


def job_fingerprint(job: BulkJob, model: Seq2Seq, tokenizer: AnyTokenizer, input: str | None,
                    more: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything that decides a bulk job's output, as its manifests record it: the options, the input
    (its path and a digest of its bytes; standard input has none), the model (a digest of its config,
    generation defaults and weights), the tokenizer, and ``more``. A rerun whose fingerprint differs is
    refused, so an edited input or a replaced model never reuses shards of the old one."""
    model_digest = hashlib.blake2b(json.dumps(model.config.to_dict(), sort_keys=True).encode())
    model_digest.update(json.dumps(with_model_defaults(model, {}), sort_keys=True).encode())  # generation defaults
    for name, tensor in sorted(model.state_dict().items()):
        model_digest.update(name.encode())
        model_digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    input_digest = None
    if input is not None and input != "-":
        with open(input, "rb") as file:
            input_digest = hashlib.file_digest(file, "blake2b").hexdigest()
    return job.fingerprint(input=_describe_input(input), input_blake2b=input_digest,
                           model_blake2b=model_digest.hexdigest(),
                           tokenizer_blake2b=hashlib.blake2b(tokenizer.to_json_str().encode()).hexdigest(),
                           **(more or {}))


def _describe_input(input: str | None) -> str:
    return "-" if input is None or input == "-" else str(Path(input).resolve())

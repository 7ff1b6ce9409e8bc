"""Bulk inference: decode a large input with the hardware kept full, resumably, on one process or many.

The input (plain lines, TSV or JSONL, gzip or not, or standard input) is cut into **shards**,
contiguous ranges of ``shard_size`` inputs. Each shard is decoded on its own: sources are sorted
by length within a read-ahead ``window`` and cut into batches by a token budget
(:func:`hybrid.generation.refill.bucketed_batches`), then decoded with continuous refill
(:class:`hybrid.generation.refill.RefillDecoder`) when the options allow it, or batch by batch
with ``model.generate`` otherwise (beams, penalties, ...). A finished shard's lines are
written in input order to a temporary file and renamed into place, and the writer's JSON
manifest of finished ranges is rewritten the same way, so a killed job loses at most the
shards it was decoding. A rerun with the same arguments skips finished shards, and sampling
is seeded per shard, so the merged output is byte-identical to an uninterrupted run.

Shard ``k`` belongs to worker ``k % workers``: ``shard=i/n`` makes this job worker ``i`` of
``n`` (any scheduler can start the ``n`` jobs), and Lightning's DDP ``predict`` makes each rank
a worker of its own. Whichever worker finds every shard done merges them into the output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from hybrid.files import INPUT_FORMATS, detect_format, open_input, write_atomically
from hybrid.generation.config import GenerationConfig, with_model_defaults
from hybrid.generation.refill import RefillDecoder, Source, bucketed_batches, pad_sources
from hybrid.model import Seq2Seq
from hybrid.training.tokenizer import Seq2SeqTokenizer

logger = logging.getLogger(__name__)

FORMATS = ("auto", *INPUT_FORMATS)
# What a bulk job does with an input line it cannot decode (invalid UTF-8, a JSONL line without a string
# "source", a source longer than the model's max_positions). Every such line is counted, logged and
# listed with its line number in <output>.rejects.tsv; then
ON_ERROR = {
    "empty": "it gets an empty output line, so output line i still answers input line i",
    "skip": "it gets no output line (the rejects file says which lines are missing)",
    "fail": "the job stops with an error naming the line",
}


@dataclass(frozen=True)
class Rejected:
    """An input line that cannot be decoded: its 1-based number in the input, and why."""

    line: int
    reason: str


@dataclass
class BulkJob:
    """What shapes a bulk job's output: the generation options and how the input is cut and batched.

    A rerun must match these to reuse finished shards (they are the manifest's fingerprint).
    ``max_tokens`` bounds a batch's source tokens (rows times the longest source); ``max_batch_size``
    bounds its rows and is the number of refill slots; ``seed`` seeds sampling, per shard.
    """

    generation: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 8192
    max_batch_size: int = 256
    window: int = 2000
    refill: bool = True
    shard_size: int = 10000
    seed: int = 0
    on_error: str = "empty"  # an input line that cannot be decoded: see ON_ERROR

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_batch_size", "window", "shard_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {sorted(ON_ERROR)}, got {self.on_error!r}")
        GenerationConfig.from_kwargs(**self.generation)  # a bad option fails before any input is read

    def fingerprint(self, **more: Any) -> dict[str, Any]:
        return json.loads(json.dumps({**dataclasses.asdict(self), **more}, sort_keys=True, default=str))


# ----- input ---------------------------------------------------------------------------------


def read_sources(path: str | os.PathLike | None, input_format: str = "auto") -> Iterator[str | Rejected]:
    """Every source of the input, one per line, streamed: the line (``text``), its first tab-separated
    field (``tsv``) or its ``"source"`` (``jsonl``). ``auto`` applies :func:`hybrid.files.detect_format`
    (the name, else the first line). A blank line is an empty source, and a line that holds no source
    (invalid UTF-8, a JSONL line without a string ``"source"``) is a :class:`Rejected`, so item ``i``
    always stands for input line ``i``."""
    if input_format not in FORMATS:
        raise ValueError(f"input_format must be one of {FORMATS}, got {input_format!r}")
    # surrogateescape: a line of invalid UTF-8 is read (its bad bytes as lone surrogates) and rejected
    # on its own, instead of a UnicodeDecodeError ending the whole input.
    with open_input(path, errors="surrogateescape") as stream:
        lines = (line.rstrip("\r\n") for line in stream)
        first = next(lines, None)
        if first is None:
            return
        kind = detect_format(path, first) if input_format == "auto" else input_format
        for number, line in enumerate(itertools.chain([first], lines), start=1):
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:
                yield Rejected(number, "the line is not valid UTF-8")
                continue
            if kind == "text":
                yield line
            elif not line.strip():
                yield ""
            elif kind == "tsv":
                yield line.split("\t", 1)[0]
            else:
                yield _jsonl_source(line, number)


def _jsonl_source(line: str, number: int) -> str | Rejected:
    """The ``"source"`` string of one JSONL line, or why there is none (null, a list, a number: not text)."""
    expected = 'expected a JSON object with a string "source"'
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        return Rejected(number, f"{expected}; the line is not JSON ({error})")
    if not isinstance(record, dict) or "source" not in record:
        return Rejected(number, f"{expected}; got {type(record).__name__}" +
                        (" without one" if isinstance(record, dict) else ""))
    if not isinstance(record["source"], str):
        return Rejected(number, f"{expected}; its \"source\" is {json.dumps(record['source'])[:40]}")
    return record["source"]


def count_sources(path: str | os.PathLike | None) -> int | None:
    """The number of inputs of a file (None for standard input, which can be read only once)."""
    if path is None or str(path) == "-":
        return None
    with open_input(path, encoding=None) as stream:  # bytes: lines end at b"\n", as read_sources' do
        return sum(1 for _ in stream)


@dataclass
class Shard:
    """Inputs ``start`` to ``end`` (exclusive): the ``index``-th range of ``shard_size``."""

    index: int
    start: int
    texts: list[str | Rejected]

    @property
    def end(self) -> int:
        return self.start + len(self.texts)


class ShardReader:
    """The shards of ``sources`` for which ``wanted(index, start)`` holds, read in one pass; the others
    are read past. ``total`` is the number of sources once the input is exhausted."""

    def __init__(self, sources: Iterable[str | Rejected], shard_size: int,
                 wanted: Callable[[int, int], bool]) -> None:
        self.sources, self.shard_size, self.wanted = iter(sources), shard_size, wanted
        self.total: int | None = None

    def __iter__(self) -> Iterator[Shard]:
        for index in itertools.count():
            start = index * self.shard_size
            texts = list(itertools.islice(self.sources, self.shard_size))
            if texts and self.wanted(index, start):
                yield Shard(index, start, texts)
            if len(texts) < self.shard_size:
                self.total = start + len(texts)
                return


# ----- the work folder: shards, manifests, merge ----------------------------------------------


class ShardStore:
    """A work folder of finished shards (``shard-<start>-<end>.txt``) and one manifest per worker.

    A manifest (``manifest-<worker>.json``) holds the job's fingerprint, the finished input ranges
    and, once the worker has read the whole input, the input's length. Workers never write each
    other's manifests, so any number of them can share the folder (a shared file system for
    several machines).
    """

    def __init__(self, directory: str | os.PathLike, fingerprint: dict[str, Any], worker: str,
                 start_over: bool = False) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fingerprint, self.worker = fingerprint, worker
        self._lock = _lock(self.directory / f"lock-{worker}", f"worker {worker} of {self.directory}")
        if start_over:
            self._empty()
        self.manifest_path = self.directory / f"manifest-{worker}.json"
        own = self._read(self.manifest_path) if self.manifest_path.exists() else None
        self.ranges: list[list[int]] = own["done"] if own else []
        self.total: int | None = own["total"] if own else None

    def _read(self, path: Path) -> dict[str, Any]:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest["job"] != self.fingerprint:
            differ = sorted(key for key in {**manifest["job"], **self.fingerprint}
                            if manifest["job"].get(key) != self.fingerprint.get(key))
            raise ValueError(f"{self.directory} holds shards of a job with other settings ({', '.join(differ)} "
                             "differ): rerun with the same input, model and arguments, give another work_dir, "
                             "or pass resume=false to start over")
        return manifest

    def _empty(self) -> None:
        """Delete everything in the folder but this worker's lock, refusing while any other worker runs
        there: its lock is taken first, so a job still writing shards never loses them."""
        own = Path(self._lock.name)
        with contextlib.ExitStack() as others:
            for path in sorted(self.directory.glob("lock-*")):
                if path != own:
                    others.enter_context(_lock(path, f"worker {path.name[len('lock-'):]} of {self.directory}"))
            for path in self.directory.iterdir():
                if path != own:
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    def manifests(self) -> list[dict[str, Any]]:
        return [self._read(path) for path in sorted(self.directory.glob("manifest-*.json"))]

    def done(self) -> set[int]:
        """The start of every finished shard, by any worker."""
        return {start for manifest in self.manifests() for start, _ in manifest["done"]}

    def shard_path(self, start: int, end: int) -> Path:
        return self.directory / f"shard-{start:012d}-{end:012d}.txt"

    def rejects_path(self, start: int, end: int) -> Path:
        return self.directory / f"rejects-{start:012d}-{end:012d}.tsv"

    def save(self, shard: Shard, lines: list[str], rejects: dict[int, str] | None = None) -> None:
        """Write a finished shard (and its rejected lines: input line number, tab, why), then record it
        in this worker's manifest (each step atomic)."""
        write_atomically(self.rejects_path(shard.start, shard.end),
                         "".join(f"{line}\t{reason}\n" for line, reason in sorted((rejects or {}).items())))
        write_atomically(self.shard_path(shard.start, shard.end), "".join(f"{line}\n" for line in lines))
        self.ranges = sorted([*self.ranges, [shard.start, shard.end]])
        self._save_manifest()

    def finish(self, total: int) -> None:
        """Record that this worker has read the whole input, which holds ``total`` inputs."""
        self.total = total
        self._save_manifest()

    def _save_manifest(self) -> None:
        manifest = {"job": self.fingerprint, "worker": self.worker, "total": self.total, "done": self.ranges}
        write_atomically(self.manifest_path, json.dumps(manifest, indent=1) + "\n")

    def complete_ranges(self) -> list[tuple[int, int]] | None:
        """The finished ranges in order when they cover the whole input, else None."""
        manifests = self.manifests()
        totals = {manifest["total"] for manifest in manifests} - {None}
        if not totals:
            return None
        if len(totals) > 1:
            raise ValueError(f"the manifests in {self.directory} disagree on the input's length: {sorted(totals)}")
        total = totals.pop()
        ranges = sorted({(start, end) for manifest in manifests for start, end in manifest["done"]})
        covered = 0
        for start, end in ranges:
            if start != covered:
                return None
            covered = end
        return ranges if covered == total else None

    def _concatenate(self, ranges: list[tuple[int, int]], path: Path) -> None:
        with open(path, "wb") as file:
            for start, end in ranges:
                with open(self.shard_path(start, end), "rb") as shard:
                    shutil.copyfileobj(shard, file)

    def merge(self, output: TextIO | str | os.PathLike, keep_shards: bool = False) -> bool:
        """Concatenate every shard, in input order, into ``output`` (a file: written atomically).

        Returns False when some shard is not done yet (another worker's, or this one's after a kill).
        Unless ``keep_shards``, the work folder is removed after the merge.
        """
        ranges = self.complete_ranges()
        if ranges is None:
            return False
        try:
            if isinstance(output, (str, os.PathLike)):
                rejects = "".join(self.rejects_path(start, end).read_text(encoding="utf-8")
                                  for start, end in ranges if self.rejects_path(start, end).exists())
                rejects_file = Path(f"{output}.rejects.tsv")
                if rejects:
                    write_atomically(rejects_file, rejects)
                    logger.warning("%d input line(s) could not be decoded: %s lists them",
                                   rejects.count("\n"), rejects_file)
                else:
                    rejects_file.unlink(missing_ok=True)  # an earlier run's list would mislead
                write_atomically(output, lambda temporary: self._concatenate(ranges, temporary))
            else:
                for start, end in ranges:
                    output.write(self.shard_path(start, end).read_text(encoding="utf-8"))
                output.flush()
        except FileNotFoundError:  # another worker merged at the same moment and removed the shards
            logger.info("the shards in %s were merged by another worker", self.directory)
            return True
        if not keep_shards:
            shutil.rmtree(self.directory, ignore_errors=True)
        return True


# ----- decoding ------------------------------------------------------------------------------


def shard_seed(seed: int, shard_index: int) -> int:
    """The sampling seed of one shard: a function of the job's seed and the shard alone, so a rerun,
    another split or another number of ranks samples the same shard the same way."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{shard_index}".encode()).digest()[:7], "little")


def decode_shard(model: Seq2Seq, tokenizer: Seq2SeqTokenizer, texts: list[str | Rejected], job: BulkJob,
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
    options = with_model_defaults(model, job.generation)  # the model's generation_config.json, then the job's
    copies = options.get("num_return_sequences", 1)
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
    if options.get("do_sample") and seed is not None:
        options["generator"] = torch.Generator(device).manual_seed(seed)
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
    padding = pad_id if options.get("pad_token_id") is None else options["pad_token_id"]  # after each EOS
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


class BulkProgress:
    """A Rich progress bar on standard error with sequences/s, tokens/s and ETA, and a summary line."""

    def __init__(self, total: int | None, enabled: bool = True, description: str = "decoding") -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.sequences = self.tokens = 0
        self.begin = time.perf_counter()
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rates]}"), TimeElapsedColumn(), TextColumn("ETA"),
                            TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled)
        self.task = self.bar.add_task(description, total=total, rates="")

    def __enter__(self) -> BulkProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def rates(self) -> tuple[float, float, float]:
        seconds = max(time.perf_counter() - self.begin, 1e-9)
        return seconds, self.sequences / seconds, self.tokens / seconds

    def advance(self, sequences: int, tokens: int) -> None:
        self.sequences += sequences
        self.tokens += tokens
        _, per_second, tokens_per_second = self.rates()
        self.bar.update(self.task, advance=sequences,
                        rates=f"{per_second:,.1f} seq/s {tokens_per_second:,.0f} tok/s")

    def summary(self) -> str:
        seconds, per_second, tokens_per_second = self.rates()
        return (f"decoded {self.sequences:,} sequences ({self.tokens:,} tokens) in {seconds:.1f} s: "
                f"{per_second:,.1f} sequences/s, {tokens_per_second:,.0f} tokens/s")


def parse_shard(shard: str | None) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)``: this job decodes every shard ``k`` with ``k % n == i``."""
    if shard is None:
        return 0, 1
    try:
        index, count = (int(part) for part in str(shard).split("/"))
    except ValueError as error:
        raise ValueError(f"shard must look like i/n (e.g. 0/4), got {shard!r}") from error
    if not 0 <= index < count:
        raise ValueError(f"shard {shard!r}: need 0 <= i < n")
    return index, count


@dataclass
class Worker:
    """One of ``count`` workers that split a job's shards round-robin."""

    index: int = 0
    count: int = 1

    @property
    def name(self) -> str:
        return f"{self.index}of{self.count}"

    def owns(self, shard_index: int) -> bool:
        return shard_index % self.count == self.index


def decode_to_store(model: Seq2Seq, tokenizer: Seq2SeqTokenizer, input: str | None, input_format: str,
                    job: BulkJob, store: ShardStore, worker: Worker, progress: bool = True) -> BulkProgress:
    """Decode ``worker``'s unfinished shards of ``input`` into ``store``; returns the progress record."""
    done = store.done()
    if done:
        logger.info("resuming: %d shard(s) already done in %s", len(done), store.directory)
    pending = _pending(count_sources(input), job, worker, done)
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


def _pending(total: int | None, job: BulkJob, worker: Worker, done: set[int]) -> int | None:
    """How many inputs ``worker`` has left to decode (for the ETA); None when the total is unknown."""
    if total is None:
        return None
    return sum(min(job.shard_size, total - start) for index, start in enumerate(range(0, total, job.shard_size))
               if worker.owns(index) and start not in done)


def run_bulk(model: Seq2Seq, tokenizer: Seq2SeqTokenizer, input: str | None, output: str | None, job: BulkJob,
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


def _describe_input(input: str | None) -> str:
    return "-" if input is None or input == "-" else str(Path(input).resolve())


def _lock(path: Path, what: str):
    """Hold an exclusive lock on ``path`` (released when the returned file is closed, or the process
    ends, however it ends), or raise naming the process that holds it."""
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held open for the store's life)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RuntimeError(f"{what} is in use by {holder}: two jobs must not write the same shards; wait for it "
                           "to end, or give this job another work_dir (or output)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"process {os.getpid()}\n")
    handle.flush()
    return handle


def job_fingerprint(job: BulkJob, model: Seq2Seq, tokenizer: Seq2SeqTokenizer, input: str | None,
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


# ----- many processes: Lightning's predict with DDP -------------------------------------------


def run_bulk_ddp(model: Seq2Seq, tokenizer: Seq2SeqTokenizer, input: str, output: str, job: BulkJob,
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
            pending = _pending(count_sources(input), job, self.worker, self.done)
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

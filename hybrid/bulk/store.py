"""The work folder of a bulk job: finished shards, one manifest and one lock per worker, and the merge.

Every file lands atomically (:func:`hybrid.files.write_atomically`): a finished shard's lines in
input order, then the worker's JSON manifest of finished ranges, so a killed job loses at most
the shards it was decoding, and a rerun with the same fingerprint skips the finished ones (resume).
Shard ``k`` belongs to worker ``k % workers``; workers never write each other's files, so any
number of them can share the folder, and whichever finds every shard done merges them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from hybrid.bulk.inputs import Shard
from hybrid.files import write_atomically

logger = logging.getLogger(__name__)


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
        """The worker's name in its manifest's and lock's file names: ``<index>of<count>``."""
        return f"{self.index}of{self.count}"

    def owns(self, shard_index: int) -> bool:
        """Whether shard ``shard_index`` is this worker's to decode."""
        return shard_index % self.count == self.index


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
        self._lock = _hold_lock(self.directory / f"lock-{worker}", f"worker {worker} of {self.directory}")
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
                    others.enter_context(_hold_lock(path, f"worker {path.name[len('lock-'):]} of {self.directory}"))
            for path in self.directory.iterdir():
                if path != own:
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    def manifests(self) -> list[dict[str, Any]]:
        """Every worker's manifest, each checked against this job's fingerprint."""
        return [self._read(path) for path in sorted(self.directory.glob("manifest-*.json"))]

    def done(self) -> set[int]:
        """The start of every finished shard, by any worker."""
        return {start for manifest in self.manifests() for start, _ in manifest["done"]}

    def shard_path(self, start: int, end: int) -> Path:
        """Where the output lines of inputs ``start`` to ``end`` go."""
        return self.directory / f"shard-{start:012d}-{end:012d}.txt"

    def rejects_path(self, start: int, end: int) -> Path:
        """Where the rejected lines of inputs ``start`` to ``end`` are listed."""
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


def _hold_lock(path: Path, what: str) -> IO[str]:
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

"""Reading and writing files safely: atomic writes, gzip-transparent input, and the one input-format rule.

Every file ``hybrid`` writes (checkpoints, exports, shards, manifests, results) goes through
:func:`write_atomically`, so a crash or a kill leaves either the old file or the new one, never
half of one. Every input it reads goes through :func:`open_input` (gzip recognised by its magic
bytes, whatever the name) and :func:`detect_format` (one rule for bulk inference and training).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import secrets
import stat
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Literal

Format = Literal["text", "tsv", "jsonl"]
INPUT_FORMATS: tuple[Format, ...] = ("text", "tsv", "jsonl")
GZIP_MAGIC = b"\x1f\x8b"


def write_atomically(path: str | os.PathLike, content: str | bytes | Callable[[Path], object]) -> Path:
    """Write ``content`` to ``path`` so that a reader only ever sees the old file or the whole new one.

    ``content`` is text (written as UTF-8, newlines as given), bytes, or a writer that is handed a
    temporary path in the same folder and writes the file there itself (``torch.save``, safetensors'
    ``save_model``, ``savefig``; the temporary name keeps ``path``'s suffix for writers that go by
    it). The file is flushed to disk and renamed over ``path``, then the folder is synced so that the
    rename survives a power cut too (where the platform can sync a folder). On any failure the
    temporary file is removed and ``path`` is left as it was. The new file gets the mode a plain
    ``open()`` would give it (0o666 less the umask), even where the writer swaps in a file of its
    own. Returns ``path``.
    """
    path = Path(path)
    temporary, handle = _create_beside(path)
    try:
        mode = stat.S_IMODE(os.fstat(handle).st_mode)  # open()'s mode: the kernel took the umask off
        with os.fdopen(handle, "wb") as file:
            if not callable(content):
                file.write(content.encode("utf-8") if isinstance(content, str) else content)
        if callable(content):
            content(temporary)
            os.chmod(temporary, mode)  # a writer may replace the file with one of its own (safetensors: 0o600)
        _sync_file(temporary)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)
    return path


def _create_beside(path: Path) -> tuple[Path, int]:
    """A new, empty, hidden file in ``path``'s folder, and its descriptor.

    Created by ``os.open`` with mode 0o666, so the kernel takes the umask off as it does for
    ``open()`` (``tempfile.mkstemp`` would give 0o600), and with ``O_EXCL``, so two writers of
    the same file never share a temporary one.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)  # O_BINARY: no \r\n on Windows
    while True:
        temporary = path.with_name(f".{path.stem}.{secrets.token_hex(4)}.tmp{path.suffix}")
        try:
            return temporary, os.open(temporary, flags, 0o666)
        except FileExistsError:
            continue


def _sync_file(path: Path) -> None:
    handle = os.open(path, os.O_RDWR)  # fsync syncs the file, whichever descriptor asks
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _sync_folder(folder: Path) -> None:
    # Windows cannot open a folder and some file systems refuse to sync one: there the rename is as durable as it gets.
    with contextlib.suppress(OSError):
        handle = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


@contextlib.contextmanager
def open_input(path: str | os.PathLike | None, encoding: str | None = "utf-8", errors: str = "strict") -> Iterator[IO]:
    """``path``'s content as a stream (standard input for None or ``"-"``), decompressed when it starts
    with gzip's magic bytes, whatever its name; text in ``encoding``, or bytes for ``encoding=None``.
    Text lines end at ``"\n"`` only (a ``"\r\n"`` keeps its ``"\r"`` for the reader to strip);
    ``errors`` is the decoding's error handler (``"surrogateescape"`` keeps bad bytes readable).

    Standard input is left open afterwards, so a caller can go on reading it; a file is closed.
    Damaged or truncated gzip data raises a ``ValueError`` naming the file, where it is met.
    """
    with contextlib.ExitStack() as stack:
        raw = sys.stdin.buffer if _is_stdin(path) else stack.enter_context(open(path, "rb"))
        compressed = raw.peek(len(GZIP_MAGIC))[:len(GZIP_MAGIC)] == GZIP_MAGIC
        if compressed:
            raw = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
        try:
            if encoding is None:
                yield raw
                return
            # newline="\n": records end at "\n" only. Universal newlines would also end one at a bare
            # "\r" inside a line, and output line i would stop answering input line i.
            text = io.TextIOWrapper(raw, encoding=encoding, errors=errors, newline="\n")
            try:
                yield text
            finally:
                text.detach()  # closing the wrapper would close standard input; the exit stack closes the rest
        except (EOFError, gzip.BadGzipFile, zlib.error) as error:
            if not compressed:
                raise
            name = "standard input" if _is_stdin(path) else str(path)
            raise ValueError(f"{name}: the gzip data is damaged or cut short ({error})") from None


def _is_stdin(path: str | os.PathLike | None) -> bool:
    return path is None or str(path) == "-"


def detect_format(path: str | os.PathLike | None, first_line: str, allowed: Sequence[Format] = INPUT_FORMATS,
                  format_key: str = "input_format") -> Format:
    """The format of an input of lines: ``"text"`` (the line is the source), ``"tsv"`` or ``"jsonl"``.

    By the name first: ``.jsonl`` or ``.json``, ``.tsv``, ``.txt`` (before any ``.gz``); else by
    ``first_line`` (``""`` for an empty input): a JSON object is ``jsonl``, a tab makes it ``tsv``,
    anything else is ``text``. A format outside ``allowed`` raises ``ValueError`` naming the file, the
    allowed formats and the key that sets one, ``format_key`` (``input_format`` for ``hybrid generate``,
    ``data.format`` for training); an empty input that its name does not place says it is empty.
    """
    name = "" if _is_stdin(path) else Path(path).name.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".json")):
        kind: Format = "jsonl"
    elif name.endswith(".tsv"):
        kind = "tsv"
    elif name.endswith(".txt"):
        kind = "text"
    elif first_line.lstrip().startswith("{"):
        kind = "jsonl"
    else:
        kind = "tsv" if "\t" in first_line else "text"
    if kind not in allowed:
        where = "standard input" if _is_stdin(path) else str(path)
        if not first_line:
            raise ValueError(f"{where} is empty: nothing to read")
        raise ValueError(f"{where}: its name and first line say {kind}, but only {' or '.join(allowed)} can be read "
                         f"here: name it {' or '.join('.' + kind for kind in allowed)}, or give "
                         f"{' or '.join(f'{format_key}={kind}' for kind in allowed)}")
    return kind

"""Atomic writes land whole or not at all, with open()'s mode; gzip is told by its bytes; one input-format rule."""

import functools
import gzip
import io
import os
import stat
import sys

import pytest
import torch
from safetensors.torch import save_file

from hybrid.files import detect_format, open_input, write_atomically


@pytest.mark.parametrize("content", ["héllo\nworld\n", b"\x00\x01\xff"], ids=["text", "bytes"])
def test_text_and_bytes_land(tmp_path, content):
    path = write_atomically(tmp_path / "out.txt", content)
    assert path.read_bytes() == (content.encode() if isinstance(content, str) else content)
    assert os.listdir(tmp_path) == ["out.txt"]


def test_a_writer_that_needs_a_path_gets_one_with_the_target_suffix(tmp_path):
    seen = []

    def save(temporary):
        seen.append(temporary)
        torch.save({"x": torch.arange(3)}, temporary)

    write_atomically(tmp_path / "state.ckpt", save)
    assert seen[0].parent == tmp_path and seen[0].suffix == ".ckpt" and seen[0] != tmp_path / "state.ckpt"
    assert torch.equal(torch.load(tmp_path / "state.ckpt", weights_only=True)["x"], torch.arange(3))
    assert os.listdir(tmp_path) == ["state.ckpt"]


@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_a_failing_writer_leaves_the_old_file_and_no_temporary_file(tmp_path, failure):
    target = write_atomically(tmp_path / "results.json", "old\n")

    def half_then_fail(temporary):
        temporary.write_text("half of the new")
        raise failure

    with pytest.raises(type(failure)):
        write_atomically(target, half_then_fail)
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["results.json"]


@pytest.mark.skipif(sys.platform == "win32", reason="Windows cannot sync a folder")
def test_the_file_is_synced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    synced, fsync = [], os.fsync

    def recording(handle):
        status = os.fstat(handle)
        synced.append(("folder" if stat.S_ISDIR(status.st_mode) else "file", (tmp_path / "out.txt").exists()))
        fsync(handle)

    monkeypatch.setattr(os, "fsync", recording)
    write_atomically(tmp_path / "out.txt", "new\n")
    assert synced == [("file", False), ("folder", True)]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_the_mode_is_what_open_gives_under_the_umask(tmp_path, umask):
    previous = os.umask(umask)
    try:
        with open(tmp_path / "plain", "w"):
            pass
        write_atomically(tmp_path / "text", "x")
        write_atomically(tmp_path / "written", lambda temporary: temporary.write_bytes(b"x"))
        # safetensors writes a 0o600 file of its own and renames it over the path it is given
        write_atomically(tmp_path / "replaced.safetensors", functools.partial(save_file, {"x": torch.zeros(2)}))
    finally:
        os.umask(previous)
    expected = 0o666 & ~umask
    for name in ("plain", "text", "written", "replaced.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == expected, name


@pytest.mark.parametrize("name", ["lines.gz", "lines.txt", "lines"])
def test_gzip_is_told_by_its_magic_bytes_not_its_name(tmp_path, name):
    (tmp_path / name).write_bytes(gzip.compress(b"one\ntwo\n"))
    with open_input(tmp_path / name) as stream:
        assert stream.read() == "one\ntwo\n"
    with open_input(tmp_path / name, encoding=None) as stream:
        assert stream.read() == b"one\ntwo\n"


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
@pytest.mark.parametrize("encoding", ["utf-8", None])
def test_damaged_gzip_is_a_value_error_naming_the_file(tmp_path, damage, encoding):
    data = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    path = tmp_path / "in.txt.gz"
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # the deflate stream stays whole; its CRC no longer matches
        path.write_bytes(data[:-8] + bytes(8))
    with pytest.raises(ValueError, match=rf"{path}: the gzip data is damaged or cut short"):
        with open_input(path, encoding=encoding) as stream:
            for _ in stream:
                pass


def test_a_plain_file_named_gz_is_read_as_it_is(tmp_path):
    (tmp_path / "plain.gz").write_bytes(b"not compressed\n")
    with open_input(tmp_path / "plain.gz") as stream:
        assert stream.read() == "not compressed\n"


@pytest.mark.parametrize("data", [b"a\nb\n", gzip.compress(b"a\nb\n")], ids=["plain", "gzip"])
def test_standard_input_is_read_and_stays_open(monkeypatch, data):
    stdin = io.TextIOWrapper(io.BufferedReader(io.BytesIO(data)))
    monkeypatch.setattr(sys, "stdin", stdin)
    for path in (None, "-"):
        stdin.buffer.seek(0)
        with open_input(path) as stream:
            assert stream.read() == "a\nb\n"
        assert not stdin.closed and not stdin.buffer.closed


@pytest.mark.parametrize("path, first_line, expected", [
    ("pairs.tsv", '{"source": "a"}', "tsv"),  # the name wins over the first line
    ("PAIRS.TSV.gz", "", "tsv"),
    ("pairs.jsonl.gz", "a\tb", "jsonl"),
    ("pairs.json", "a", "jsonl"),
    ("words.txt", "a\tb", "text"),
    ("words", '  {"source": "a"}', "jsonl"),  # no telling name: the first line decides
    ("words.csv", "a\tb", "tsv"),
    ("words.dat", "a b", "text"),
    (None, "a\tb", "tsv"),  # standard input
    ("-", "abc", "text"),
])
def test_the_format_rule(path, first_line, expected):
    assert detect_format(path, first_line) == expected


def test_a_format_outside_the_allowed_ones_names_the_file_and_the_allowed_formats():
    assert detect_format("x.csv", "a\tb", allowed=("tsv", "jsonl")) == "tsv"
    with pytest.raises(ValueError, match=r"words\.csv: .* say text, but only tsv or jsonl .*\.tsv or \.jsonl"):
        detect_format("words.csv", "no tab here", allowed=("tsv", "jsonl"))

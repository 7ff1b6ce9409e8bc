"""One parser for training data and bulk jobs: a line's source is read by the rule that reads its pair, and a bad
line has one reason whichever reads it."""

import gzip

import pytest

from hybrid.bulk import Rejected, read_sources
from hybrid.records import BadLine, parse_line, read_parallel_file, read_records

TSV = ["hello\tbonjour", "  ", "no tab", "a\tb\tc", "\tempty source", "cat\tchat"]
JSONL = ['{"source": "hello", "target": "bonjour"}', "", "{oops", '["a", "b"]', '{"source": "a"}',
         '{"source": null, "target": "b"}', '{"source": "a", "target": 1}', '{"source": "", "target": "b"}',
         '{"source": "cat", "target": "chat", "id": 7}']


@pytest.mark.parametrize("format, lines", [("tsv", TSV), ("jsonl", JSONL)])
def test_a_source_is_read_by_the_rule_that_reads_its_pair(format, lines):
    for line in lines:
        pair, source = parse_line(line, format), parse_line(line, format, target=False)
        if isinstance(pair, tuple):
            assert source == pair[:1], line
        elif isinstance(source, BadLine):
            assert source.reason == pair.reason, line
    # What a source alone does not need: a second field of exactly one, or a "target"
    assert parse_line("a\tb\tc", "tsv", target=False) == ("a",)
    assert parse_line("a\tb\tc", "tsv").reason == "wrong_field_count"
    assert parse_line('{"source": "a"}', "jsonl", target=False) == ("a",)
    assert parse_line('{"source": "a"}', "jsonl").reason == "missing_key"
    assert parse_line('{"source": "a", "target": 1}', "jsonl").detail.endswith('its "target" is 1')


@pytest.mark.parametrize("name, sources, rejected", [
    ("pairs.tsv.gz", ["hello", "", "no tab", "a", "", "cat"], []),
    ("pairs.jsonl", ["hello", "", "", "", "a", "", "a", "", "cat"], [3, 4, 6]),
])
def test_a_bulk_job_reads_a_training_files_sources_line_for_line(tmp_path, name, sources, rejected):
    lines = TSV if "tsv" in name else JSONL
    data = ("\n".join(lines) + "\n").encode() + b"\xff\n"
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    pairs, report = read_parallel_file(tmp_path / name)
    assert pairs == [("hello", "bonjour"), ("cat", "chat")]
    read = list(read_sources(tmp_path / name))
    assert [source.line for source in read if isinstance(source, Rejected)] == [*rejected, len(lines) + 1]
    assert [source if isinstance(source, str) else "" for source in read] == [*sources, ""]  # item i is line i
    assert read[-1] == Rejected(len(lines) + 1, "the line is not valid UTF-8")
    assert report.first_lines["bad_utf8"] == [len(lines) + 1]


def test_a_file_of_pairs_cannot_be_plain_text_and_formats_are_named_by_their_key(tmp_path):
    (tmp_path / "words.txt").write_text("a\tb\n")
    assert list(read_records(tmp_path / "words.txt", target=False)) == [("a\tb",)]
    with pytest.raises(ValueError, match=r"say text, but only tsv or jsonl .* data\.format=tsv"):
        list(read_records(tmp_path / "words.txt"))
    with pytest.raises(ValueError, match=r"input_format must be one of \('auto', 'text', 'tsv', 'jsonl'\)"):
        list(read_records(tmp_path / "words.txt", "csv", target=False))

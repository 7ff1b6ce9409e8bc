"""A bulk job's input: every format yields its sources, a line that holds no source is kept as a rejection naming
its line, so item i always stands for input line i, and shards are read in one pass."""

import gzip
import json

import pytest

from hybrid.bulk import Rejected, ShardReader, count_sources, read_sources


@pytest.mark.parametrize("name", ["plain.txt", "pairs.tsv", "pairs.jsonl", "pairs.tsv.gz", "pairs.jsonl.gz",
                                  "unnamed"])
def test_every_input_format_yields_the_sources(tmp_path, name):
    sources = ["abc", "", "ji", "a b"]
    if "jsonl" in name:
        text = "".join(json.dumps({"source": s, "target": "x"}) + "\n" if s else "\n" for s in sources)
    elif "tsv" in name or name == "unnamed":
        text = "".join(f"{s}\tx\n" for s in sources)
    else:
        text = "".join(f"{s}\n" for s in sources)
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    assert list(read_sources(path)) == sources  # "unnamed" is sniffed as TSV from its first line


def test_a_line_without_a_source_is_rejected_with_its_number_and_why(tmp_path):
    lines = ['{"source": "ab"}', '{"text": "ab"}', '{"source": null}', '{"source": ["a", "b"]}', "[1]", "{oops"]
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    sources = list(read_sources(tmp_path / "bad.jsonl"))
    assert sources[0] == "ab"
    assert [source.line for source in sources[1:]] == [2, 3, 4, 5, 6]
    assert all('expected a JSON object with a string "source"' in source.reason for source in sources[1:])
    assert "null" in sources[2].reason and "not JSON" in sources[5].reason  # never the text "None"
    (tmp_path / "bad.txt").write_bytes(b"ab\n\xff\xfe\ncd\n")
    assert list(read_sources(tmp_path / "bad.txt")) == ["ab", Rejected(2, "the line is not valid UTF-8"), "cd"]
    assert count_sources(tmp_path / "bad.txt") == 3


def test_shards_are_read_in_one_pass_and_the_unwanted_ones_are_read_past():
    reader = ShardReader(iter("abcdefg"), 3, wanted=lambda index, start: index != 1)
    assert [(shard.index, shard.start, shard.end, shard.texts) for shard in reader] == [
        (0, 0, 3, ["a", "b", "c"]), (2, 6, 7, ["g"])]
    assert reader.total == 7
